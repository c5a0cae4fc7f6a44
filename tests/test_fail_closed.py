"""Fail closed and keep the evidence: an expired principal, options not enforced, exceptions that
cannot describe themselves, and a reconcile hook asked at most once per call."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from ctrlrun import Control, InMemoryStateStore, Policy, context, protect
from ctrlrun.action import Action, Principal
from ctrlrun.effects.records import EffectState
from ctrlrun.errors import ActionDenied, AmbiguousEffect, InvalidArgument

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  shop.refund:
    effect: "refund:{order}"
    decision: allow
"""


class Expiring:
    """An identity provider whose principal expires at a set moment."""

    def __init__(self, expires_at: Any) -> None:
        self.expires_at = expires_at

    def principal(self, action_name: str) -> Principal:
        return Principal("agent-1", expires_at=self.expires_at)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_an_expired_principal_is_denied_before_policy_and_recorded(clock, kind):
    store = InMemoryStateStore(clock=clock)
    control = Control(Policy.from_yaml(POLICY), store, clock=clock,
                      identity=Expiring(clock() - timedelta(seconds=1)))  # fmt: skip
    ran: list[str] = []

    if kind == "sync":
        @protect("shop.refund", control=control)
        def refund(order: str) -> str:
            ran.append(order)
            return "ok"

        call = lambda: refund(order="o1")  # noqa: E731
    else:
        @protect("shop.refund", control=control)
        async def refund_async(order: str) -> str:
            ran.append(order)
            return "ok"

        call = lambda: asyncio.run(refund_async(order="o1"))  # noqa: E731
    with pytest.raises(ActionDenied) as info:
        call()
    assert info.value.reason == "principal_expired" and "expired" in str(info.value)
    assert ran == [] and store.get_effect("refund:o1") is None
    (receipt,) = store.receipts()
    assert (receipt.decision, receipt.decision_reason, receipt.result) == ("deny", "principal_expired", "denied")
    types = [e.type for e in store.events()]
    assert types == ["ACTION_PROPOSED", "ACTION_DENIED"]  # no policy was evaluated


def test_a_principal_expiring_later_runs(clock):
    store = InMemoryStateStore(clock=clock)
    control = Control(Policy.from_yaml(POLICY), store, clock=clock,
                      identity=Expiring(clock() + timedelta(minutes=1)))  # fmt: skip

    @protect("shop.refund", control=control)
    def refund(order: str) -> str:
        return "ok"

    assert refund(order="o1") == "ok"
    assert store.get_effect("refund:o1").state is EffectState.COMMITTED


def test_scope_is_refused_where_it_is_given(clock):
    control = Control(Policy.from_yaml(POLICY), InMemoryStateStore(clock=clock), clock=clock)
    with pytest.raises(InvalidArgument, match="scope= is not enforced"):
        protect("shop.refund", control=control, scope=lambda action: {})
    action = Action("shop.refund", {"order": "o1"}, Principal("agent-1"))
    with pytest.raises(InvalidArgument, match="scope= for action 'shop.refund' is not enforced"):
        control.run(action, lambda: "ok", "refund:o1", scope=lambda action: {})
    assert control.store.receipts() == ()


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("this message cannot be made")


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("raised", [Unprintable, GeneratorExit])
def test_an_exception_that_cannot_describe_itself_is_recorded_and_propagates(clock, kind, raised):
    store = InMemoryStateStore(clock=clock)
    control = Control(Policy.from_yaml(POLICY), store, clock=clock)

    def body() -> None:
        raise raised()

    if kind == "sync":
        call = protect("shop.refund", control=control)(lambda order: body())
        run = lambda: call(order="o1")  # noqa: E731
    else:
        async def refund(order: str) -> None:
            body()

        call_async = protect("shop.refund", control=control)(refund)
        run = lambda: asyncio.run(call_async(order="o1"))  # noqa: E731
    with context(agent="agent-1"):
        with pytest.raises(raised):  # the function's own exception, not a RuntimeError
            run()
    assert store.get_effect("refund:o1").state is EffectState.AMBIGUOUS
    (receipt,) = store.receipts()
    assert receipt.result == "ambiguous" and receipt.error.startswith(raised.__name__)


def test_the_reconcile_hook_runs_at_most_once_per_call(clock):
    store = InMemoryStateStore(clock=clock)
    control = Control(Policy.from_yaml(POLICY), store, clock=clock)
    asked: list[str] = []

    def reconcile(effect_key: str) -> str:
        asked.append(effect_key)
        return "not_executed"

    @protect("shop.refund", control=control, reconcile=reconcile, reconcile_eagerly=True)
    def refund(order: str) -> str:
        raise ConnectionError("the reply was lost")

    with context(agent="agent-1"):
        with pytest.raises(ConnectionError):
            refund(order="o1")  # ambiguous; the eager hook asks once and renews it
        assert asked == ["refund:o1"] and store.get_effect("refund:o1").state is EffectState.FAILED
        asked.clear()
        # another worker's attempt on the key ends ambiguous: the next call meets it reserving
        store.reserve_effect("refund:o1", "act_other")
        store.begin_execution("refund:o1", "act_other")
        store.mark_ambiguous("refund:o1", "act_other", "lost")
        with pytest.raises(ConnectionError):
            # blocking: the hook answers not_executed, the call renews and runs, raises again,
            # and the eager hook is not asked a second time in this call
            refund(order="o1")
    assert asked == ["refund:o1"]
    assert store.get_effect("refund:o1").state is EffectState.AMBIGUOUS
    with pytest.raises(AmbiguousEffect):
        store.reserve_effect("refund:o1", "act_later")


def test_every_answer_writes_its_event_in_its_own_transaction(store, clock):
    from ctrlrun.approvals.answers import answer_events, resolve_events
    from ctrlrun.approvals.records import ApprovalStatus

    from .test_store_conformance import put_request

    request = put_request(store, clock)

    def broken(record: Any, now: Any) -> Any:
        raise RuntimeError("the event could not be made")

    with pytest.raises(RuntimeError):
        store.grant_approval(request.request_id, "ada", events=broken)
    assert store.get_approval(request.request_id).status is ApprovalStatus.PENDING  # nothing kept
    assert store.events() == ()
    store.grant_approval(request.request_id, "ada", events=answer_events("ada", via="test"))
    (granted,) = store.events()
    assert str(granted.type) == "APPROVAL_GRANTED"
    assert granted.data == {"approver": "ada", "action_hash": request.action_hash, "via": "test"}

    other = put_request(store, clock)
    store.deny_approval(other.request_id, "bob", events=answer_events("bob"))
    assert (str(store.events()[-1].type), store.events()[-1].data) == ("APPROVAL_DENIED", {"approver": "bob"})

    store.reserve_effect("k", "act_1")
    store.begin_execution("k", "act_1")
    store.mark_ambiguous("k", "act_1", "lost")
    with pytest.raises(RuntimeError):
        store.resolve_effect("k", EffectState.COMMITTED, "cli:local", events=broken)
    assert store.get_effect("k").state is EffectState.AMBIGUOUS
    store.resolve_effect("k", EffectState.COMMITTED, "cli:local", events=resolve_events("cli:local", "human"))
    resolved = store.events()[-1]
    assert (str(resolved.type), resolved.effect_key, resolved.data) == (
        "EFFECT_RESOLVED", "k", {"state": "committed", "resolver": "cli:local", "resolved_by": "human"})


def test_argument_limits_are_refused_by_name():
    from ctrlrun.action import MAX_DEPTH

    deep: Any = "leaf"
    for _ in range(MAX_DEPTH + 1):
        deep = [deep]
    cases = [({"n": 10**5000}, "arguments.n is an int"), ({"d": deep}, "more than 64 deep"),
             ({"d": {"x": deep}}, "more than 64 deep")]  # fmt: skip
    for arguments, said in cases:
        with pytest.raises(InvalidArgument, match=said):
            Action("shop.refund", arguments, Principal("agent-1"))
    near: Any = "leaf"
    for _ in range(MAX_DEPTH):
        near = [near]
    assert Action("shop.refund", {"n": 10**3800, "d": near}, Principal("agent-1")).action_hash


def test_an_empty_state_file_is_refused_not_taken_as_a_new_store(tmp_path, clock, monkeypatch):
    from ctrlrun.store import SQLiteStateStore, sqlite

    monkeypatch.setattr(sqlite, "_EMPTY_WAIT", 0.0)  # no other process is creating it

    path = tmp_path / "state.db"
    path.write_bytes(b"")
    with pytest.raises(InvalidArgument, match="empty file, not a ctrlrun store") as info:
        SQLiteStateStore(path, clock=clock)
    assert "remembers none" in str(info.value) and path.stat().st_size == 0  # left as it was
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(InvalidArgument, match="not a SQLite database") as info:
        SQLiteStateStore(path, clock=clock)
    assert "new path" not in str(info.value) or "remembers none" in str(info.value)
