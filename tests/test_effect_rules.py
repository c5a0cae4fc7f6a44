"""The pure rules: reservation table, transition refusals, approval checks, a property test."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctrlrun.action import Action, Principal
from ctrlrun.approvals.records import (
    ApprovalRecord,
    ApprovalRequest,
    ApprovalStatus,
    ExpireThenRefuse,
    build_request,
    check_answerable,
    check_consumable,
)
from ctrlrun.effects.records import (
    DEFAULT_LEASE,
    LAPSED_LEASE_ERROR,
    EffectRecord,
    EffectState,
    check_begin,
    check_commit,
    check_line_text,
    check_mark_ambiguous,
    idempotency_token_for,
    lease_is_live,
    plan_reservation,
    storable_result,
    storable_text,
)
from ctrlrun.errors import (
    ActionDenied,
    AmbiguousEffect,
    ApprovalMismatch,
    CTRLRunError,
    DuplicateEffect,
    InvalidArgument,
)
from ctrlrun.store import InMemoryStateStore

from .conftest import FakeClock

NOW = datetime(2026, 11, 30, 9, 0, tzinfo=timezone.utc)
LEASE = timedelta(minutes=5)
TICK = timedelta(microseconds=1)


def record(state: EffectState, *, lease: datetime | None = None, action_id: str = "a1", attempt=1):
    return EffectRecord(
        "k", state, action_id, attempt, NOW - timedelta(hours=1), NOW - timedelta(minutes=1),
        lease, result={"r": 1}, error="old", resolved_by="cli:local",
    )  # fmt: skip


LIVE, LAPSED = NOW + TICK, NOW - TICK


# --------------------------------------------------------------------------- reservation table


def test_plan_insert():
    plan = plan_reservation(None, "k", "a1", LEASE, NOW)
    assert plan.kind == "insert" and plan.expected is None
    assert plan.write == EffectRecord("k", EffectState.RESERVED, "a1", 1, NOW, NOW, NOW + LEASE)
    assert plan.reservation.attempt == 1


@pytest.mark.parametrize(
    "existing",
    [record(EffectState.FAILED), record(EffectState.RESERVED, lease=LAPSED, attempt=3)],
)
def test_plan_renew(existing):
    plan = plan_reservation(existing, "k", "a2", LEASE, NOW)
    assert plan.kind == "renew" and plan.expected == existing
    write = plan.write
    assert (write.state, write.action_id, write.attempt) == (
        EffectState.RESERVED, "a2", existing.attempt + 1,
    )  # fmt: skip
    assert (write.result, write.error, write.resolved_by) == (None, None, None)
    assert write.created_at == existing.created_at and write.updated_at == NOW
    assert write.lease_expires_at == NOW + LEASE


def test_plan_into_executing():
    plan = plan_reservation(None, "k", "a1", LEASE, NOW, state=EffectState.EXECUTING)
    assert plan.write.state is EffectState.EXECUTING
    with pytest.raises(InvalidArgument):
        plan_reservation(None, "k", "a1", LEASE, NOW, state=EffectState.COMMITTED)


@pytest.mark.parametrize(
    "existing, error, detail",
    [
        (record(EffectState.COMMITTED), DuplicateEffect, "committed"),
        (record(EffectState.RESERVED, lease=LIVE), DuplicateEffect, "in_progress"),
        (record(EffectState.RESERVED, lease=NOW), DuplicateEffect, "in_progress"),
        (record(EffectState.EXECUTING, lease=LIVE), DuplicateEffect, "in_progress"),
        (record(EffectState.RESERVED, lease=LIVE, action_id="me"), DuplicateEffect, "in_progress"),
        (record(EffectState.AMBIGUOUS), AmbiguousEffect, "a1"),
    ],
)
def test_plan_refuse(existing, error, detail):
    plan = plan_reservation(existing, "k", "me", LEASE, NOW)
    assert plan.kind == "refuse" and isinstance(plan.error, error)
    field = "state" if error is DuplicateEffect else "action_id"
    assert getattr(plan.error, field) == detail
    with pytest.raises(InvalidArgument):
        plan.reservation


def test_plan_lapsed_executing_is_kept_write():
    existing = record(EffectState.EXECUTING, lease=LAPSED)
    plan = plan_reservation(existing, "k", "a2", LEASE, NOW)
    assert plan.kind == "keep_then_refuse" and plan.expected == existing
    assert (plan.write.state, plan.write.error, plan.write.lease_expires_at) == (
        EffectState.AMBIGUOUS, LAPSED_LEASE_ERROR, None,
    )  # fmt: skip
    assert plan.write.action_id == "a1" and plan.error.action_id == "a1"


def test_lease_is_live_boundary():
    assert lease_is_live(record(EffectState.RESERVED, lease=NOW), NOW)
    assert not lease_is_live(record(EffectState.RESERVED, lease=NOW), NOW + TICK)
    assert not lease_is_live(record(EffectState.FAILED, lease=LIVE), NOW)
    assert not lease_is_live(None, NOW)
    assert DEFAULT_LEASE == timedelta(minutes=5)


# --------------------------------------------------------------------------- transitions


@pytest.mark.parametrize(
    "existing, error",
    [
        (None, InvalidArgument),
        (record(EffectState.AMBIGUOUS), AmbiguousEffect),
        (record(EffectState.COMMITTED), DuplicateEffect),
        (record(EffectState.RESERVED, lease=LIVE, action_id="other"), DuplicateEffect),
        (record(EffectState.RESERVED, lease=LAPSED, action_id="other"), InvalidArgument),
        (record(EffectState.FAILED), InvalidArgument),
        (record(EffectState.EXECUTING, lease=LIVE), InvalidArgument),
    ],
)
def test_begin_refusals(existing, error):
    with pytest.raises(error):
        check_begin(existing, "k", "a1", NOW)


def test_holder_transition_ignores_its_own_lapsed_lease():
    begun = check_begin(record(EffectState.RESERVED, lease=LAPSED), "k", "a1", NOW)
    assert begun.state is EffectState.EXECUTING and begun.lease_expires_at == LAPSED
    done = check_commit(begun, "k", "a1", [1], NOW)
    assert (done.state, done.result, done.lease_expires_at) == (EffectState.COMMITTED, [1], None)


def test_mark_ambiguous_accepts_reserved_executing_ambiguous():
    for state in (EffectState.RESERVED, EffectState.EXECUTING, EffectState.AMBIGUOUS):
        out = check_mark_ambiguous(record(state, lease=LIVE), "k", "a1", "boom", NOW)
        assert (out.state, out.error) == (EffectState.AMBIGUOUS, "boom")
    with pytest.raises(AmbiguousEffect):
        check_mark_ambiguous(record(EffectState.AMBIGUOUS, action_id="x"), "k", "a1", "e", NOW)


# --------------------------------------------------------------------------- small helpers


def test_idempotency_token_vectors():
    assert idempotency_token_for("refund:txn_1", 1) == "382ee448-97da-8107-b674-8c253650d93f"
    assert idempotency_token_for("refund:txn_1", 2) == "28bb40af-814c-8fb6-ba63-e8663b1c036d"


@pytest.mark.parametrize("key, attempt", [("", 1), (None, 1), ("k", 0), ("k", True), ("k", 1.0)])
def test_idempotency_token_refuses(key, attempt):
    with pytest.raises(InvalidArgument):
        idempotency_token_for(key, attempt)


@given(st.text(min_size=1), st.integers(min_value=1, max_value=10**6))
def test_idempotency_token_shape(key, attempt):
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        return
    token = idempotency_token_for(key, attempt)
    assert token == token.lower() and token[14] == "8" and token[19] in "89ab"
    assert token != idempotency_token_for(key, attempt + 1)


def test_storable_text_and_result():
    assert storable_text("a\udc80b") == "a\\udc80b"
    assert storable_text("plain ☃") == "plain ☃"
    assert storable_result((1, [2])) == [1, [2]]
    assert storable_result(float("nan")) == "nan"
    assert storable_result({1, 2}) in ("{1, 2}", "{2, 1}")

    class Broken:
        def __repr__(self):
            raise RuntimeError("no")

    assert storable_result(Broken()) == "<unrepresentable Broken>"


@pytest.mark.parametrize("good", ["cli:local", "reconcile:stripe.refund", "ünï ☃ code"])
def test_line_text_accepts(good):
    assert check_line_text(good, "resolver") == good


@pytest.mark.parametrize("bad", ["", "a\nb", "a\r", "\x1b[31m", "a\u200eb", "a\u2028", "\ud800"])
def test_line_text_refuses(bad):
    with pytest.raises(InvalidArgument):
        check_line_text(bad, "approver")


# --------------------------------------------------------------------------- approval rules


def _action(**arguments) -> Action:
    return Action("db.drop", arguments or {"table": "t"}, Principal("agent"))


def _record(status: ApprovalStatus, action: Action | None = None) -> ApprovalRecord:
    request = build_request(action or _action(), timedelta(minutes=1), NOW)
    granted_at = NOW if status in (ApprovalStatus.GRANTED, ApprovalStatus.CONSUMED) else None
    return ApprovalRecord(request, status, "cli:local", granted_at)


def test_check_answerable():
    pending = _record(ApprovalStatus.PENDING)
    assert check_answerable(pending, pending.approval_id, pending.expires_at) is None
    kept = check_answerable(pending, pending.approval_id, pending.expires_at + TICK)
    assert isinstance(kept, ExpireThenRefuse) and kept.error.reason == "expired"
    assert kept.write.status is ApprovalStatus.EXPIRED and kept.expected == pending
    with pytest.raises(ApprovalMismatch, match="unknown"):
        check_answerable(None, "apr_x", NOW)
    for status in ("granted", "denied", "expired", "consumed"):
        with pytest.raises(ApprovalMismatch) as info:
            check_answerable(_record(ApprovalStatus(status)), "apr_x", NOW)
        assert info.value.reason == status


def test_check_consumable_order():
    action = _action()
    granted = _record(ApprovalStatus.GRANTED, action)
    assert check_consumable(granted, "apr", action.action_hash, granted.expires_at) is None
    with pytest.raises(ApprovalMismatch) as info:
        check_consumable(_record(ApprovalStatus.DENIED, action), "apr", "sha256:other", NOW)
    assert info.value.reason == "mismatch"
    with pytest.raises(ActionDenied):
        check_consumable(_record(ApprovalStatus.DENIED, action), "apr", action.action_hash, NOW)
    for status in ("pending", "consumed", "expired"):
        with pytest.raises(ApprovalMismatch) as refused:
            check_consumable(
                _record(ApprovalStatus(status), action), "apr", action.action_hash, NOW
            )
        assert refused.value.reason == status
    late = granted.expires_at + TICK
    assert check_consumable(granted, "apr", action.action_hash, late).error.reason == "expired"


def test_request_validation():
    action = _action()
    good = dict(request_id="apr_1", action_hash=action.action_hash, action=action,
                created_at=NOW, expires_at=NOW + LEASE)  # fmt: skip
    ApprovalRequest(**good)
    for change in (
        {"request_id": ""}, {"action_hash": ""}, {"created_at": NOW.replace(tzinfo=None)},
        {"expires_at": NOW}, {"expires_at": NOW - TICK}, {"approvals_required": 0},
        {"approvals_required": True}, {"approvals_required": 1.0}, {"required_roles": "ops"},
    ):  # fmt: skip
        with pytest.raises(InvalidArgument):
            ApprovalRequest(**{**good, **change})
    for ttl in (timedelta(0), -LEASE, 60):
        with pytest.raises(InvalidArgument):
            build_request(action, ttl, NOW)
    request = build_request(action, None, NOW)
    assert request.expires_at == NOW + timedelta(minutes=15)
    assert request.request_id.startswith("apr_") and len(request.request_id) == 36
    with pytest.raises(InvalidArgument):
        ApprovalRecord(request).as_approval()


# --------------------------------------------------------------------------- property


ACTORS = ["a", "b", "c"]
operations = st.lists(
    st.one_of(
        st.tuples(st.just("reserve"), st.sampled_from(ACTORS)),
        st.tuples(st.just("begin"), st.sampled_from(ACTORS)),
        st.tuples(st.just("commit"), st.sampled_from(ACTORS)),
        st.tuples(st.just("fail"), st.sampled_from(ACTORS)),
        st.tuples(st.just("ambiguous"), st.sampled_from(ACTORS)),
        st.tuples(st.just("resolve"), st.sampled_from(["committed", "failed"])),
        st.tuples(st.just("advance"), st.sampled_from([1, 299, 300, 301, 600])),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations)
def test_random_sequences_keep_the_invariants(ops):
    clock = FakeClock(NOW)
    store = InMemoryStateStore(clock=clock)
    granted: set[int] = set()
    state = None
    for op, arg in ops:
        if op == "advance":
            clock.advance(seconds=arg)
            continue
        try:
            if op == "reserve":
                reservation = store.reserve_effect("k", arg, LEASE)
                assert reservation.attempt not in granted  # never two reservations per attempt
                granted.add(reservation.attempt)
                assert store.get_effect("k").attempt == reservation.attempt
            elif op == "begin":
                store.begin_execution("k", arg)
            elif op == "commit":
                store.commit_effect("k", arg, {"by": arg})
            elif op == "fail":
                store.fail_effect("k", arg, "nope")
            elif op == "ambiguous":
                store.mark_ambiguous("k", arg, "lost reply")
            else:
                store.resolve_effect("k", arg, "cli:local")
        except (DuplicateEffect, AmbiguousEffect, InvalidArgument):
            pass
        except CTRLRunError as exc:  # pragma: no cover - any other refusal is a bug
            raise AssertionError(f"unexpected refusal {exc!r}") from exc
        current = store.get_effect("k")
        new_state = current.state if current else None
        if new_state is EffectState.FAILED and state is not EffectState.FAILED:
            assert op == "fail" or (op == "resolve" and arg == "failed")
        if state is EffectState.COMMITTED:
            assert new_state is EffectState.COMMITTED  # terminal
        if state is EffectState.AMBIGUOUS and new_state is not EffectState.AMBIGUOUS:
            assert op == "resolve"
        state = new_state
