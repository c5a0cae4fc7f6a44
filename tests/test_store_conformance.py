"""Every store rule, run against every backend through the shared ``store`` fixture.

A test typed ``store: StateStore`` uses only the protocol (what ``Control``, the providers and the
CLI call); one typed ``StoreOps`` also drives the operations the concrete stores share beyond it
(the single effect transitions, the approval finders, ``events``, ``put_receipt``,
``transactions``).
"""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from ctrlrun.action import Action, Principal, new_id
from ctrlrun.approvals.records import (
    ApprovalStatus,
    LocalApprovalProvider,
    ScriptedApprovalProvider,
    VerifiedApprover,
    build_request,
)
from ctrlrun.effects.records import LAPSED_LEASE_ERROR, EffectState
from ctrlrun.errors import (
    ActionDenied,
    AmbiguousEffect,
    ApprovalMismatch,
    ApprovalTimeout,
    DuplicateEffect,
    InvalidArgument,
)
from ctrlrun.receipt import GENESIS_HASH, Event, EventType, Receipt, verify_chain
from ctrlrun.store import StateStore
from ctrlrun.store.ops import StoreOps

from .conftest import CONFORMANCE_FACTORIES, backend_params, drop_test_store

LEASE = timedelta(minutes=5)
TICK = timedelta(microseconds=1)


@pytest.fixture(params=backend_params(CONFORMANCE_FACTORIES))
def store_kind(request, tmp_path):
    """Every backend, and the Postgres store once more with its writes prepared on the server."""
    yield request.param
    drop_test_store(request.param, tmp_path)


@pytest.fixture
def store(store_kind, tmp_path, clock):
    instance = CONFORMANCE_FACTORIES[store_kind](tmp_path, clock)
    yield instance
    instance.close()


def make_action(**arguments) -> Action:
    return Action(
        "stripe.refund",
        arguments or {"payment_id": "txn_1", "amount": 100},
        Principal("agent-1", "user-1"),
    )


def put_request(store: StateStore, clock, action=None, ttl=timedelta(minutes=15)):
    request = build_request(action or make_action(), ttl, clock())
    store.put_approval_request(request)
    return request


def granted_request(store: StateStore, clock, action=None):
    request = put_request(store, clock, action)
    store.grant_approval(request.request_id, "cli:local")
    return request


def make_receipt(n: int = 0, receipt_id: str | None = None) -> Receipt:
    return Receipt(
        receipt_id=receipt_id or new_id("ctr"),
        action_id=new_id("act"),
        action="stripe.refund",
        action_hash="sha256:" + "a" * 64,
        principal={"agent": "a", "user": None, "claims": {}, "issuer": None, "expires_at": None},
        resource=None,
        arguments={"n": n},
        environment="production",
        decision="allow",
        decision_reason="rule[0]",
        approval_id=None,
        approver=None,
        effect_key=None,
        attempt=1,
        result="committed",
        execution=None,
        would_have=None,
        error=None,
        started_at="2026-11-30T09:00:00.000Z",
        finished_at="2026-11-30T09:00:00.000Z",
    )


def make_event(kind: EventType = EventType.ACTION_PROPOSED, **data) -> Event:
    return Event(kind, "2026-11-30T09:00:00.000Z", action_id="act_1", data=data)


def executing(store: StoreOps, key="k", action_id="a1", lease=LEASE):
    store.reserve_effect(key, action_id, lease)
    store.begin_execution(key, action_id)


# --------------------------------------------------------------------------- reservation table


def test_reserve_new_key(store: StoreOps, clock):
    reservation = store.reserve_effect("refund:txn_1", "a1", LEASE)
    assert (reservation.attempt, reservation.action_id) == (1, "a1")
    assert reservation.lease_expires_at == clock() + LEASE
    record = store.get_effect("refund:txn_1")
    assert record.state is EffectState.RESERVED
    assert record.created_at == record.updated_at == clock()
    assert record.lease_expires_at == clock() + LEASE
    assert (record.result, record.error, record.resolved_by) == (None, None, None)


def test_renew_after_failed_clears_fields(store: StoreOps, clock):
    executing(store)
    store.fail_effect("k", "a1", "remote said no")
    created = store.get_effect("k").created_at
    clock.advance(seconds=10)
    reservation = store.reserve_effect("k", "a2", LEASE)
    assert reservation.attempt == 2
    record = store.get_effect("k")
    assert (record.state, record.action_id, record.attempt) == (EffectState.RESERVED, "a2", 2)
    assert (record.result, record.error, record.resolved_by) == (None, None, None)
    assert record.created_at == created and record.updated_at == clock()
    assert record.lease_expires_at == clock() + LEASE


def test_lapsed_reserved_renews(store: StoreOps, clock):
    store.reserve_effect("k", "a1", LEASE)
    clock.advance(LEASE + TICK)
    assert store.reserve_effect("k", "a2", LEASE).attempt == 2
    with pytest.raises(DuplicateEffect) as info:  # the former holder may no longer begin
        store.begin_execution("k", "a1")
    assert info.value.state == "in_progress"


def test_committed_is_duplicate(store: StoreOps):
    executing(store)
    store.commit_effect("k", "a1", {"ok": True})
    with pytest.raises(DuplicateEffect) as info:
        store.reserve_effect("k", "a2")
    assert (info.value.state, info.value.effect_key) == ("committed", "k")


@pytest.mark.parametrize("begin", [False, True])
@pytest.mark.parametrize("who", ["a1", "a2"])
def test_live_lease_is_in_progress(store: StoreOps, clock, begin, who):
    store.reserve_effect("k", "a1", LEASE)
    if begin:
        store.begin_execution("k", "a1")
    clock.advance(LEASE)  # exactly at expiry the lease is still live
    with pytest.raises(DuplicateEffect) as info:
        store.reserve_effect("k", who)
    assert info.value.state == "in_progress"
    assert store.get_effect("k").attempt == 1


def test_lapsed_executing_is_kept_ambiguous(store: StoreOps, clock):
    executing(store)
    clock.advance(LEASE + TICK)
    with pytest.raises(AmbiguousEffect) as info:
        store.reserve_effect("k", "a2")
    assert (info.value.effect_key, info.value.action_id) == ("k", "a1")
    record = store.get_effect("k")
    assert (record.state, record.action_id, record.attempt) == (EffectState.AMBIGUOUS, "a1", 1)
    assert record.error == LAPSED_LEASE_ERROR and record.lease_expires_at is None
    with pytest.raises(AmbiguousEffect) as again:
        store.reserve_effect("k", "a3")
    assert again.value.action_id == "a1"


def test_reads_never_transition(store: StoreOps, clock):
    executing(store)
    clock.advance(hours=1)
    assert store.get_effect("k").state is EffectState.EXECUTING
    assert [r.state for r in store.list_effects()] == [EffectState.EXECUTING]


@pytest.mark.parametrize(
    "key, action_id, lease",
    [("", "a", LEASE), ("k", "", LEASE), ("k", "a", timedelta(0)), ("k", "a", -LEASE),
     (None, "a", LEASE), ("k", "a", 5)],
)  # fmt: skip
def test_reserve_refuses_bad_arguments(store: StoreOps, key, action_id, lease):
    with pytest.raises(InvalidArgument):
        store.reserve_effect(key, action_id, lease)
    assert store.list_effects() == ()


# --------------------------------------------------------------------------- transitions


def test_begin_commit_result_round_trip(store: StoreOps):
    executing(store)
    result = {"id": "re_1", "amount": 10**30, "ok": True, "nested": [1, {"x": None}]}
    store.commit_effect("k", "a1", result)
    record = store.get_effect("k")
    assert record.state is EffectState.COMMITTED and record.lease_expires_at is None
    assert record.result == result and type(record.result["ok"]) is bool


def test_unencodable_result_stored_as_repr(store: StoreOps):
    executing(store)

    class Thing:
        def __repr__(self) -> str:
            return "<Thing>"

    store.commit_effect("k", "a1", {"thing": Thing()})
    assert store.get_effect("k").result == "{'thing': <Thing>}"


def test_error_text_made_storable(store: StoreOps):
    executing(store)
    store.fail_effect("k", "a1", "bad \udc80 byte")
    assert store.get_effect("k").error == "bad \\udc80 byte"


def test_begin_refusals(store: StoreOps, clock):
    with pytest.raises(InvalidArgument):
        store.begin_execution("nope", "a1")
    store.reserve_effect("k", "a1", LEASE)
    with pytest.raises(DuplicateEffect) as info:
        store.begin_execution("k", "a2")
    assert info.value.state == "in_progress"
    store.begin_execution("k", "a1")
    with pytest.raises(InvalidArgument):
        store.begin_execution("k", "a1")  # already executing
    store.commit_effect("k", "a1", None)
    with pytest.raises(DuplicateEffect) as done:
        store.begin_execution("k", "a1")
    assert done.value.state == "committed"


def test_commit_needs_executing(store: StoreOps):
    store.reserve_effect("k", "a1")
    with pytest.raises(InvalidArgument):
        store.commit_effect("k", "a1", 1)
    with pytest.raises(InvalidArgument):
        store.fail_effect("k", "a1", "x")
    assert store.get_effect("k").state is EffectState.RESERVED


def test_slow_holder_may_commit_uncontested(store: StoreOps, clock):
    executing(store)
    clock.advance(hours=2)
    store.commit_effect("k", "a1", "late")
    assert store.get_effect("k").state is EffectState.COMMITTED


def test_outcome_after_lapse_contested_is_refused(store: StoreOps, clock):
    executing(store)
    clock.advance(LEASE + TICK)
    with pytest.raises(AmbiguousEffect):
        store.reserve_effect("k", "a2")
    with pytest.raises(AmbiguousEffect) as info:
        store.commit_effect("k", "a1", "late")
    assert info.value.action_id == "a1"
    assert store.get_effect("k").state is EffectState.AMBIGUOUS


@pytest.mark.parametrize("begin", [False, True])
def test_mark_ambiguous_from_reserved_or_executing(store: StoreOps, begin):
    store.reserve_effect("k", "a1")
    if begin:
        store.begin_execution("k", "a1")
    store.mark_ambiguous("k", "a1", "TimeoutError: read timed out")
    store.mark_ambiguous("k", "a1", "again")  # idempotent
    record = store.get_effect("k")
    assert (record.state, record.error, record.lease_expires_at) == (
        EffectState.AMBIGUOUS, "again", None,
    )  # fmt: skip


def test_mark_ambiguous_refusals(store: StoreOps):
    store.reserve_effect("k", "a1")
    with pytest.raises(DuplicateEffect):
        store.mark_ambiguous("k", "a2", "x")
    store.mark_ambiguous("k", "a1", "x")
    with pytest.raises(AmbiguousEffect):
        store.mark_ambiguous("k", "a2", "x")
    executing(store, "f")
    store.fail_effect("f", "a1", "no")
    with pytest.raises(InvalidArgument):
        store.mark_ambiguous("f", "a1", "x")
    assert store.get_effect("f").state is EffectState.FAILED


@pytest.mark.parametrize("target", [EffectState.COMMITTED, EffectState.FAILED, "failed"])
def test_resolve_from_ambiguous(store: StoreOps, target):
    executing(store)
    store.mark_ambiguous("k", "a1", "TimeoutError: boom")
    record = store.resolve_effect("k", target, "cli:local")
    state = EffectState(target)
    assert record.state is state and record.resolved_by == "cli:local"
    assert record.error == f"resolved {state} by cli:local (was: TimeoutError: boom)"
    assert store.get_effect("k") == record


def test_resolve_without_old_error(store: StoreOps):
    store.reserve_effect("k", "a1")
    store.mark_ambiguous("k", "a1", None)
    record = store.resolve_effect("k", "committed", "reconcile:stripe.refund")
    assert record.error == "resolved committed by reconcile:stripe.refund"


def test_resolve_refusals_leave_record_unchanged(store: StoreOps, clock):
    with pytest.raises(InvalidArgument):
        store.resolve_effect("nope", EffectState.COMMITTED, "cli:local")
    executing(store)
    before = store.get_effect("k")
    for target in (EffectState.COMMITTED, EffectState.FAILED):
        with pytest.raises(InvalidArgument):
            store.resolve_effect("k", target, "cli:local")
    clock.advance(hours=1)  # a lapsed lease is still not resolvable directly
    with pytest.raises(InvalidArgument):
        store.resolve_effect("k", EffectState.FAILED, "cli:local")
    store.mark_ambiguous("k", "a1", "x")
    for target in (EffectState.RESERVED, EffectState.AMBIGUOUS, "bogus"):
        with pytest.raises(InvalidArgument):
            store.resolve_effect("k", target, "cli:local")
    assert store.get_effect("k").state is EffectState.AMBIGUOUS
    assert before.state is EffectState.EXECUTING


def test_resolved_failed_renews_and_clears_resolver(store: StoreOps):
    executing(store)
    store.mark_ambiguous("k", "a1", "x")
    store.resolve_effect("k", EffectState.FAILED, "cli:local")
    assert store.reserve_effect("k", "a2").attempt == 2
    assert store.get_effect("k").resolved_by is None


@pytest.mark.parametrize(
    "text", ["", "two\nlines", "tab\there", "nul\x00", "zw\u200bsp", "ls\u2028x", "ps\u2029x",
             "c1\x85x", "bidi\u202ex", 7, None],
)  # fmt: skip
def test_resolver_and_approver_text_checked(store: StoreOps, clock, text):
    store.reserve_effect("k", "a1")
    store.mark_ambiguous("k", "a1", "x")
    with pytest.raises(InvalidArgument):
        store.resolve_effect("k", EffectState.COMMITTED, text)
    request = put_request(store, clock)
    with pytest.raises(InvalidArgument):
        store.grant_approval(request.request_id, text)
    with pytest.raises(InvalidArgument):
        store.deny_approval(request.request_id, text)
    assert store.get_effect("k").state is EffectState.AMBIGUOUS
    assert store.get_approval(request.request_id).status is ApprovalStatus.PENDING


def test_extend_lease(store: StoreOps, clock):
    until = clock() + timedelta(hours=1)
    with pytest.raises(AmbiguousEffect):
        store.extend_lease("k", "a1", until)
    store.reserve_effect("k", "a1", LEASE)
    with pytest.raises(DuplicateEffect) as live_reserved:
        store.extend_lease("k", "a1", until)
    assert live_reserved.value.state == "in_progress"
    store.begin_execution("k", "a1")
    with pytest.raises(DuplicateEffect):
        store.extend_lease("k", "a2", until)
    with pytest.raises(InvalidArgument):
        store.extend_lease("k", "a1", clock() + LEASE - TICK)  # earlier than the current expiry
    with pytest.raises(InvalidArgument):
        store.extend_lease("k", "a1", clock())  # not in the future
    with pytest.raises(InvalidArgument):
        store.extend_lease("k", "a1", datetime(2030, 1, 1))  # naive
    store.extend_lease("k", "a1", until)
    assert store.get_effect("k").lease_expires_at == until
    clock.advance(hours=1, microseconds=1)
    with pytest.raises(AmbiguousEffect):  # an expired lease is never extended
        store.extend_lease("k", "a1", clock() + LEASE)
    store.commit_effect("k", "a1", None)
    with pytest.raises(DuplicateEffect) as done:
        store.extend_lease("k", "a1", clock() + LEASE)
    assert done.value.state == "committed"


def test_list_effects_order_and_filter(store: StoreOps, clock):
    for key in ("c", "a", "b"):
        store.reserve_effect(key, "x" + key)
        clock.advance(seconds=1)
    store.mark_ambiguous("a", "xa", "boom")
    assert [r.effect_key for r in store.list_effects()] == ["c", "a", "b"]
    assert [r.effect_key for r in store.list_effects("ambiguous")] == ["a"]
    assert [r.effect_key for r in store.list_effects(EffectState.RESERVED)] == ["c", "b"]
    with pytest.raises(InvalidArgument):
        store.list_effects("bogus")


# --------------------------------------------------------------------------- approvals


def test_request_round_trip(store: StateStore, clock):
    principal = Principal(
        "agent-1",
        "user-1",
        claims={"roles": ["ops", "fin"], "level": 3, "admin": False},
        issuer="https://idp.example",
        expires_at=datetime(2027, 1, 1, 12, 30, 0, 123456, tzinfo=timezone.utc),
    )
    action = Action(
        "db.write",
        {"n": 10**40, "flag": True, "off": False, "none": None, "nested": {"l": [1, "2", [3]]},
         "text": "héllo ☃"},
        principal,
        resource="db://main",
        environment="staging",
    )  # fmt: skip
    request = build_request(action, timedelta(minutes=3), clock(), policy_hash="sha256:" + "b" * 64)
    store.put_approval_request(request)
    record = store.get_approval(request.request_id)
    assert record.status is ApprovalStatus.PENDING and record.request == request
    back = record.request.action
    assert back.action_hash == action.action_hash and back.action_id == action.action_id
    assert back.arguments["n"] == 10**40 and back.arguments["flag"] is True
    assert back.principal == principal
    assert record.approval_id == request.request_id and record.expires_at == request.expires_at
    assert record.request.policy_hash == "sha256:" + "b" * 64


def test_request_id_reuse_refused(store: StateStore, clock):
    request = put_request(store, clock)
    store.grant_approval(request.request_id, "cli:local")
    with pytest.raises(InvalidArgument):
        store.put_approval_request(request)
    assert store.get_approval(request.request_id).status is ApprovalStatus.GRANTED


def test_grant_and_answer_once(store: StateStore, clock):
    request = put_request(store, clock)
    clock.advance(seconds=5)
    approval = store.grant_approval(request.request_id, "cli:local")
    assert (approval.approval_id, approval.action_hash) == (request.request_id, request.action_hash)
    assert approval.granted_at == clock() and approval.expires_at == request.expires_at
    for answer in (store.grant_approval, store.deny_approval):
        with pytest.raises(ApprovalMismatch) as info:
            answer(request.request_id, "someone")
        assert info.value.reason == "granted"
    record = store.get_approval(request.request_id)
    assert (record.status, record.approver) == (ApprovalStatus.GRANTED, "cli:local")


def test_deny_then_grant_refused(store: StateStore, clock):
    request = put_request(store, clock)
    assert store.deny_approval(request.request_id, "cli:local") is None
    with pytest.raises(ApprovalMismatch) as info:
        store.grant_approval(request.request_id, "cli:local")
    assert info.value.reason == "denied"
    record = store.get_approval(request.request_id)
    assert (record.status, record.approver) == (ApprovalStatus.DENIED, "cli:local")


def test_answer_unknown(store: StateStore):
    for answer in (store.grant_approval, store.deny_approval):
        with pytest.raises(ApprovalMismatch) as info:
            answer("apr_" + "0" * 32, "cli:local")
        assert info.value.reason == "unknown"


@pytest.mark.parametrize("answer", ["grant_approval", "deny_approval"])
def test_answer_expiry_boundary(store: StateStore, clock, answer):
    on_time = put_request(store, clock, ttl=timedelta(minutes=1))
    late = put_request(store, clock, ttl=timedelta(minutes=1))
    clock.set(on_time.expires_at)
    getattr(store, answer)(on_time.request_id, "cli:local")
    clock.advance(TICK)
    with pytest.raises(ApprovalMismatch) as info:
        getattr(store, answer)(late.request_id, "cli:local")
    assert info.value.reason == "expired"
    assert store.get_approval(late.request_id).status is ApprovalStatus.EXPIRED  # kept write


def test_consume_checks_in_order(store: StateStore, clock):
    action = make_action()
    with pytest.raises(ApprovalMismatch) as unknown:
        store.consume_approval("apr_" + "1" * 32, action.action_hash)
    assert unknown.value.reason == "unknown"
    pending = put_request(store, clock, action)
    with pytest.raises(ApprovalMismatch) as info:
        store.consume_approval(pending.request_id, action.action_hash)
    assert info.value.reason == "pending"
    with pytest.raises(ApprovalMismatch) as mismatch:
        store.consume_approval(pending.request_id, make_action(amount=5).action_hash)
    assert mismatch.value.reason == "mismatch"
    store.grant_approval(pending.request_id, "cli:local")  # still answerable after a mismatch
    with pytest.raises(ApprovalMismatch):
        store.consume_approval(pending.request_id, make_action(amount=5).action_hash)
    approval = store.consume_approval(pending.request_id, action.action_hash)  # still consumable
    assert approval.approver == "cli:local"
    record = store.get_approval(pending.request_id)
    assert record.status is ApprovalStatus.CONSUMED and record.consumed_at == clock()
    with pytest.raises(ApprovalMismatch) as consumed:
        store.consume_approval(pending.request_id, action.action_hash)
    assert consumed.value.reason == "consumed"


def test_consume_denied_is_action_denied(store: StateStore, clock):
    action = make_action()
    request = put_request(store, clock, action)
    store.deny_approval(request.request_id, "cli:local")
    with pytest.raises(ActionDenied) as info:
        store.consume_approval(request.request_id, action.action_hash)
    assert info.value.reason == "approval_denied"
    with pytest.raises(ApprovalMismatch) as mismatch:  # mismatch is checked before status
        store.consume_approval(request.request_id, make_action(amount=1).action_hash)
    assert mismatch.value.reason == "mismatch"


def test_consume_expiry_boundary(store: StateStore, clock):
    action = make_action()
    on_time = granted_request(store, clock, action)
    late = granted_request(store, clock, action)
    clock.set(on_time.expires_at)
    store.consume_approval(on_time.request_id, action.action_hash)
    clock.advance(TICK)
    with pytest.raises(ApprovalMismatch) as info:
        store.consume_approval(late.request_id, action.action_hash)
    assert info.value.reason == "expired"
    assert store.get_approval(late.request_id).status is ApprovalStatus.EXPIRED
    with pytest.raises(ApprovalMismatch) as again:
        store.consume_approval(late.request_id, action.action_hash)
    assert again.value.reason == "expired"


def test_consume_and_reserve(store: StoreOps, clock):
    action = make_action()
    request = granted_request(store, clock, action)
    approval, reservation = store.consume_approval_and_reserve(
        request.request_id, action.action_hash, "refund:txn_1", action.action_id, LEASE
    )
    assert approval.approval_id == request.request_id and reservation.attempt == 1
    assert store.get_approval(request.request_id).status is ApprovalStatus.CONSUMED
    assert store.get_effect("refund:txn_1").state is EffectState.RESERVED


def test_refused_reservation_leaves_approval_granted(store: StoreOps, clock):
    action = make_action()
    executing(store, "refund:txn_1")
    store.commit_effect("refund:txn_1", "a1", None)
    request = granted_request(store, clock, action)
    with pytest.raises(DuplicateEffect):
        store.consume_approval_and_reserve(
            request.request_id, action.action_hash, "refund:txn_1", action.action_id
        )
    assert store.get_approval(request.request_id).status is ApprovalStatus.GRANTED


def test_approval_refusal_wins(store: StoreOps, clock):
    action = make_action()
    request = granted_request(store, clock, action)
    store.consume_approval_and_reserve(request.request_id, action.action_hash, "k", "a1")
    store.begin_execution("k", "a1")
    store.commit_effect("k", "a1", None)
    with pytest.raises(ApprovalMismatch) as info:  # a replay on a committed key
        store.consume_approval_and_reserve(request.request_id, action.action_hash, "k", "a2")
    assert info.value.reason == "consumed"


def test_lapsed_executing_kept_write_does_not_consume(store: StoreOps, clock):
    action = make_action()
    executing(store)
    clock.advance(LEASE + TICK)
    request = granted_request(store, clock, action)
    with pytest.raises(AmbiguousEffect):
        store.consume_approval_and_reserve(request.request_id, action.action_hash, "k", "a2")
    assert store.get_effect("k").state is EffectState.AMBIGUOUS
    assert store.get_approval(request.request_id).status is ApprovalStatus.GRANTED


def test_pending_approvals_filter(store: StateStore, clock):
    first = put_request(store, clock, ttl=timedelta(minutes=1))
    clock.advance(seconds=1)
    second = put_request(store, clock, ttl=timedelta(minutes=10))
    clock.advance(seconds=1)
    answered = put_request(store, clock)
    store.grant_approval(answered.request_id, "cli:local")
    ids = [r.approval_id for r in store.pending_approvals()]
    assert ids == [first.request_id, second.request_id]
    assert [r.approval_id for r in store.pending_approvals(limit=1)] == [first.request_id]
    clock.set(first.expires_at + TICK)
    assert [r.approval_id for r in store.pending_approvals()] == [second.request_id]
    assert store.get_approval(first.request_id).status is ApprovalStatus.PENDING  # a read
    with pytest.raises(InvalidArgument):
        store.pending_approvals(limit=-1)


def test_approvals_for_and_finders(store: StoreOps, clock):
    action, other = make_action(), make_action(amount=1)
    denied = put_request(store, clock, action)
    store.deny_approval(denied.request_id, "cli:local")
    clock.advance(seconds=1)
    old = granted_request(store, clock, action)
    clock.advance(seconds=1)
    new = granted_request(store, clock, action)
    put_request(store, clock, other)
    found = store.approvals_for(action.action_hash)
    assert [r.approval_id for r in found] == [denied.request_id, old.request_id, new.request_id]
    assert store.find_granted_approval(action.action_hash).approval_id == new.request_id
    assert store.find_denied_request(action.action_hash).request_id == denied.request_id
    assert store.find_granted_approval(other.action_hash) is None
    assert store.find_denied_request(other.action_hash) is None
    store.consume_approval(new.request_id, action.action_hash)
    assert store.find_granted_approval(action.action_hash).approval_id == old.request_id
    clock.set(old.expires_at + TICK)
    assert store.find_granted_approval(action.action_hash) is None
    assert store.find_denied_request(action.action_hash) is None


def test_threshold_needs_distinct_verified_approvers(store: StateStore, clock):
    action = make_action()
    request = build_request(action, None, clock(), approvals_required=2)
    store.put_approval_request(request)

    def human(user: str) -> VerifiedApprover:
        return VerifiedApprover("ops", user, "https://idp", clock(), ("approver",))

    assert store.grant_approval(request.request_id, "web:alice", verified=human("alice")) is None
    assert store.grant_approval(request.request_id, "web:alice", verified=human("alice")) is None
    record = store.get_approval(request.request_id)
    assert record.status is ApprovalStatus.PENDING and len(record.approvers) == 1
    approval = store.grant_approval(request.request_id, "web:bob", verified=human("bob"))
    assert approval is not None and approval.approver == "web:bob"
    record = store.get_approval(request.request_id)
    assert [a.user for a in record.approvers] == ["alice", "bob"]


# --------------------------------------------------------------------------- evidence


def test_events_ids_and_round_trip(store: StoreOps):
    data = {"nested": {"a": [1, True, None, "☃"]}, "big": 10**25}
    first = store.append_event(make_event(EventType.ACTION_PROPOSED, **data))
    second = store.append_event(
        Event(EventType.APPROVAL_INVALIDATED, "2026-11-30T09:00:01.000Z", "act_2", "k", "apr_x",
              {"reason": "mismatch"}, event_id=999)
    )  # fmt: skip
    assert 0 < first.event_id < second.event_id != 999
    stored = store.events()
    assert stored == (first, second)
    assert stored[0].data == data and stored[1].effect_key == "k"
    assert stored[1].to_dict()["approval_id"] == "apr_x"


def test_receipts_chain(store: StoreOps):
    assert store.chain_head() == (0, GENESIS_HASH)
    placed = [store.put_receipt(make_receipt(n)) for n in range(3)]
    assert [r.seq for r in placed] == [1, 2, 3]
    assert placed[0].prev_hash == GENESIS_HASH and placed[1].prev_hash == placed[0].hash
    assert store.chain_head() == (3, placed[2].hash)
    back = store.receipts()
    assert [r.receipt_id for r in back] == [r.receipt_id for r in placed]
    assert [r.hash for r in back] == [r.hash for r in placed]
    assert back[1].to_json() == placed[1].to_json()
    assert verify_chain(store).ok


def test_duplicate_receipt_id_refused(store: StoreOps):
    receipt = make_receipt()
    store.put_receipt(receipt)
    head = store.chain_head()
    with pytest.raises(InvalidArgument, match=receipt.receipt_id):
        store.put_receipt(receipt)
    assert store.chain_head() == head and len(store.receipts()) == 1


# --------------------------------------------------------------------------- combined operations


def test_start_attempt_reserves_into_executing(store: StoreOps, clock):
    action = make_action()
    request = granted_request(store, clock, action)
    seen = []

    def build(approval, reservation):
        seen.append((approval, reservation))
        return [make_event(EventType.APPROVAL_CONSUMED), make_event(EventType.EFFECT_RESERVED)]

    approval, reservation, stored = store.start_attempt(
        action_id=action.action_id, effect_key="k", lease=LEASE,
        approval_id=request.request_id, action_hash=action.action_hash, events=build,
    )  # fmt: skip
    assert seen == [(approval, reservation)] and reservation.attempt == 1
    assert [e.type for e in stored] == [EventType.APPROVAL_CONSUMED, EventType.EFFECT_RESERVED]
    assert all(e.event_id for e in stored) and store.events() == stored
    assert store.get_effect("k").state is EffectState.EXECUTING
    assert store.get_approval(request.request_id).status is ApprovalStatus.CONSUMED


def test_allowed_start_and_finish_store_their_events_without_handing_them_back(store: StoreOps):
    """``return_events=False`` (a Control without sinks): the same rows are written, with ids,
    and ``()`` comes back; a taken key still plans from the stored record."""
    build = lambda approval, reservation: [  # noqa: E731
        make_event(EventType.ACTION_PROPOSED), make_event(EventType.EFFECT_RESERVED),
    ]  # fmt: skip
    approval, reservation, stored = store.start_attempt(
        action_id="a1", effect_key="k", lease=LEASE, events=build, return_events=False
    )
    assert (approval, stored) == (None, ()) and reservation.attempt == 1
    events, receipt = store.finish_attempt(
        effect_key="k", action_id="a1", outcome=EffectState.COMMITTED, result={"ok": True},
        events=[make_event(EventType.EXECUTION_COMMITTED)], receipt=make_receipt(),
        return_events=False,
    )  # fmt: skip
    assert events == () and receipt.seq == 1
    written = store.events()
    assert [e.type for e in written] == [
        EventType.ACTION_PROPOSED, EventType.EFFECT_RESERVED, EventType.EXECUTION_COMMITTED,
    ]  # fmt: skip
    assert len({e.event_id for e in written}) == 3 and all(e.event_id for e in written)
    assert store.get_effect("k").state is EffectState.COMMITTED and verify_chain(store).ok
    with pytest.raises(DuplicateEffect):
        store.start_attempt(
            action_id="a2", effect_key="k", lease=LEASE, events=build, return_events=False
        )
    assert len(store.events()) == 3


def test_start_attempt_without_key_or_approval(store: StateStore):
    approval, reservation, stored = store.start_attempt(
        action_id="a1", effect_key=None, lease=LEASE, approval_id=None, action_hash=None,
        events=lambda a, r: [make_event()],
    )  # fmt: skip
    assert (approval, reservation, len(stored)) == (None, None, 1)


def test_start_attempt_refusal_writes_nothing(store: StoreOps, clock):
    action = make_action()
    executing(store)
    request = granted_request(store, clock, action)
    events_before = store.events()
    with pytest.raises(DuplicateEffect):
        store.start_attempt(
            action_id="a2", effect_key="k", lease=LEASE, approval_id=request.request_id,
            action_hash=action.action_hash, events=lambda a, r: pytest.fail("not called"),
        )  # fmt: skip
    assert store.events() == events_before
    assert store.get_approval(request.request_id).status is ApprovalStatus.GRANTED
    assert store.get_effect("k").action_id == "a1"


def test_start_attempt_kept_writes_only(store: StoreOps, clock):
    action = make_action()
    executing(store)
    clock.advance(LEASE + TICK)
    with pytest.raises(AmbiguousEffect):
        store.start_attempt(action_id="a2", effect_key="k", lease=LEASE,
                            events=lambda a, r: [make_event()])  # fmt: skip
    assert store.get_effect("k").state is EffectState.AMBIGUOUS and store.events() == ()
    request = granted_request(store, clock, action)
    clock.set(request.expires_at + TICK)
    with pytest.raises(ApprovalMismatch) as info:
        store.start_attempt(
            action_id="a3", effect_key="fresh", lease=LEASE, approval_id=request.request_id,
            action_hash=action.action_hash, events=lambda a, r: [make_event()],
        )  # fmt: skip
    assert info.value.reason == "expired"
    assert store.get_approval(request.request_id).status is ApprovalStatus.EXPIRED
    assert store.get_effect("fresh") is None and store.events() == ()


def test_start_attempt_callback_failure_rolls_back(store: StateStore, clock):
    action = make_action()
    request = granted_request(store, clock, action)

    def explode(approval, reservation):
        raise RuntimeError("builder broke")

    with pytest.raises(RuntimeError):
        store.start_attempt(
            action_id="a1", effect_key="k", lease=LEASE, approval_id=request.request_id,
            action_hash=action.action_hash, events=explode,
        )  # fmt: skip
    assert store.get_effect("k") is None
    assert store.get_approval(request.request_id).status is ApprovalStatus.GRANTED


@pytest.mark.parametrize(
    "outcome", [EffectState.COMMITTED, EffectState.FAILED, EffectState.AMBIGUOUS]
)
def test_finish_attempt_writes_all(store: StoreOps, outcome):
    store.start_attempt(action_id="a1", effect_key="k", lease=LEASE)
    before = store.transactions
    stored, receipt = store.finish_attempt(
        effect_key="k", action_id="a1", outcome=outcome, result={"v": 1}, error="why",
        events=[make_event(EventType.EXECUTION_COMMITTED)], receipt=make_receipt(),
    )  # fmt: skip
    assert store.transactions == before + 1
    record = store.get_effect("k")
    assert record.state is outcome
    if outcome is EffectState.COMMITTED:
        assert (record.result, record.error) == ({"v": 1}, None)
    else:
        assert (record.result, record.error) == (None, "why")
    assert stored[0].event_id and receipt.seq == 1 and store.chain_head() == (1, receipt.hash)


def test_finish_attempt_refused_writes_nothing(store: StoreOps, clock):
    store.start_attempt(action_id="a1", effect_key="k", lease=LEASE)
    clock.advance(LEASE + TICK)
    with pytest.raises(AmbiguousEffect):
        store.reserve_effect("k", "a2")
    with pytest.raises(AmbiguousEffect):
        store.finish_attempt(
            effect_key="k", action_id="a1", outcome=EffectState.COMMITTED, result=1,
            events=[make_event()], receipt=make_receipt(),
        )  # fmt: skip
    assert store.events() == () and store.receipts() == ()
    assert store.chain_head() == (0, GENESIS_HASH)
    assert store.get_effect("k").error == LAPSED_LEASE_ERROR


def test_finish_attempt_bad_receipt_keeps_record_executing(store: StoreOps):
    taken = make_receipt()
    store.put_receipt(taken)
    store.start_attempt(action_id="a1", effect_key="k", lease=LEASE)
    with pytest.raises(InvalidArgument):
        store.finish_attempt(
            effect_key="k", action_id="a1", outcome=EffectState.COMMITTED,
            events=[make_event()], receipt=make_receipt(receipt_id=taken.receipt_id),
        )  # fmt: skip
    assert store.get_effect("k").state is EffectState.EXECUTING and store.events() == ()
    assert store.chain_head()[0] == 1


def test_finish_attempt_argument_checks(store: StateStore):
    with pytest.raises(InvalidArgument):
        store.finish_attempt(effect_key="k", action_id="a1", outcome=None)
    with pytest.raises(InvalidArgument):
        store.finish_attempt(effect_key=None, action_id="a1", outcome=EffectState.COMMITTED)
    store.start_attempt(action_id="a1", effect_key="k", lease=LEASE)
    with pytest.raises(InvalidArgument):
        store.finish_attempt(effect_key="k", action_id="a1", outcome=EffectState.RESERVED)
    stored, receipt = store.finish_attempt(
        effect_key=None, action_id="a1", outcome=None, receipt=make_receipt()
    )
    assert stored == () and receipt.seq == 1


def test_record_and_transaction_count(store: StoreOps):
    before = store.transactions
    stored, receipt = store.record(events=[make_event(), make_event()], receipt=make_receipt())
    assert [e.event_id for e in stored] == [e.event_id for e in store.events()]
    assert receipt.seq == 1 and store.transactions == before + 1
    store.start_attempt(action_id="a1", effect_key="k", lease=LEASE)
    store.finish_attempt(
        effect_key="k", action_id="a1", outcome="committed", receipt=make_receipt()
    )
    assert store.transactions == before + 3


# --------------------------------------------------------------------------- providers


def test_local_provider_polls_until_granted(store: StoreOps, clock):
    sleeps = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        clock.advance(seconds=seconds)
        if len(sleeps) == 3:
            store.grant_approval(request.request_id, "cli:local")

    provider = LocalApprovalProvider(store, clock=clock, sleep=sleep)
    request = provider.request(make_action(), timedelta(minutes=1), policy_hash="sha256:p")
    assert store.get_approval(request.request_id).request.policy_hash == "sha256:p"
    approval = provider.wait(request.request_id, None)
    assert approval.approval_id == request.request_id and sleeps == [0.5, 0.5, 0.5]
    assert store.events() == ()  # providers append no events


def test_local_provider_denied_expired_unknown(store: StateStore, clock):
    provider = LocalApprovalProvider(store, clock=clock, sleep=lambda s: clock.advance(seconds=s))
    denied = provider.request(make_action(), timedelta(minutes=1))
    store.deny_approval(denied.request_id, "cli:local")
    assert provider.wait(denied.request_id, None) is None
    lapsing = provider.request(make_action(), timedelta(seconds=2))
    with pytest.raises(ApprovalTimeout) as info:
        provider.wait(lapsing.request_id, None)
    assert info.value.request_id == lapsing.request_id
    assert store.get_approval(lapsing.request_id).status is ApprovalStatus.PENDING
    slow = provider.request(make_action(), timedelta(minutes=5))
    with pytest.raises(ApprovalTimeout):
        provider.wait(slow.request_id, timedelta(seconds=1))
    with pytest.raises(ApprovalMismatch) as unknown:
        provider.wait("apr_" + "2" * 32, None)
    assert unknown.value.reason == "unknown"


def test_scripted_provider(store: StateStore, clock):
    provider = ScriptedApprovalProvider(store, ["pending", "grant", "deny"], clock=clock)
    first = provider.request(make_action(), None)
    approval = provider.wait(first.request_id, None)
    assert approval.approver == "cli:scripted"
    second = provider.request(make_action(), None)
    assert provider.wait(second.request_id, None) is None
    assert store.get_approval(second.request_id).status is ApprovalStatus.DENIED
    third = provider.request(make_action(), None)
    with pytest.raises(ApprovalTimeout):
        provider.wait(third.request_id, None)
    with pytest.raises(InvalidArgument):
        ScriptedApprovalProvider(store, ["maybe"])


# --------------------------------------------------------------------------- threads


def test_threads_race_one_key_and_the_chain(store: StoreOps):
    assert isinstance(store, StateStore)
    barrier = threading.Barrier(8)
    outcomes: list[str] = []

    def run(worker: int) -> None:
        barrier.wait(timeout=30)
        try:
            store.reserve_effect("race", f"act_{worker}")
            outcomes.append("won")
        except DuplicateEffect as exc:
            outcomes.append(exc.state)
        for n in range(3):
            store.put_receipt(make_receipt(n))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(outcomes) == ["in_progress"] * 7 + ["won"]
    assert [r.seq for r in store.receipts()] == list(range(1, 25))
    assert verify_chain(store).ok


# --------------------------------------------------------------------------- more threads (C1–C5)


def _race(workers: int, task) -> list[object]:
    barrier = threading.Barrier(workers)
    outcomes: list[object] = []
    lock = threading.Lock()

    def run(worker: int) -> None:
        barrier.wait(timeout=30)
        try:
            outcome = task(worker)
        except Exception as exc:  # collected: the assertions say which were allowed
            outcome = exc
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(outcomes) == workers
    return outcomes


def test_threads_answer_a_request_once(store: StateStore, clock):
    request = put_request(store, clock)

    def answer(worker: int) -> str:
        if worker % 2:
            store.deny_approval(request.request_id, f"cli:w{worker}")
            return "denied"
        store.grant_approval(request.request_id, f"cli:w{worker}")
        return "granted"

    outcomes = _race(8, answer)
    winners = [o for o in outcomes if isinstance(o, str)]
    assert len(winners) == 1, outcomes
    losers = [o for o in outcomes if not isinstance(o, str)]
    assert all(isinstance(o, ApprovalMismatch) and o.reason == winners[0] for o in losers)
    record = store.get_approval(request.request_id)
    assert record.status.value == winners[0] and record.approver.startswith("cli:w")


def test_threads_consume_an_approval_once(store: StoreOps, clock):
    action = make_action()
    request = granted_request(store, clock, action)
    outcomes = _race(
        8,
        lambda w: store.consume_approval_and_reserve(
            request.request_id, action.action_hash, f"refund:txn_{w}", f"act_{w}"
        )[1].effect_key,
    )
    winners = [o for o in outcomes if isinstance(o, str)]
    assert len(winners) == 1, outcomes
    assert all(
        isinstance(o, ApprovalMismatch) and o.reason == "consumed"
        for o in outcomes if not isinstance(o, str)
    )  # fmt: skip
    assert [r.effect_key for r in store.list_effects()] == winners  # losers reserved nothing
    assert store.get_approval(request.request_id).status is ApprovalStatus.CONSUMED


def test_threads_renew_a_failed_key_once(store: StoreOps):
    executing(store)
    store.fail_effect("k", "a1", "remote said no")
    outcomes = _race(8, lambda w: store.reserve_effect("k", f"retry_{w}").attempt)
    assert sorted(str(o) if isinstance(o, int) else o.state for o in outcomes) == (
        ["2"] + ["in_progress"] * 7
    ), outcomes
    assert store.get_effect("k").attempt == 2


def test_threads_lapsed_executing_turns_ambiguous_once(store: StoreOps, clock):
    executing(store)
    clock.advance(LEASE + TICK)
    outcomes = _race(8, lambda w: store.reserve_effect("k", f"retry_{w}"))
    assert all(isinstance(o, AmbiguousEffect) and o.action_id == "a1" for o in outcomes)
    record = store.get_effect("k")
    assert (record.state, record.action_id, record.attempt) == (EffectState.AMBIGUOUS, "a1", 1)


def test_threads_events_get_unique_increasing_ids(store: StoreOps):
    outcomes = _race(8, lambda w: [store.append_event(make_event(n=w)).event_id for _ in range(5)])
    for ids in outcomes:
        assert ids == sorted(ids)  # one writer's appends are numbered in its order
    every = [i for ids in outcomes for i in ids]
    assert len(set(every)) == 40
    assert [e.event_id for e in store.events()] == sorted(every)


def test_attempt_numbers_never_repeat(store: StoreOps, clock):
    attempts = []
    for n in range(4):
        attempts.append(store.reserve_effect("k", f"a{n}", LEASE).attempt)
        if n % 2:
            clock.advance(LEASE + TICK)  # a lapsed reservation renews
        else:
            store.begin_execution("k", f"a{n}")
            store.fail_effect("k", f"a{n}", "no")
    assert attempts == [1, 2, 3, 4]


def test_stale_writer_is_refused(store: StoreOps):
    """C4: a conditional write that read an older version of the record changes nothing."""
    store.reserve_effect("k", "a1")
    stale = store.get_effect("k")
    store.begin_execution("k", "a1")
    moved = store._write(lambda tx, now: tx.update_effect(stale, replace(stale, action_id="zz")))
    assert moved is False
    assert store.get_effect("k").state is EffectState.EXECUTING
    request = put_request(store, store.clock)
    old = store.get_approval(request.request_id)
    store.deny_approval(request.request_id, "cli:local")
    assert store._write(lambda tx, now: tx.update_approval(old, old)) is False
    assert store.get_approval(request.request_id).status is ApprovalStatus.DENIED


# --------------------------------------------------------------------------- boundaries


def test_exactly_at_expiry_everything_still_valid(store: StoreOps, clock):
    action = make_action()
    pending = put_request(store, clock, action)
    granted = granted_request(store, clock, action)
    clock.set(granted.expires_at)
    assert [r.approval_id for r in store.pending_approvals()] == [pending.request_id]
    assert store.find_granted_approval(action.action_hash).approval_id == granted.request_id
    clock.advance(TICK)
    assert store.pending_approvals() == ()
    assert store.find_granted_approval(action.action_hash) is None


def test_renewal_after_resolved_failed_and_lapsed_reserved_keeps_created_at(store: StoreOps, clock):
    store.reserve_effect("k", "a1", LEASE)
    created = store.get_effect("k").created_at
    clock.advance(LEASE + TICK)
    store.reserve_effect("k", "a2", LEASE)
    store.mark_ambiguous("k", "a2", "lost reply")
    store.resolve_effect("k", "failed", "cli:local")
    clock.advance(seconds=1)
    reservation = store.reserve_effect("k", "a3", LEASE)
    record = store.get_effect("k")
    assert reservation.attempt == record.attempt == 3 and record.created_at == created
    assert (record.error, record.resolved_by, record.result) == (None, None, None)


def test_nul_is_refused_in_identifiers_and_escaped_in_errors(store: StoreOps, clock):
    """No backend keeps what another cannot: Postgres text holds no NUL, so none does."""
    with pytest.raises(InvalidArgument):
        store.reserve_effect("k\x00", "a1")
    with pytest.raises(InvalidArgument):
        store.reserve_effect("k", "a\x001")
    with pytest.raises(InvalidArgument):
        store.get_effect("k\x00")
    with pytest.raises(InvalidArgument):
        store.grant_approval("apr_\x00", "cli:local")
    with pytest.raises(InvalidArgument):
        store.begin_execution("k\x00", "a1")
    assert store.list_effects() == ()
    executing(store)
    store.fail_effect("k", "a1", "ValueError: a\x00b")
    assert store.get_effect("k").error == "ValueError: a\\x00b"
    blocked = replace(make_receipt(), effect_key="k\x00", result="blocked", error="a\x00b")
    placed = store.put_receipt(blocked)  # the document keeps it (JSON escapes NUL)
    (back,) = store.receipts()
    assert back.effect_key == "k\x00" and back.error == "a\x00b" and back.hash == placed.hash


# --------------------------------------------------------------------------- round trips


def test_effect_record_round_trips_every_field(store: StoreOps, clock):
    clock.set(datetime(2026, 11, 30, 9, 0, 0, 123457, tzinfo=timezone.utc))
    reservation = store.reserve_effect("refund:ünï/κ", "act_é", timedelta(seconds=1.5))
    record = store.get_effect("refund:ünï/κ")
    assert record.lease_expires_at == reservation.lease_expires_at == clock() + timedelta(
        seconds=1.5
    )
    store.begin_execution("refund:ünï/κ", "act_é")
    result = {"int": 7, "big": -(10**30), "float": 1.25, "bool": False, "none": None,
              "text": "☃\u2028", "list": [1, [2, {"k": True}]], "empty": {}}  # fmt: skip
    store.commit_effect("refund:ünï/κ", "act_é", result)
    back = store.get_effect("refund:ünï/κ")
    assert back.result == result
    assert type(back.result["int"]) is int and type(back.result["float"]) is float
    assert type(back.result["bool"]) is bool
    assert back.created_at == clock() and back.created_at.utcoffset() == timedelta(0)
    for scalar in ("a string", 12, True, [1, "x"]):
        key = f"scalar:{scalar!r}"
        executing(store, key)
        store.commit_effect(key, "a1", scalar)
        assert store.get_effect(key).result == scalar
        assert type(store.get_effect(key).result) is type(scalar)


def test_approval_record_round_trips_every_field(store: StateStore, clock):
    action = make_action()
    request = build_request(
        action, timedelta(minutes=7), clock(), policy_hash="sha256:" + "c" * 64,
        precondition_fingerprint="sha256:" + "d" * 64, required_roles=("ops", "fin"),
        approvals_required=2,
    )  # fmt: skip
    store.put_approval_request(request)
    alice = VerifiedApprover("ops", "alice", "https://idp", clock(), ("ops",))
    assert store.grant_approval(request.request_id, "web:alice", verified=alice) is None
    clock.advance(seconds=3)
    bob = VerifiedApprover("ops", "bob", None, clock(), ("fin", "ops"))
    store.grant_approval(request.request_id, "web:bob", verified=bob)
    clock.advance(seconds=1)
    store.consume_approval(request.request_id, action.action_hash)
    record = store.get_approval(request.request_id)
    assert record.request == request
    assert record.status is ApprovalStatus.CONSUMED and record.approver == "web:bob"
    assert record.granted_at == clock() - timedelta(seconds=1) and record.consumed_at == clock()
    assert record.approvers == (alice, bob)
    assert record.request.required_roles == ("ops", "fin")
    assert record.request.approvals_required == 2


def test_receipt_round_trips_every_field(store: StoreOps):
    full = Receipt(
        **{
            **{f: getattr(make_receipt(), f) for f in (
                "receipt_id", "action_id", "action", "action_hash", "environment", "decision",
                "decision_reason", "attempt", "started_at", "finished_at",
            )},
            "principal": {"agent": "a", "user": "u", "claims": {"roles": ["x"], "n": 1},
                          "issuer": "https://idp", "expires_at": "2027-01-01T00:00:00.000Z"},
            "resource": "db://main", "arguments": {"n": 10**20, "t": True, "s": "☃"},
            "approval_id": "apr_" + "e" * 32, "approver": "cli:local", "effect_key": "k:ü",
            "result": "ambiguous", "execution": "attempted", "would_have": None,
            "error": "TimeoutError: read timed out", "policy_hash": "sha256:" + "f" * 64,
        }
    )  # fmt: skip
    placed = store.put_receipt(full)
    (back,) = store.receipts()
    assert back == placed and back.hash == placed.hash and back.to_json() == placed.to_json()
    assert back.arguments["n"] == 10**20 and back.arguments["t"] is True
    # the chain holds; the receipt claims a spent approval that no grant act records
    report = verify_chain(store)
    assert [b.name for b in report.breaks] == ["approval_unrecorded"] and report.verified == 1


# --------------------------------------------------------------------------- reopen durability


def test_reopen_keeps_everything(durable_kind, tmp_path, clock):
    from .conftest import STORE_FACTORIES

    factory = STORE_FACTORIES[durable_kind]
    store = factory(tmp_path, clock)
    for key in ("amb", "done", "bad", "fixed"):
        executing(store, key)
    store.mark_ambiguous("amb", "a1", "TimeoutError")
    store.commit_effect("done", "a1", {"id": "re_1"})
    store.fail_effect("bad", "a1", "no")
    store.mark_ambiguous("fixed", "a1", "lost")
    store.resolve_effect("fixed", "committed", "cli:local")
    action = make_action()
    granted = granted_request(store, clock, action)
    event = store.append_event(make_event(x=1))
    receipt = store.put_receipt(make_receipt())
    before = {r.effect_key: r for r in store.list_effects()}
    store.close()

    again = factory(tmp_path, clock)
    try:
        assert {r.effect_key: r for r in again.list_effects()} == before
        assert again.get_effect("fixed").resolved_by == "cli:local"
        assert again.get_effect("amb").state is EffectState.AMBIGUOUS
        assert again.get_approval(granted.request_id).status is ApprovalStatus.GRANTED
        assert again.events() == (event,)
        assert again.chain_head() == (1, receipt.hash)
        with pytest.raises(AmbiguousEffect):
            again.reserve_effect("amb", "a2")
        with pytest.raises(DuplicateEffect):
            again.reserve_effect("fixed", "a2")
        assert again.reserve_effect("bad", "a2").attempt == 2
        assert again.put_receipt(make_receipt()).seq == 2
    finally:
        again.close()
