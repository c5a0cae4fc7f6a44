"""The budget ledger, on every store (memory, SQLite, Postgres) through the shared ``store``
fixture: charges taken with the reservation or not at all, the rolling window on the store's
clock, released on every move to ``failed``, held otherwise.
"""

from __future__ import annotations

from typing import Any

import pytest

from ctrlrun.authority.ledger import Charge
from ctrlrun.effects.records import LAPSED_LEASE_ERROR, EffectState
from ctrlrun.errors import (
    AmbiguousEffect,
    BudgetExhausted,
    DuplicateEffect,
    InvalidArgument,
)
from ctrlrun.evidence.receipt import EventType
from ctrlrun.store.ops import StoreOps

from .test_store_conformance import LEASE, TICK, granted_request, make_event, make_receipt

DAY = 86400


def budget(amount: int, limit: int = 100, window: int = DAY, grant: str = "g",
           metric: str = "amount") -> Charge:  # fmt: skip
    return Charge(grant, metric, amount, limit, window)


def held(store: StoreOps, grant: str = "g", metric: str = "amount") -> int:
    """What the grant's budget holds now: its un-released rows' amounts."""
    rows = store.consumptions(grant_id=grant, metric=metric)
    return sum(c.amount for c in rows if c.released_at is None)


def started(store: StoreOps, key: str, action_id: str, *charges: Charge, approval=None):
    """``start_attempt`` as the Control runs it (events, and the approval when one is given)."""
    return store.start_attempt(
        action_id=action_id, effect_key=key, lease=LEASE,
        approval_id=approval.request_id if approval else None,
        action_hash=approval.action.action_hash if approval else None,
        events=lambda a, r: [make_event(EventType.EXECUTION_STARTED)], charges=charges,
    )  # fmt: skip


def finish(store: StoreOps, key: str, action_id: str, outcome: EffectState, **kwargs):
    return store.finish_attempt(effect_key=key, action_id=action_id, outcome=outcome, **kwargs)


# --------------------------------------------------------------------------- the limit


def test_charges_pass_up_to_the_limit_exactly(store: StoreOps, clock):
    store.reserve_effect("k1", "a1", LEASE, charges=[budget(60)])
    store.reserve_effect("k2", "a2", LEASE, charges=[budget(40)])  # 60 + 40 <= 100
    with pytest.raises(BudgetExhausted) as refused:
        store.reserve_effect("k3", "a3", LEASE, charges=[budget(1)])
    error = refused.value
    assert (error.grant_id, error.metric, error.window, error.action_id) == ("g", "amount", DAY, "a3")
    assert error.reason == "budget_exhausted"
    assert "100" not in str(error) and "0 left" not in str(error)  # never the amount left
    rows = store.consumptions()
    assert [(c.id, c.grant_id, c.metric, c.amount, c.effect_key, c.attempt) for c in rows] == [
        (rows[0].id, "g", "amount", 60, "k1", 1), (rows[1].id, "g", "amount", 40, "k2", 1),
    ]  # fmt: skip
    assert rows[0].id < rows[1].id
    assert all(c.consumed_at == clock() and c.released_at is None for c in rows)


def test_limit_zero_admits_only_zero_amounts(store: StoreOps):
    store.reserve_effect("k1", "a1", LEASE, charges=[budget(0, limit=0)])
    store.reserve_effect("k2", "a2", LEASE, charges=[budget(0, limit=0)])
    with pytest.raises(BudgetExhausted):
        store.reserve_effect("k3", "a3", LEASE, charges=[budget(1, limit=0)])
    assert [c.amount for c in store.consumptions()] == [0, 0]
    assert store.get_effect("k3") is None


def test_every_charge_must_fit_and_the_first_that_does_not_is_named(store: StoreOps):
    store.reserve_effect("k1", "a1", LEASE, charges=[budget(5, grant="child", limit=10)])
    charges = [budget(5, grant="child", limit=10), budget(5, grant="root", limit=8),
               budget(1, grant="child", metric="count", limit=1)]  # fmt: skip
    store.reserve_effect("k2", "a2", LEASE, charges=charges)
    with pytest.raises(BudgetExhausted) as refused:
        store.reserve_effect("k3", "a3", LEASE, charges=charges)
    assert (refused.value.grant_id, refused.value.metric) == ("child", "amount")
    with pytest.raises(BudgetExhausted) as refused:
        store.reserve_effect("k3", "a3", LEASE, charges=[budget(5, grant="root", limit=8)])
    assert refused.value.grant_id == "root"
    rows = store.consumptions(effect_key="k2")
    assert [(c.grant_id, c.metric) for c in rows] == [
        ("child", "amount"), ("root", "amount"), ("child", "count")
    ]  # charge order


def test_two_budgets_on_one_metric_write_one_row_and_both_must_fit(store: StoreOps):
    hourly, daily = budget(5, limit=20, window=3600), budget(5, limit=12, window=DAY)
    store.reserve_effect("k1", "a1", LEASE, charges=[hourly, daily])
    assert [(c.amount, c.effect_key) for c in store.consumptions()] == [(5, "k1")]
    store.reserve_effect("k2", "a2", LEASE, charges=[hourly, daily])
    with pytest.raises(BudgetExhausted) as refused:  # the daily one: 10 + 5 > 12
        store.reserve_effect("k3", "a3", LEASE, charges=[hourly, daily])
    assert refused.value.window == DAY
    assert len(store.consumptions()) == 2


def test_budgets_are_per_grant_and_metric(store: StoreOps):
    store.reserve_effect("k1", "a1", LEASE, charges=[budget(100)])
    store.reserve_effect("k2", "a2", LEASE, charges=[budget(100, grant="other")])
    store.reserve_effect("k3", "a3", LEASE, charges=[budget(100, metric="count")])
    assert len(store.consumptions()) == 3


# --------------------------------------------------------------------------- the rolling window


def test_the_window_rolls_on_the_store_clock(store: StoreOps, clock):
    store.reserve_effect("k1", "a1", LEASE, charges=[budget(100, window=3600)])
    charged_at = clock()
    clock.advance(seconds=3600)  # consumed_at >= now - window: still inside
    with pytest.raises(BudgetExhausted):
        store.reserve_effect("k2", "a2", LEASE, charges=[budget(1, window=3600)])
    clock.advance(TICK)
    store.reserve_effect("k2", "a2", LEASE, charges=[budget(100, window=3600)])
    # a longer window over the same rows still sees both
    with pytest.raises(BudgetExhausted):
        store.reserve_effect("k3", "a3", LEASE, charges=[budget(1, limit=200, window=DAY)])
    assert [c.consumed_at for c in store.consumptions()] == [charged_at, clock()]
    assert [c.effect_key for c in store.consumptions(since=clock())] == ["k2"]
    assert [c.effect_key for c in store.consumptions(since=charged_at)] == ["k1", "k2"]


# --------------------------------------------------------------------------- refusals


def test_a_refused_charge_writes_nothing(store: StoreOps, clock):
    store.reserve_effect("k1", "a1", LEASE, charges=[budget(100)])
    events, transactions = store.events(), store.transactions
    with pytest.raises(BudgetExhausted):
        store.reserve_effect("k2", "a2", LEASE, charges=[budget(1)])
    with pytest.raises(BudgetExhausted) as refused:
        started(store, "k3", "a3", budget(1))
    assert refused.value.action_id == "a3"
    assert store.get_effect("k2") is None and store.get_effect("k3") is None
    assert len(store.consumptions()) == 1 and store.events() == events
    assert store.transactions == transactions + 2  # each tried, and rolled back


def test_a_refused_charge_leaves_the_presented_approval_granted(store: StoreOps, clock):
    store.reserve_effect("k1", "a1", LEASE, charges=[budget(100)])
    request = granted_request(store, clock)
    with pytest.raises(BudgetExhausted):
        store.consume_approval_and_reserve(
            request.request_id, request.action.action_hash, "k2", "a2", LEASE,
            charges=[budget(1)],
        )  # fmt: skip
    with pytest.raises(BudgetExhausted):
        started(store, "k3", "a3", budget(1), approval=request)
    assert store.get_approval(request.request_id).status.value == "granted"
    assert store.get_effect("k2") is None and store.get_effect("k3") is None
    # within budget, the same approval is consumed with its reservation and its charge
    approval, reservation, _ = started(store, "k3", "a3", budget(0), approval=request)
    assert approval.approval_id == request.request_id and reservation.attempt == 1
    assert store.get_approval(request.request_id).status.value == "consumed"
    assert [c.effect_key for c in store.consumptions()] == ["k1", "k3"]


def test_consume_approval_and_reserve_charges_with_the_reservation(store: StoreOps, clock):
    request = granted_request(store, clock)
    approval, reservation = store.consume_approval_and_reserve(
        request.request_id, request.action.action_hash, "k1", "a1", LEASE, charges=[budget(7)]
    )
    assert reservation.attempt == 1
    assert [(c.effect_key, c.attempt, c.amount) for c in store.consumptions()] == [("k1", 1, 7)]


@pytest.mark.parametrize("outcome", ["committed", "in_progress", "ambiguous", "lapsed"])
def test_a_refused_reservation_checks_no_charge(store: StoreOps, clock, outcome):
    store.reserve_effect("k", "a1", LEASE)
    if outcome == "committed":
        store.begin_execution("k", "a1")
        store.commit_effect("k", "a1", None)
    elif outcome == "ambiguous":
        store.begin_execution("k", "a1")
        store.mark_ambiguous("k", "a1", "timeout")
    elif outcome == "lapsed":  # executing past its lease: kept write, then refused
        store.begin_execution("k", "a1")
        clock.advance(LEASE + TICK)
    exhausted = budget(1, limit=0)  # would refuse, if it were checked
    expected = AmbiguousEffect if outcome in ("ambiguous", "lapsed") else DuplicateEffect
    with pytest.raises(expected):
        store.reserve_effect("k", "a2", LEASE, charges=[exhausted])
    with pytest.raises(expected):
        started(store, "k", "a3", exhausted)
    if outcome == "lapsed":
        record = store.get_effect("k")
        assert record.state is EffectState.AMBIGUOUS and record.error == LAPSED_LEASE_ERROR
    assert store.consumptions() == ()


# --------------------------------------------------------------------------- held and released


def _charged(store: StoreOps, key: str = "k", action_id: str = "a1", amount: int = 60) -> None:
    started(store, key, action_id, budget(amount))
    assert held(store) == amount


@pytest.mark.parametrize(
    "how", ["receipt and events", "receipt", "events", "nothing", "fail_effect"]
)
def test_the_charge_is_released_when_the_attempt_fails(store: StoreOps, clock, how):
    _charged(store)
    clock.advance(seconds=1)
    if how == "fail_effect":
        store.fail_effect("k", "a1", "remote said no")
    else:
        # with a receipt and events Postgres sends the finish as one statement (the release in
        # it); the other ways take the compare-and-set and the release one after the other
        receipt = make_receipt(1) if "receipt" in how else None
        events = [make_event(EventType.EXECUTION_FAILED)] if "events" in how else []
        finish(store, "k", "a1", EffectState.FAILED, error="no", events=events, receipt=receipt)
    assert store.get_effect("k").state is EffectState.FAILED
    (row,) = store.consumptions()
    assert row.released_at == clock() and row.consumed_at < clock()
    assert held(store) == 0
    store.reserve_effect("k2", "a2", LEASE, charges=[budget(100)])  # the room is back


def test_a_committed_charge_is_held_for_good(store: StoreOps, clock):
    _charged(store)
    finish(store, "k", "a1", EffectState.COMMITTED, result={"ok": 1}, receipt=make_receipt(1),
           events=[make_event(EventType.EXECUTION_COMMITTED)])  # fmt: skip
    clock.advance(seconds=5)
    assert held(store) == 60
    with pytest.raises(BudgetExhausted):
        store.reserve_effect("k2", "a2", LEASE, charges=[budget(41)])


@pytest.mark.parametrize("how", ["finish", "mark_ambiguous", "lapsed"])
def test_an_ambiguous_charge_is_held_until_resolved_failed(store: StoreOps, clock, how):
    _charged(store)
    if how == "finish":
        finish(store, "k", "a1", EffectState.AMBIGUOUS, error="timeout", receipt=make_receipt(1))
    elif how == "mark_ambiguous":
        store.mark_ambiguous("k", "a1", "timeout")
    else:
        clock.advance(LEASE + TICK)
        with pytest.raises(AmbiguousEffect):
            store.reserve_effect("k", "a2", LEASE)
    assert store.get_effect("k").state is EffectState.AMBIGUOUS and held(store) == 60
    clock.advance(seconds=1)
    store.resolve_effect("k", "failed", "cli:local")
    assert held(store) == 0 and store.consumptions()[0].released_at == clock()


def test_an_ambiguous_charge_resolved_committed_stays_held(store: StoreOps):
    _charged(store)
    store.mark_ambiguous("k", "a1", "timeout")
    store.resolve_effect("k", "committed", "cli:local")
    assert held(store) == 60 and store.consumptions()[0].released_at is None


def test_renewed_after_failed_is_a_new_charge(store: StoreOps, clock):
    _charged(store)
    finish(store, "k", "a1", EffectState.FAILED, error="no")
    clock.advance(seconds=1)
    _, reservation, _ = started(store, "k", "a2", budget(50))
    assert reservation.attempt == 2
    rows = store.consumptions(effect_key="k")
    assert [(c.attempt, c.amount, c.released_at is None) for c in rows] == [
        (1, 60, False), (2, 50, True)
    ]
    finish(store, "k", "a2", EffectState.FAILED, error="no again")
    assert held(store) == 0


def test_a_lapsed_reservation_renewed_releases_the_earlier_charge(store: StoreOps, clock):
    store.reserve_effect("k", "a1", LEASE, charges=[budget(60)])
    clock.advance(LEASE + TICK)  # reserved, lapsed: its function never ran
    reservation = store.reserve_effect("k", "a2", LEASE, charges=[budget(60)])
    assert reservation.attempt == 2
    rows = store.consumptions(effect_key="k")
    assert [(c.attempt, c.released_at) for c in rows] == [(1, clock()), (2, None)]
    assert held(store) == 60


def test_a_renewal_refused_by_its_charge_keeps_the_lapsed_record_and_its_charge(store, clock):
    store.reserve_effect("k", "a1", LEASE, charges=[budget(60)])
    store.reserve_effect("other", "a0", LEASE, charges=[budget(40)])
    clock.advance(LEASE + TICK)
    with pytest.raises(BudgetExhausted):  # 40 held elsewhere + 61 > 100, once 60 is released
        store.reserve_effect("k", "a2", LEASE, charges=[budget(61)])
    record = store.get_effect("k")
    assert (record.state, record.attempt, record.action_id) == (EffectState.RESERVED, 1, "a1")
    assert held(store) == 100 and len(store.consumptions()) == 2


def test_a_released_charge_is_released_once(store: StoreOps, clock):
    _charged(store)
    finish(store, "k", "a1", EffectState.FAILED, error="no")
    released = store.consumptions()[0].released_at
    clock.advance(seconds=1)
    _charged(store, action_id="a2", amount=10)
    clock.advance(seconds=1)
    finish(store, "k", "a2", EffectState.FAILED, error="no")
    rows = store.consumptions()
    assert [c.released_at for c in rows] == [released, clock()]


def test_the_allowed_call_without_charges_writes_no_ledger_row(store: StoreOps):
    started(store, "k", "a1")
    finish(store, "k", "a1", EffectState.COMMITTED, result=1, receipt=make_receipt(1))
    started(store, "k2", "a2")
    finish(store, "k2", "a2", EffectState.FAILED, error="no", receipt=make_receipt(2))
    assert store.consumptions() == ()


# --------------------------------------------------------------------------- reads and checks


def test_consumptions_filter_by_every_field_in_insertion_order(store: StoreOps, clock):
    store.reserve_effect("k1", "a1", LEASE, charges=[budget(1), budget(2, grant="h")])
    clock.advance(seconds=10)
    store.reserve_effect("k2", "a2", LEASE, charges=[budget(3), budget(4, metric="count")])
    amounts = lambda **filters: [c.amount for c in store.consumptions(**filters)]  # noqa: E731
    assert amounts() == [1, 2, 3, 4]
    assert amounts(grant_id="g") == [1, 3, 4] and amounts(grant_id="h") == [2]
    assert amounts(metric="count") == [4] and amounts(grant_id="g", metric="amount") == [1, 3]
    assert amounts(effect_key="k1") == [1, 2] and amounts(since=clock()) == [3, 4]
    assert amounts(grant_id="nobody") == []


@pytest.mark.parametrize(
    "charges",
    [
        [budget(True)], [budget(-1)], [budget(1, limit=-1)], [budget(1, window=0)],
        [budget(1, limit=1.5)], [budget(2**63)], [budget(1, grant="")], [budget(1, metric="a\x00")],
        [("g", "amount", 1, 10, 60)], "g", [budget(1, window=True)],
    ],
)  # fmt: skip
def test_bad_charges_are_refused_before_anything_is_written(store: StoreOps, charges):
    with pytest.raises(InvalidArgument):
        store.reserve_effect("k", "a1", LEASE, charges=charges)
    with pytest.raises(InvalidArgument):
        store.start_attempt(
            action_id="a1", effect_key="k", charges=charges,
            events=lambda a, r: [make_event(EventType.EXECUTION_STARTED)],
        )  # fmt: skip
    assert store.get_effect("k") is None and store.consumptions() == ()


def test_charges_need_an_effect_key(store: StoreOps):
    with pytest.raises(InvalidArgument, match="effect key"):
        store.start_attempt(action_id="a1", effect_key=None, charges=[budget(1)])
    assert store.events() == () and store.consumptions() == ()


def test_consumptions_refuse_bad_filters(store: StoreOps):
    with pytest.raises(InvalidArgument):
        store.consumptions(grant_id="")
    with pytest.raises(InvalidArgument):
        store.consumptions(since="2026-01-01")  # type: ignore[arg-type]


def test_the_ledger_survives_reopening(durable_kind, tmp_path, clock):
    from .conftest import STORE_FACTORIES

    store = STORE_FACTORIES[durable_kind](tmp_path, clock)
    store.reserve_effect("k", "a1", LEASE, charges=[budget(60)])
    store.close()
    again = STORE_FACTORIES[durable_kind](tmp_path, clock)
    with pytest.raises(BudgetExhausted):
        again.reserve_effect("k2", "a2", LEASE, charges=[budget(41)])
    assert [c.amount for c in again.consumptions()] == [60]
    again.close()


def test_a_sum_past_two_to_the_31_is_exact(store: StoreOps):
    big = 2**40
    store.reserve_effect("k1", "a1", LEASE, charges=[budget(big, limit=2 * big)])
    store.reserve_effect("k2", "a2", LEASE, charges=[budget(big, limit=2 * big)])
    with pytest.raises(BudgetExhausted):
        store.reserve_effect("k3", "a3", LEASE, charges=[budget(1, limit=2 * big)])
    assert held(store) == 2 * big


def test_events_of_a_start_are_kept_with_its_charge(store: StoreOps):
    _, _, events = started(store, "k", "a1", budget(5))
    assert [e.type for e in events] == [EventType.EXECUTION_STARTED]
    assert [e.type for e in store.events()] == [EventType.EXECUTION_STARTED]
    assert len(store.consumptions()) == 1


# --------------------------------------------------------------------------- what it costs


def _finish_statements(store, outcome: EffectState) -> tuple[list[str], int]:
    from .test_hot_path import SQLLog

    key = f"k-{outcome}"
    started(store, key, "a1")
    with SQLLog(store) as log:
        finish(store, key, "a1", outcome, result=1, error="no", receipt=make_receipt(1),
               events=[make_event(EventType.EXECUTION_FAILED)], return_events=False)  # fmt: skip
    return log.statements, log.messages


def test_sqlite_only_the_move_to_failed_pays_the_release(tmp_path, clock):
    from ctrlrun.store import SQLiteStateStore

    store = SQLiteStateStore(tmp_path / "state.db", clock=clock)
    try:
        committed, _ = _finish_statements(store, EffectState.COMMITTED)
        failed, _ = _finish_statements(store, EffectState.FAILED)
    finally:
        store.close()
    assert not any("budget_ledger" in s for s in committed)
    released = [s for s in failed if "budget_ledger" in s]
    assert len(failed) == len(committed) + 1 and len(released) == 1
    assert released[0].startswith("UPDATE budget_ledger SET released_at")


@pytest.mark.postgres
def test_postgres_a_failed_finish_is_still_one_message_with_its_release(pg_url, pg_schema, clock):
    from ctrlrun.postgres import PostgresStateStore

    store = PostgresStateStore(pg_url, schema=pg_schema, clock=clock)
    try:
        committed, committed_messages = _finish_statements(store, EffectState.COMMITTED)
        failed, failed_messages = _finish_statements(store, EffectState.FAILED)
        assert committed_messages == failed_messages == 1
        assert not any("budget_ledger" in s for s in committed)
        assert len(failed) == len(committed) and "budget_ledger" in failed[-1]
    finally:
        store.close()


@pytest.mark.postgres
def test_postgres_charges_lock_each_budget_in_order_before_reading_its_sums(
    pg_url, pg_schema, clock
):
    from ctrlrun.postgres import PostgresStateStore

    store = PostgresStateStore(pg_url, schema=pg_schema, clock=clock)
    sent: list[tuple[str, Any]] = []
    try:
        charges = [budget(1, grant=g) for g in ("c", "a", "b")] + [budget(1, grant="a", limit=5)]
        store.trace = lambda text, parameters: sent.append((text, parameters))
        started(store, "k", "a1", *charges)
        store.trace = None
        locks = [p[0] for text, p in sent if "pg_advisory_xact_lock" in text]
        assert len(locks) == 3 and locks == sorted(locks)  # one per grant and metric
        sums = [i for i, (text, _) in enumerate(sent) if "sum(" in text]
        last_lock = max(i for i, (text, _) in enumerate(sent) if "pg_advisory_xact_lock" in text)
        assert len(sums) == 1 and last_lock < sums[0]  # a later statement: a later snapshot
        assert sent[0][0].startswith("BEGIN") and sent[-1][0] == "COMMIT"
        assert len(store.consumptions(effect_key="k")) == 3
    finally:
        store.close()
