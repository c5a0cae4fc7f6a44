"""``ctrlrun stats``: counting a window of receipts, in enforce mode and (from observed receipts)
in observe mode; ``--since``, ``--json``, and the observe banner of commands that load a policy."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest

from ctrlrun import DuplicateEffect, ActionDenied
from ctrlrun.cli.commands_stats import BANNER
from ctrlrun.operator.stats import parse_since, tally

from ._cli_helpers import START, invoke, project, workdir  # noqa: F401
from .vectors import ROOT


@pytest.fixture
def agents(project):  # noqa: F811
    """The project with its policy file beside the store, as an operator's checkout has it."""
    (project.directory / "ctrlrun.yaml").write_bytes((ROOT / "ctrlrun.yaml").read_bytes())
    return project

KEYS = ["schema", "mode", "since", "from", "to", "actions", "ledger_rows", "would_have_been_denied",
        "denied_by_reason", "would_have_needed_approval", "would_have_been_blocked",
        "blocked_by_reason", "ambiguous_outcomes", "observed", "enforced"]  # fmt: skip


def observed(blocked: str | None, execution: str = "committed", at: str = "2026-11-30T09:00:00.000Z"):
    return SimpleNamespace(result="observed", execution=execution, decision_reason="x",
                           would_have={"decision": "deny", "reason": "x", "blocked_reason": blocked},
                           finished_at=at)  # fmt: skip


def test_observed_receipts_count_by_the_first_refusal_enforce_would_have_raised() -> None:
    receipts = [
        observed(None), observed("rule[1]"), observed("rule[1]"), observed("approval_required"),
        observed("duplicate", execution="ambiguous"), observed("attempt_ceiling"),
        observed("budget_exhausted"), observed("approval_denied"), observed("precondition_changed"),
        observed("no_authority"),
    ]  # fmt: skip
    document = tally(receipts, mode="observe", since=None, ledger_rows=3)
    assert list(document) == KEYS
    assert document["actions"] == 10 and document["ledger_rows"] == 3
    assert document["denied_by_reason"] == {"approval_denied": 1, "budget_exhausted": 1, "no_authority": 1,
                                            "rule[1]": 2}  # fmt: skip
    assert document["would_have_been_denied"] == 5
    assert document["would_have_needed_approval"] == 1
    assert document["blocked_by_reason"] == {"attempt_ceiling": 1, "duplicate": 1, "precondition_changed": 1}
    assert document["would_have_been_blocked"] == 3
    assert document["ambiguous_outcomes"] == 1


def enforced(result: str, reason: str = "x", at: str = "2026-11-30T09:00:00.000Z"):
    return SimpleNamespace(result=result, execution=None, decision_reason=reason, would_have=None,
                           finished_at=at)  # fmt: skip


@pytest.mark.parametrize("mode", ["enforce", "observe"])
def test_observed_and_enforced_receipts_are_counted_apart(mode: str) -> None:
    """After a switch of mode the store holds both kinds: a refusal enforce mode recorded is
    never a "would have", nor an observed one a refusal, whichever mode the policy is in now."""
    receipts = [observed("rule[2]"), observed("duplicate"), observed(None),
                enforced("denied", "rule[2]"), enforced("denied", "rule[2]"), enforced("blocked"),
                enforced("committed"), enforced("ambiguous")]  # fmt: skip
    document = tally(receipts, mode=mode, since=None, ledger_rows=0)
    assert document["actions"] == 8
    assert document["would_have_been_denied"] == 1 and document["denied_by_reason"] == {"rule[2]": 1}
    assert document["would_have_been_blocked"] == 1 and document["blocked_by_reason"] == {"duplicate": 1}
    assert document["observed"] == {"actions": 3, "ambiguous_outcomes": 0}
    assert document["enforced"] == {"actions": 5, "denied": 2, "denied_by_reason": {"rule[2]": 2},
                                    "blocked": 1, "ambiguous_outcomes": 1}  # fmt: skip
    assert document["ambiguous_outcomes"] == 1


def test_enforce_mode_after_observing_says_denied_for_what_was_denied(agents) -> None:
    """The walkthrough of docs/observe.md in short: observed calls, then the switch."""
    from ctrlrun import Control, Policy, protect

    from .vectors import ROOT as _root

    text = (_root / "ctrlrun.yaml").read_text(encoding="utf-8")
    observing = Control(Policy.from_yaml("mode: observe\n" + text.replace("ctrlrun.policy/v2", "ctrlrun.policy/v3")),
                        agents.store, clock=agents.clock, environment="production")  # fmt: skip
    refund = protect("stripe.refund", effect="refund:{payment_id}", control=observing)(lambda payment_id, amount: "ok")
    import ctrlrun

    with ctrlrun.context(agent="support-agent"):
        refund(payment_id="obs_1", amount=10_000_000)  # would have been denied; it ran
    with pytest.raises(ActionDenied):
        agents.call(payment_id="txn_2", amount=10_000_000)
    with pytest.raises(ActionDenied):
        agents.call(payment_id="txn_3", amount=10_000_000)
    result = invoke(["stats"], clock=agents.clock)
    assert result.code == 0, result.err
    assert "denied                             2" in result.lines
    assert "would have been denied             1" in result.lines
    document = json.loads(invoke(["stats", "--json"], clock=agents.clock).out)
    assert document["enforced"]["denied"] == 2 and document["would_have_been_denied"] == 1


def test_the_window_is_inclusive_and_since_reads_both_forms() -> None:
    now = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
    assert parse_since("2h", now) == now - timedelta(hours=2)
    assert parse_since("7d", now) == now - timedelta(days=7)
    assert parse_since("30m", now) == now - timedelta(minutes=30)
    assert parse_since("2026-11-30T10:00:00Z", now) == datetime(2026, 11, 30, 10, tzinfo=timezone.utc)
    receipts = [observed(None, at="2026-11-30T09:59:59.999Z"), observed(None, at="2026-11-30T10:00:00.000Z")]
    document = tally(receipts, mode="observe", since=parse_since("2h", now), ledger_rows=0)
    assert (document["actions"], document["from"], document["since"]) == (
        1, "2026-11-30T10:00:00.000Z", "2026-11-30T10:00:00.000Z")


@pytest.mark.parametrize("value", ["yesterday", "0d", "2026-11-30T10:00:00", "5w"])
def test_a_bad_since_is_a_usage_error(agents, value: str) -> None:
    result = invoke(["stats", "--since", value], clock=agents.clock)
    assert result.code == 2 and "--since" in result.err


def test_enforce_mode_counts_denied_receipts_by_reason(agents) -> None:
    project = agents
    project.call(payment_id="txn_1", amount=100)
    with pytest.raises(DuplicateEffect):
        project.call(payment_id="txn_1", amount=100)
    with pytest.raises(ActionDenied):
        project.call(payment_id="txn_2", amount=10_000_000)
    project.ambiguous("txn_3")
    result = invoke(["stats"], clock=project.clock)
    assert result.code == 0, result.err
    assert result.err == ""  # enforce: no banner
    lines = result.lines
    assert lines[0].startswith("CTRLRun — 2026-11-30T09:00:00.000Z .. ") and lines[0].endswith("(enforce mode)")
    assert lines[2:9] == [
        "actions                            4",
        "denied                             1",
        "   rule[2]                         1",
        "blocked                            1",
        "ambiguous outcomes                 1",
        "budget ledger rows                 0",
        "",
    ]
    document = json.loads(invoke(["stats", "--json"], clock=project.clock).out)
    assert list(document) == KEYS and document["mode"] == "enforce"
    assert document["blocked_by_reason"] == {}


def test_commands_that_load_an_observing_policy_say_so_first(workdir) -> None:  # noqa: F811
    (workdir / "ctrlrun.yaml").write_text(
        "schema: ctrlrun.policy/v3\nmode: observe\nactions:\n  a.b: { decision: allow }\n", encoding="utf-8"
    )
    checked = invoke(["policy", "check"])
    assert checked.err.splitlines()[0] == BANNER
    stats = invoke(["stats", "--store-url", f"sqlite://{workdir / 'missing.db'}"])
    assert stats.err.splitlines()[0] == BANNER
    assert invoke(["receipts", "--store-url", f"sqlite://{workdir / 'missing.db'}"]).err.find(BANNER) == -1
