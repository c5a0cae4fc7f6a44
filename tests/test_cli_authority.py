"""``ctrlrun delegate``, ``revoke`` and ``inspect --grant``, and the budget lines of ``effects``:
exact output, exit codes, nothing recorded on a refusal, events copied to ``events.jsonl``."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import ctrlrun
from ctrlrun import Control, JSONLEventSink, Policy, SQLiteStateStore
from ctrlrun.cli.commands_authority import window_text

from ._cli_helpers import START, invoke, workdir  # noqa: F401
from .conftest import FakeClock

POLICY = """\
schema: ctrlrun.policy/v7
authority:
  grants:
    - id: lead
      subject: { agent: lead, user: "dana@example.com" }
      actions: ["stripe.refund"]
      delegable: true
      expires_at: "2099-01-01T00:00:00Z"
      budgets:
        - { metric: amount, limit: 100000, window: P1D }
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    rules:
      - { when: { amount_gte: 0, amount_lte: 100000 }, decision: allow }
      - { decision: deny }
"""
CHILD = """\
subject: {{ agent: {agent}, user: "dana@example.com" }}
actions: ["stripe.refund"]
delegable: {delegable}
expires_at: "2098-01-01T00:00:00Z"
budgets:
  - {{ metric: amount, limit: {limit}, window: P2D }}
"""
DLG = re.compile(r"dlg_[0-9a-f]{32}")


@pytest.fixture
def team(workdir: Path) -> Path:  # noqa: F811
    (workdir / "ctrlrun.yaml").write_text(POLICY, encoding="utf-8")
    return workdir


def child(directory: Path, name: str, agent: str, *, limit: int = 50000, delegable: bool = True) -> str:
    path = directory / f"{name}.yaml"
    path.write_text(CHILD.format(agent=agent, limit=limit, delegable=str(delegable).lower()), encoding="utf-8")
    return str(path)


def delegate(parent: str, file: str, who: str, *extra: str) -> Any:
    return invoke(["delegate", "--parent", parent, "--file", file, "--as", who, *extra], clock=lambda: START)


def created(result: Any) -> str:
    assert result.code == 0, result.err
    return DLG.search(result.lines[0]).group()


def test_delegate_prints_the_new_id_and_records_it_with_its_event(team: Path) -> None:
    result = delegate("lead", child(team, "finance", "finance"), "lead/dana@example.com")
    dlg = created(result)
    assert result.lines == [f"created {dlg}", "parent lead at depth 1", f"revoke it with: ctrlrun revoke {dlg}"]
    nested = delegate(dlg, child(team, "support", "support", limit=10000), "finance/dana@example.com", "--json")
    document = json.loads(nested.out)
    assert list(document) == ["delegation_id", "parent_id", "depth", "created_by_agent",
                              "created_by_user", "created_via", "created_at"]  # fmt: skip
    assert (document["parent_id"], document["depth"], document["created_via"]) == (dlg, 2, "cli")
    assert (document["created_by_agent"], document["created_by_user"]) == ("finance", "dana@example.com")
    events = [json.loads(line) for line in (team / ".ctrlrun" / "events.jsonl").open(encoding="utf-8")]
    assert [e["type"] for e in events] == ["DELEGATION_CREATED", "DELEGATION_CREATED"]
    assert events[0]["data"] == {"delegation_id": dlg, "parent_id": "lead", "depth": 1,
                                 "created_by_agent": "lead", "created_by_user": "dana@example.com",
                                 "created_via": "cli"}  # fmt: skip
    assert events[0]["action_id"] is None


def test_a_refused_delegation_exits_1_with_its_reason_and_records_only_the_rejection(team: Path) -> None:
    wider = delegate("lead", child(team, "wide", "finance", limit=500000), "lead/dana@example.com")
    assert wider.code == 1
    assert wider.err.startswith("Error: containment: ") and "budgets" in wider.err
    assert "Traceback" not in wider.err
    store = SQLiteStateStore(team / ".ctrlrun" / "state.db", migrate=False)
    try:
        assert store.delegations(include_revoked=True) == ()
        [event] = store.events()
        assert (event.type, event.data["reason"], event.data["dimension"]) == (
            "DELEGATION_REJECTED", "containment", "budgets",
        )  # fmt: skip
    finally:
        store.close()
    unknown = delegate("nobody", child(team, "x", "finance"), "lead/dana@example.com")
    assert unknown.code == 1 and unknown.err.startswith("Error: unknown_parent: ")


@pytest.mark.parametrize("who", ["", "/dana@example.com", " /x"])
def test_an_empty_agent_is_a_usage_error_and_records_nothing(team: Path, who: str) -> None:
    result = delegate("lead", child(team, "finance", "finance"), who)
    assert result.code == 2 and "non-empty agent" in result.err
    assert not (team / ".ctrlrun" / "state.db").exists()


def test_revoke_one_then_again_then_an_unknown_one(team: Path) -> None:
    dlg = created(delegate("lead", child(team, "finance", "finance"), "lead/dana@example.com"))
    first = invoke(["revoke", dlg, "--by", "ops:ada"], clock=lambda: START)
    assert first.lines == [f"revoked {dlg} by ops:ada",
                           "every delegation beneath it is denied from the next evaluation",
                           "no live delegation to finance/dana@example.com remains (grants in the "
                           "policy file are not counted)"]  # fmt: skip
    again = invoke(["revoke", dlg])
    assert again.code == 0
    assert again.lines == [f"{dlg} was already revoked at 2026-11-30T09:00:00.000Z"]
    missing = invoke(["revoke", "dlg_" + "0" * 32])
    assert missing.code == 1 and "no delegation" in missing.err
    events = [json.loads(line)["type"] for line in (team / ".ctrlrun" / "events.jsonl").open(encoding="utf-8")]
    assert events.count("DELEGATION_REVOKED") == 1


def test_the_same_delegation_twice_is_refused_naming_the_live_one(team: Path) -> None:
    grant = child(team, "finance", "finance")
    first = created(delegate("lead", grant, "lead/dana@example.com"))
    again = delegate("lead", grant, "lead/dana@example.com")
    assert again.code == 1 and first in again.err and "already hands this exact grant" in again.err
    store = SQLiteStateStore(team / ".ctrlrun" / "state.db", migrate=False)
    try:
        assert [r.delegation_id for r in store.delegations()] == [first]
    finally:
        store.close()
    assert invoke(["revoke", first]).code == 0
    replaced = created(delegate("lead", grant, "lead/dana@example.com"))  # revoked: it may be made again
    assert replaced != first


def test_revoke_says_which_delegations_still_authorise_the_agent(team: Path) -> None:
    small = created(delegate("lead", child(team, "small", "finance", limit=1000), "lead/dana@example.com"))
    large = created(delegate("lead", child(team, "large", "finance", limit=2000), "lead/dana@example.com"))
    result = invoke(["revoke", small])
    assert result.code == 0
    assert result.lines[-1].startswith(f"1 live delegation to finance/dana@example.com remains: {large}")


def test_revoke_selectors_revoke_every_match_and_count_them(team: Path) -> None:
    finance = created(delegate("lead", child(team, "finance", "finance"), "lead/dana@example.com"))
    support = created(delegate(finance, child(team, "support", "support", limit=10000), "finance/dana@example.com"))
    other = created(delegate("lead", child(team, "billing", "billing"), "lead/dana@example.com"))
    assert invoke(["revoke", support]).code == 0
    under = invoke(["revoke", "--under", "lead"])
    assert under.code == 0
    assert under.lines == [  # creation order: created_at, then id (one clock reading here)
        *(f"revoked {dlg} by cli:local" for dlg in sorted([finance, other])),
        "revoked 2 of 3 matching --under lead; 1 already revoked",
        "every delegation beneath them is denied from the next evaluation",
    ]
    by_finance = invoke(["revoke", "--created-by", "finance/dana@example.com"])
    assert by_finance.lines[0] == "revoked 0 of 1 matching --created-by finance/dana@example.com; 1 already revoked"
    nothing = invoke(["revoke", "--created-by", "nobody"])
    assert nothing.code == 1 and "no delegation matches" in nothing.err


@pytest.mark.parametrize("args", [[], ["dlg_x", "--under", "lead"], ["--under", "a", "--created-by", "b"]])
def test_revoke_needs_exactly_one_selector(team: Path, args: list[str]) -> None:
    result = invoke(["revoke", *args])
    assert result.code == 2 and "exactly one" in result.err


def test_inspect_and_effects_show_what_is_spent_and_held_until_resolved(team: Path) -> None:
    dlg = created(delegate("lead", child(team, "finance", "finance", delegable=False), "lead/dana@example.com"))
    clock = FakeClock(START)
    store = SQLiteStateStore(team / ".ctrlrun" / "state.db", clock=clock)
    control = Control(Policy.from_file(team / "ctrlrun.yaml"), store, clock=clock,
                      sinks=(JSONLEventSink(team / ".ctrlrun"),))  # fmt: skip
    lose = {"reply": False}

    @ctrlrun.protect("stripe.refund", effect="refund:{payment_id}", control=control)
    def refund(payment_id: str, amount: int) -> str:
        if lose["reply"]:
            raise TimeoutError("reply lost")
        return "ok"

    with ctrlrun.context(agent="finance", user="dana@example.com"):
        refund(payment_id="p1", amount=20000)
        lose["reply"] = True
        with pytest.raises(TimeoutError):
            refund(payment_id="p2", amount=25000)
        with pytest.raises(ctrlrun.BudgetExhausted):  # 45000 of 50000 spent or held
            refund(payment_id="p3", amount=10000)
    store.close()

    inspected = invoke(["inspect", "--grant", dlg], clock=lambda: START + timedelta(minutes=5))
    assert inspected.code == 0, inspected.err
    assert inspected.lines == [
        f"grant {dlg}",
        "  amount: 45000 of 50000 per 2 days, 25000 held",
        "    25000 held by refund:p2 (ambiguous)",
        "      ctrlrun resolve refund:p2 --committed  # or --failed",
    ]
    as_json = json.loads(invoke(["inspect", "--grant", "lead", "--json"], clock=lambda: START).out)
    assert as_json == {"grant_id": "lead", "budgets": [{
        "metric": "amount", "limit": 100000, "window": 86400, "consumed": 45000, "held": 25000,
        "holders": [{"effect_key": "refund:p2", "amount": 25000, "state": "ambiguous"}],
    }]}  # fmt: skip
    lines = invoke(["effects"]).lines
    assert lines[0].endswith(f"  spent 20000 amount on {dlg}, 20000 amount on lead")
    assert lines[1].endswith(f"  holds 25000 amount on {dlg}, 25000 amount on lead")
    assert invoke(["resolve", "refund:p2", "--failed"]).code == 0
    assert "held by" not in invoke(["inspect", "--grant", dlg], clock=lambda: START).out
    assert invoke(["effects", "--state", "failed"]).lines[0].endswith("(lease expired)") is False
    assert "holds" not in invoke(["effects", "--state", "failed"]).out
    # outside its window the spent charge no longer counts
    later = invoke(["inspect", "--grant", dlg], clock=lambda: START + timedelta(days=3))
    assert later.lines[1] == "  amount: 0 of 50000 per 2 days, 0 held"


def test_inspect_refuses_an_unknown_grant_and_a_policy_without_authority(team: Path) -> None:
    created(delegate("lead", child(team, "finance", "finance"), "lead/dana@example.com"))
    unknown = invoke(["inspect", "--grant", "nobody"])
    assert unknown.code == 1 and "no grant nobody" in unknown.err
    (team / "ctrlrun.yaml").write_text("schema: ctrlrun.policy/v2\nactions: {}\n", encoding="utf-8")
    plain = invoke(["inspect", "--grant", "lead"])
    assert plain.code == 1 and "no authority: section" in plain.err


@pytest.mark.parametrize(("seconds", "text"), [
    (86400, "day"), (604800, "7 days"), (3600, "hour"), (7200, "2 hours"), (60, "minute"),
    (5400, "90 minutes"), (90, "90s"), (1, "1s"), (90000, "25 hours"),
])  # fmt: skip
def test_window_text(seconds: int, text: str) -> None:
    assert window_text(seconds) == text
