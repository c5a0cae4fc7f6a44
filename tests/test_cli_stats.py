"""``ctrlrun stats``: counting a window of receipts, in enforce mode and (from observed receipts)
in observe mode; ``--since``, ``--json``, and the observe banner of commands that load a policy."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest

from ctrlrun import DuplicateEffect, ActionDenied
from ctrlrun.cli.commands_stats import BANNER, parse_since, tally

from ._cli_helpers import START, invoke, project, workdir  # noqa: F401
from .vectors import ROOT


@pytest.fixture
def agents(project):  # noqa: F811
    """The project with its policy file beside the store, as an operator's checkout has it."""
    (project.directory / "ctrlrun.yaml").write_bytes((ROOT / "ctrlrun.yaml").read_bytes())
    return project

KEYS = ["schema", "mode", "since", "from", "to", "actions", "ledger_rows", "would_have_been_denied",
        "denied_by_reason", "would_have_needed_approval", "would_have_been_blocked",
        "blocked_by_reason", "ambiguous_outcomes"]  # fmt: skip


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
