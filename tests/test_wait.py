"""``@protect(wait=True)``: the call says once what it waits for and how to answer it, and a call
restarted after its request was approved spends that approval instead of asking again."""

from __future__ import annotations

import io
import logging

import pytest

from ctrlrun import (
    ApprovalTimeout,
    Control,
    Policy,
    ScriptedApprovalProvider,
    SQLiteStateStore,
    context,
    protect,
)
from ctrlrun.approvals.records import ApprovalStatus

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    rules:
      - { when: { amount_lte: 100 }, decision: allow }
      - { decision: approve }
"""


def _refund(store, clock, script, runs):
    """One process's function: a fresh Control over the shared store, as a restart has it."""
    control = Control(Policy.from_yaml(POLICY), store, ScriptedApprovalProvider(store, script, clock=clock),
                      clock=clock)  # fmt: skip

    @protect("stripe.refund", effect="refund:{payment_id}", wait=True, control=control)
    def refund(payment_id: str, amount: int) -> str:
        runs.append(payment_id)
        return "re_" + payment_id

    return refund


def test_a_restarted_call_spends_the_approval_granted_meanwhile(tmp_path, clock, caplog):
    store = SQLiteStateStore(tmp_path / "state.db", clock=clock)
    runs: list[str] = []
    first = _refund(store, clock, [], runs)  # nobody answers before it gives up (Ctrl-C, a timeout)
    with context(agent="agent-1"), pytest.raises(ApprovalTimeout) as waited:
        first(payment_id="p1", amount=5_000)
    (request,) = store.pending_approvals()
    assert waited.value.request_id == request.approval_id
    store.grant_approval(request.approval_id, "cli:local")  # the human answers after all
    again = _refund(store, clock, [], runs)  # restarted: would time out again if it asked
    with context(agent="agent-1"):
        assert again(payment_id="p1", amount=5_000) == "re_p1"
    assert runs == ["p1"]
    assert [r.approval_id for r in store.approvals_for(request.action_hash)] == [request.approval_id]
    assert store.get_approval(request.approval_id).status is ApprovalStatus.CONSUMED
    assert store.receipts()[-1].approval_id == request.approval_id


def test_a_granted_approval_of_other_arguments_is_not_spent(tmp_path, clock):
    store = SQLiteStateStore(tmp_path / "state.db", clock=clock)
    runs: list[str] = []
    with context(agent="agent-1"), pytest.raises(ApprovalTimeout):
        _refund(store, clock, [], runs)(payment_id="p1", amount=5_000)
    (request,) = store.pending_approvals()
    store.grant_approval(request.approval_id, "cli:local")
    with context(agent="agent-1"), pytest.raises(ApprovalTimeout):
        _refund(store, clock, [], runs)(payment_id="p1", amount=6_000)  # another action: asks
    assert runs == [] and store.get_approval(request.approval_id).status is ApprovalStatus.GRANTED


def test_waiting_says_the_request_and_the_command_once(tmp_path, clock, caplog):
    store = SQLiteStateStore(tmp_path / "state.db", clock=clock)
    refund = _refund(store, clock, ["pending", "pending", "grant"], [])
    with caplog.at_level(logging.WARNING, logger="ctrlrun"), context(agent="agent-1"):
        assert refund(payment_id="p1", amount=5_000) == "re_p1"
    (request,) = [a for a in store.approvals_for(store.receipts()[-1].action_hash)]
    said = [r.getMessage() for r in caplog.records if request.approval_id in r.getMessage()]
    assert len(said) == 1 and f"ctrlrun approve {request.approval_id}" in said[0], said


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_an_interactive_stderr_gets_the_line_when_the_log_goes_elsewhere(tmp_path, clock, monkeypatch):
    terminal = _Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    elsewhere = logging.StreamHandler(io.StringIO())
    logger = logging.getLogger("ctrlrun")
    logger.addHandler(elsewhere)
    try:
        store = SQLiteStateStore(tmp_path / "state.db", clock=clock)
        with context(agent="agent-1"):
            _refund(store, clock, ["grant"], [])(payment_id="p1", amount=5_000)
    finally:
        logger.removeHandler(elsewhere)
    lines = terminal.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ctrlrun: action 'stripe.refund' is waiting for a human")
    assert "ctrlrun approve apr_" in lines[0]
    assert "ctrlrun approve apr_" in elsewhere.stream.getvalue()
