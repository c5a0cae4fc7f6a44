"""``ctrlrun demo``: five scenarios through the real library, exact lines, 8 receipts, 44 events."""

from __future__ import annotations

import json
import re

import pytest

from ctrlrun import SQLiteStateStore
from ctrlrun.cli.demo_world import DEMO_FILES
from ctrlrun.receipt import verify_chain

from datetime import timedelta

from ._cli_helpers import START, invoke, tree

HEADINGS = [
    "1. Duplicate effect after a lost response",
    "2. Approval mutation",
    "3. Concurrent agents, same effect",
    "4. Approval replay",
    "5. Authority escalation",
]
REFUSALS = [
    "   ✗ BLOCKED — effect may already have committed; blind retry refused",
    "   ✗ BLOCKED — approved action ≠ requested action (mismatch)",
    "   ✗ BLOCKED — already reserved (in_progress)",
    "   ✗ BLOCKED — single-use approval already consumed",
    "   ✗ BLOCKED — outside the delegated grant (authority_constraint)",
]
TRAILER = [
    "",
    "Receipts (8): .ctrlrun/demo/receipts.jsonl",
    "Events:       .ctrlrun/demo/events.jsonl",
    "",
    "Read them:    CTRLRUN_STATE=.ctrlrun/demo/state.db ctrlrun receipts",
]
APR = r"apr_[0-9a-f]{32}"
DLG = r"dlg_[0-9a-f]{32}"


def _sections(lines):
    """``{heading: body lines}`` for the scenario sections."""
    found, current = {}, None
    for line in lines:
        if line in HEADINGS:
            current = found.setdefault(line, [])
        elif current is not None and line.startswith("   "):
            current.append(line)
    return found


def test_demo_output(workdir):
    result = invoke(["demo"])
    assert result.code == 0, result.err
    lines = result.lines
    assert lines[0].startswith("CTRLRun demo — ") and "five" in lines[0]
    assert lines[1].startswith("Policy: ")
    assert [line for line in lines if re.match(r"^\d\. ", line)] == HEADINGS
    for heading in HEADINGS:
        at = lines.index(heading)
        assert lines[at - 1] == "" and lines[at + 1] == ""
    assert lines[-5:] == TRAILER
    sections = _sections(lines[:-5])
    for heading, refusal in zip(HEADINGS, REFUSALS, strict=True):
        body = sections[heading]
        assert [line for line in body if "✗" in line] == [refusal]
        assert all(line.startswith("   ") for line in body)
    one, two, _, four, five = (sections[h] for h in HEADINGS)
    assert "   remote refund calls: 1" in one
    assert "   only a human moves it on:  ctrlrun resolve refund:txn_1 --committed --store-url sqlite://.ctrlrun/demo/state.db" in one
    assert any(re.search(APR, line) for line in two)
    assert any(re.fullmatch(rf"   approval {APR} used once  →  consumed", line) for line in four)
    assert str(workdir) not in result.out  # relative paths only
    assert five[0] == "   human €100,000 delegable  →  finance agent €25,000  →  support agent €2,000"
    assert re.fullmatch(rf"   support agent's grant: {DLG}", five[1])
    assert "   remote refund calls: 0" in five
    assert any(line.endswith("refused (containment: constraints)") for line in five)
    assert any(re.fullmatch(rf".*asks a human \({APR}\)", line) for line in five)
    assert five[-1] == "   two axes, and an action needs both: the stricter of the pair wins"


def test_demo_passes_in_ten_years(workdir):
    """Every expiry comes from the run's clock: a fixed date would break the demo once passed."""
    later = START + timedelta(days=3653)
    result = invoke(["demo"], clock=lambda: later)
    assert result.code == 0, result.err
    assert "Receipts (8): " in result.out


def test_demo_evidence(workdir):
    assert invoke(["demo"]).code == 0
    directory = workdir / ".ctrlrun" / "demo"
    store = SQLiteStateStore(directory / "state.db", migrate=False)
    try:
        receipts = store.receipts()
        events = store.events()
        assert [(r.decision, r.result, r.effect_key, r.principal.agent) for r in receipts] == [
            ("allow", "ambiguous", "refund:txn_1", "support-agent"),
            ("allow", "blocked", "refund:txn_1", "support-agent"),
            ("approve", "blocked", "refund:txn_2", "support-agent"),
            ("allow", "blocked", "refund:txn_123", "agent-b"),
            ("allow", "committed", "refund:txn_123", "agent-a"),
            ("approve", "committed", "refund:txn_4", "support-agent"),
            ("approve", "blocked", "refund:txn_4", "support-agent"),
            ("deny", "denied", "refund:txn_5", "support-agent"),
        ]
        assert [r.seq for r in receipts] == list(range(1, 9))
        assert receipts[7].decision_reason == "authority_constraint"
        assert receipts[7].authority_grant_id is None
        assert [e.type for e in events[34:]] == [
            "DELEGATION_CREATED", "DELEGATION_CREATED", "ACTION_PROPOSED", "AUTHORITY_DENIED",
            "ACTION_DENIED", "DELEGATION_REJECTED", "ACTION_PROPOSED", "AUTHORITY_RESOLVED",
            "POLICY_EVALUATED", "APPROVAL_REQUESTED",
        ]
        rejected, resolved, evaluated = events[39], events[41], events[42]
        assert (rejected.data["reason"], rejected.data["dimension"]) == ("containment", "constraints")
        assert resolved.data["depth"] == 2 and resolved.data["delegation_id"].startswith("dlg_")
        assert (evaluated.data["decision"], evaluated.data["reason"]) == ("approve", "rule[1]")
        assert events[34].action_id is None and events[39].action_id is None
        assert verify_chain(store).ok
        assert len(events) == 44
        assert receipts[5].approver == "human:demo"
        assert "mismatch" in receipts[2].error and "consumed" in receipts[6].error
        assert not any(e.type in ("APPROVAL_GRANTED", "APPROVAL_DENIED") for e in events)
        jsonl = (directory / "receipts.jsonl").read_text(encoding="utf-8").splitlines()
        assert jsonl == [r.to_json() for r in receipts]
        assert len((directory / "events.jsonl").read_text(encoding="utf-8").splitlines()) == 44
        assert [json.loads(line)["event_id"] for line in (directory / "events.jsonl").open()] == [
            e.event_id for e in events
        ]
    finally:
        store.close()


def test_demo_can_be_read_with_the_cli(workdir, monkeypatch):
    assert invoke(["demo"]).code == 0
    monkeypatch.setenv("CTRLRUN_STATE", ".ctrlrun/demo/state.db")
    assert len(invoke(["receipts"]).lines) == 8
    assert invoke(["receipts", "--verify-chain"]).lines[0] == "chain: 8 of 8 receipts verified"
    assert invoke(["effects", "--state", "ambiguous"]).out.startswith("refund:txn_1  ambiguous")


def test_demo_repeats_and_deletes_only_its_own_files(workdir):
    directory = workdir / ".ctrlrun" / "demo"
    directory.mkdir(parents=True)
    (directory / "notes.txt").write_text("keep me", encoding="utf-8")
    (workdir / ".ctrlrun" / "state.db").write_text("the operator's store", encoding="utf-8")
    for _ in range(2):
        result = invoke(["demo"])
        assert result.code == 0, result.err
        assert "Receipts (8): " in result.out
    assert (directory / "notes.txt").read_text(encoding="utf-8") == "keep me"
    assert (workdir / ".ctrlrun" / "state.db").read_text(encoding="utf-8") == "the operator's store"
    assert len((directory / "receipts.jsonl").read_text(encoding="utf-8").splitlines()) == 8
    assert set(DEMO_FILES) >= {"state.db", "state.db-wal", "state.db-shm", "receipts.jsonl", "events.jsonl"}


@pytest.mark.parametrize("value", ["", "elsewhere"])
def test_demo_ignores_ctrlrun_variables(workdir, monkeypatch, value):
    for name in ("CTRLRUN_STORE_URL", "CTRLRUN_STATE", "CTRLRUN_CONFIG", "CTRLRUN_ENVIRONMENT"):
        monkeypatch.setenv(name, value and f"{value}/{name}")
    result = invoke(["demo"])
    assert result.code == 0, result.err
    assert sorted(p for p in tree(workdir) if "/" not in p) == [".ctrlrun"]


def test_demo_exits_non_zero_when_a_guarantee_breaks(workdir, monkeypatch):
    import ctrlrun.control.preconditions as preconditions
    import ctrlrun.store.steps as steps

    monkeypatch.setattr(steps, "check_consumable", lambda *args, **kwargs: None)
    # the check the Control makes on its own read before the store's (preconditions need it)
    monkeypatch.setattr(preconditions, "check_consumable", lambda *args, **kwargs: None)
    result = invoke(["demo"])
    assert result.code == 1
    assert "NOT REFUSED" in result.out
    assert result.err.startswith("Error: scenario 2, 4 was not refused")
    assert "Traceback" not in result.err


def test_demo_reports_an_unusable_directory(workdir):
    (workdir / ".ctrlrun").mkdir()
    (workdir / ".ctrlrun" / "demo").write_text("", encoding="utf-8")
    result = invoke(["demo"])
    assert result.code == 1 and result.err.startswith("Error: ")
