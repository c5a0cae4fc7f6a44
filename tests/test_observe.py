"""Observe mode: every check runs and is recorded, none that is about the action refuses; the
observed receipt names the first refusal enforce mode would have raised — the same one, also for
combinations — on every store."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

import ctrlrun
from ctrlrun import (
    ActionDenied,
    AmbiguousEffect,
    ApprovalMismatch,
    ApprovalRequired,
    BudgetExhausted,
    Control,
    DuplicateEffect,
    InvalidArgument,
    NotExecuted,
    Policy,
)

from .conftest import FakeClock

RULES = """\
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    max_attempts: 2
    rules:
      - { when: { amount_lte: 1000 }, decision: allow }
      - { when: { amount_lte: 100000 }, decision: approve }
      - { decision: deny }
"""
AUTHORITY = """\
authority:
  grants:
    - id: payer
      subject: { agent: agent }
      actions: [stripe.refund]
      budgets:
        - { metric: amount, limit: 1500, window: P1D }
"""


def policy(mode: str, *, authority: bool = False) -> Policy:
    return Policy.from_yaml(f"schema: ctrlrun.policy/v7\nmode: {mode}\n" + (AUTHORITY if authority else "") + RULES)


class World:
    def __init__(self, store: Any, clock: FakeClock, mode: str, *, authority: bool = False) -> None:
        self.store = store
        self.control = Control(policy(mode, authority=authority), store, clock=clock)
        self.ran: list[str] = []
        self.raise_: BaseException | None = None
        self.hook_calls: list[str] = []

        def hook(key: str) -> str:
            self.hook_calls.append(key)
            return "not_executed"

        @ctrlrun.protect("stripe.refund", effect="refund:{payment_id}", control=self.control,
                         reconcile=hook, reconcile_eagerly=True)  # fmt: skip
        def refund(payment_id: str, amount: int) -> str:
            self.ran.append(payment_id)
            if self.raise_ is not None:
                raise self.raise_
            return "re_" + payment_id

        self.refund = refund

    def call(self, payment_id: str, amount: int, *, approval: str | None = None) -> Any:
        with ctrlrun.context(agent="agent"):
            if approval is None:
                return self.refund(payment_id=payment_id, amount=amount)
            with ctrlrun.with_approval(approval):
                return self.refund(payment_id=payment_id, amount=amount)

    def last(self) -> Any:
        return self.store.receipts()[-1]


@pytest.fixture
def observing(store: Any, clock: FakeClock) -> World:
    return World(store, clock, "observe")


def test_a_denied_action_runs_once_and_the_enforced_document_refuses_it(observing: World, tmp_path: Any,
                                                                         clock: FakeClock) -> None:  # fmt: skip
    assert observing.call("p1", 5_000_000) == "re_p1"
    assert observing.ran == ["p1"]
    last = observing.last()
    assert (last.decision, last.decision_reason, last.result, last.execution) == ("deny", "rule[2]", "observed", "committed")
    assert dict(last.would_have) == {"decision": "deny", "reason": "rule[2]", "blocked_reason": "rule[2]"}
    types = [e.type for e in observing.store.events()]
    assert "ACTION_DENIED" not in types and "POLICY_EVALUATED" in types
    enforcing = World(ctrlrun.InMemoryStateStore(clock=clock), clock, "enforce")
    with pytest.raises(ActionDenied):
        enforcing.call("p1", 5_000_000)
    assert enforcing.ran == []


def test_an_approve_action_asks_nobody(observing: World) -> None:
    assert observing.call("p1", 5_000) == "re_p1"
    assert observing.store.pending_approvals() == ()
    assert not [e for e in observing.store.events() if e.type == "APPROVAL_REQUESTED"]
    assert observing.last().would_have["blocked_reason"] == "approval_required"


def test_a_duplicate_runs_again_holding_nothing_and_leaves_the_record(observing: World) -> None:
    observing.call("p1", 10)
    before = observing.store.get_effect("refund:p1")
    seen: list[Any] = []

    @ctrlrun.protect("stripe.refund", effect="refund:{payment_id}", control=observing.control)
    def refund(payment_id: str, amount: int) -> str:
        with pytest.raises(InvalidArgument):
            ctrlrun.idempotency_token()  # nothing is held
        seen.append(payment_id)
        return "again"

    with ctrlrun.context(agent="agent"):
        assert refund(payment_id="p1", amount=10) == "again"
    assert seen == ["p1"]
    assert observing.store.get_effect("refund:p1") == before
    last = observing.last()
    assert (last.result, last.execution, last.attempt) == ("observed", "committed", 1)
    assert last.would_have["blocked_reason"] == "duplicate"
    refused = [e for e in observing.store.events() if e.type == "EFFECT_RESERVATION_REFUSED"]
    assert [dict(e.data) for e in refused] == [{"reason": "duplicate", "state": "committed"}]


def test_the_reconcile_hook_is_never_called(observing: World) -> None:
    observing.raise_ = TimeoutError("reply lost")
    with pytest.raises(TimeoutError):  # the executor's own exception propagates
        observing.call("p1", 10)
    assert observing.store.get_effect("refund:p1").state == "ambiguous"
    assert observing.last().execution == "ambiguous"
    observing.raise_ = None
    assert observing.call("p1", 10) == "re_p1"
    assert observing.hook_calls == []
    assert observing.store.get_effect("refund:p1").state == "ambiguous"
    assert observing.last().would_have["blocked_reason"] == "ambiguous"


def test_not_executed_still_fails_the_record_and_propagates(observing: World) -> None:
    observing.raise_ = NotExecuted("never sent")
    with pytest.raises(NotExecuted):
        observing.call("p1", 10)
    assert observing.store.get_effect("refund:p1").state == "failed"
    assert (observing.last().result, observing.last().execution) == ("observed", "failed")


def test_a_presented_approval_is_checked_by_a_read_and_never_spent(observing: World, store: Any,
                                                                    clock: FakeClock) -> None:  # fmt: skip
    enforcing = World(store, clock, "enforce")
    with pytest.raises(ApprovalRequired) as required:
        enforcing.call("p1", 5_000)
    request_id = required.value.request_id
    store.grant_approval(request_id, "ops:ada")
    assert observing.call("p1", 5_000, approval=request_id) == "re_p1"
    assert store.get_approval(request_id).status == "granted"
    last = observing.last()
    assert last.approval_id == request_id and last.would_have["blocked_reason"] is None
    assert observing.call("p2", 6_000, approval=request_id) == "re_p2"  # another action
    assert observing.last().would_have["blocked_reason"] == "mismatch"
    invalidated = [e for e in store.events() if e.type == "APPROVAL_INVALIDATED"]
    assert invalidated[-1].data["reason"] == "mismatch"
    assert store.get_approval(request_id).status == "granted"


def test_authority_denial_is_recorded_and_the_policy_not_asked(store: Any, clock: FakeClock) -> None:
    world = World(store, clock, "observe", authority=True)
    with ctrlrun.context(agent="stranger"):
        assert world.refund(payment_id="p1", amount=10) == "re_p1"
    types = [e.type for e in store.events()]
    assert "AUTHORITY_DENIED" in types and "POLICY_EVALUATED" not in types and "ACTION_DENIED" not in types
    last = world.last()
    assert (last.decision, last.decision_reason) == ("deny", "no_authority")
    assert last.would_have["blocked_reason"] == "no_authority" and list(last.budget_charges) == []


def test_budgets_are_checked_but_nothing_is_charged(store: Any, clock: FakeClock) -> None:
    world = World(store, clock, "observe", authority=True)
    world.call("p1", 900)
    world.call("p2", 900)  # 1800 of 1500 would have been refused... if anything had been charged
    assert store.consumptions() == ()
    assert [dict(c) for c in world.last().budget_charges] == [{"grant_id": "payer", "metric": "amount", "amount": 900}]
    assert world.last().would_have["blocked_reason"] is None  # the ledger is empty


def first_refusal_enforced(world: World, *calls: tuple[str, int]) -> str:
    """Run ``calls`` in enforce mode; the reason of the last one's refusal."""
    for payment_id, amount in calls[:-1]:
        try:
            world.call(payment_id, amount)
        except (ActionDenied, ApprovalRequired, DuplicateEffect, AmbiguousEffect, NotExecuted):
            pass
    try:
        world.call(*calls[-1])
    except ApprovalRequired:
        return "approval_required"
    except BudgetExhausted as refused:
        return refused.reason
    except DuplicateEffect as refused:
        return "duplicate" if refused.state == "committed" else "in_progress"
    except ApprovalMismatch as refused:
        return refused.reason
    except ActionDenied as refused:
        return refused.reason
    return "none"


@pytest.mark.parametrize(("name", "calls", "raised"), [
    ("approval + budget", [("a", 1_000), ("b", 1_000), ("c", 5_000)], None),
    ("duplicate + budget", [("a", 1_000), ("b", 400), ("a", 1_000)], None),
    ("approval + ceiling", [("a", 10), ("a", 10), ("a", 5_000)], NotExecuted("no")),
])  # fmt: skip
def test_observe_names_the_same_first_refusal_as_enforce(tmp_path: Any, clock: FakeClock, name: str,
                                                          calls: list[tuple[str, int]], raised: Any) -> None:  # fmt: skip
    enforcing = World(ctrlrun.SQLiteStateStore(tmp_path / "enforce.db", clock=clock), clock, "enforce",
                      authority=True)  # fmt: skip
    enforcing.raise_ = raised
    expected = first_refusal_enforced(enforcing, *calls)
    assert expected != "none", name
    observed_store = ctrlrun.SQLiteStateStore(tmp_path / "observe.db", clock=clock)
    # the ledger must hold what enforce spent for a budget to refuse: the same calls, enforced
    prepared = World(observed_store, clock, "enforce", authority=True)
    prepared.raise_ = raised
    for payment_id, amount in calls[:-1]:
        try:
            prepared.call(payment_id, amount)
        except (ActionDenied, ApprovalRequired, DuplicateEffect, AmbiguousEffect, NotExecuted):
            pass
    observing = World(observed_store, clock, "observe", authority=True)
    observing.raise_ = raised
    try:
        observing.call(*calls[-1])
    except NotExecuted:
        pass
    assert observing.last().would_have["blocked_reason"] == expected, name


def test_the_straight_path_gives_way_when_observing(observing: World) -> None:
    observing.call("p1", 10)
    assert observing.last().result == "observed"
    assert observing.control.evaluate(
        ctrlrun.Action("stripe.refund", {"payment_id": "p9", "amount": 5_000_000}, ctrlrun.Principal("agent"))
    ).decision == "deny"


def test_execute_returns_the_observed_receipt(observing: World, clock: FakeClock) -> None:
    action = ctrlrun.Action("stripe.refund", {"payment_id": "p1", "amount": 5_000_000}, ctrlrun.Principal("agent"))
    receipt = observing.control.execute(action, lambda: "ok", "refund:p1")
    assert (receipt.result, receipt.execution, receipt.decision) == ("observed", "committed", "deny")
    clock.advance(timedelta(seconds=1))


def test_a_presented_approval_whose_world_changed_is_noted_and_left_granted(store: Any, clock: FakeClock) -> None:
    world = {"balance": 100}
    enforcing = Control(policy("enforce"), store, clock=clock)
    observing = Control(policy("observe"), store, clock=clock)
    ran: list[str] = []

    def refunder(control: Control) -> Any:
        @ctrlrun.protect("stripe.refund", effect="refund:{payment_id}", control=control,
                         preconditions=lambda action: dict(world))  # fmt: skip
        def refund(payment_id: str, amount: int) -> str:
            ran.append(payment_id)
            return "ok"

        return refund

    with ctrlrun.context(agent="agent"):
        with pytest.raises(ApprovalRequired) as required:
            refunder(enforcing)(payment_id="p1", amount=5_000)
        request_id = required.value.request_id
        store.grant_approval(request_id, "ops:ada")
        world["balance"] = 0  # the state the human saw is gone
        with ctrlrun.with_approval(request_id):
            assert refunder(observing)(payment_id="p1", amount=5_000) == "ok"
    last = store.receipts()[-1]
    assert (last.result, last.would_have["blocked_reason"]) == ("observed", "precondition_changed")
    assert store.get_approval(request_id).status == "granted"
    assert ran == ["p1"]
