"""Delegation records on every store (memory, SQLite, Postgres) through the shared ``store``
fixture: inserted once, listed in creation order, revoked by compare-and-set, never deleted.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from ctrlrun.authority.ledger import DelegationRecord
from ctrlrun.errors import InvalidArgument
from ctrlrun.evidence.receipt import Event, EventType
from ctrlrun.store.ops import StoreOps

CET = timezone(timedelta(hours=1))


def dlg(n: int) -> str:
    return f"dlg_{n:032x}"


def record(n: int, clock, parent: str = "head-of-support", **changes) -> DelegationRecord:
    made = DelegationRecord(
        delegation_id=dlg(n), parent_id=parent, depth=1,
        grant_json='{"actions":["stripe.refund"],"delegable":false}',
        created_by_agent="finance-agent", created_by_user="dana@example.com",
        created_via="api", created_at=clock(),
    )  # fmt: skip
    return replace(made, **changes)


def event(kind: EventType, **data) -> Event:
    return Event(kind, "2026-11-30T09:00:00.000Z", data=data)


def test_put_and_get_round_trip_every_field(store: StoreOps, clock):
    made = record(1, clock, created_at=datetime(2026, 11, 30, 10, 0, 0, 123456, tzinfo=CET),
                  created_by_user=None, created_via="cli", depth=3)  # fmt: skip
    store.put_delegation(made)
    found = store.get_delegation(dlg(1))
    assert found == made  # the same instant (kept as UTC)
    assert found.created_at.utcoffset() == timedelta(0)
    assert store.get_delegation(dlg(2)) is None


def test_a_duplicate_id_is_refused_never_overwritten(store: StoreOps, clock):
    store.put_delegation(record(1, clock))
    events = store.events()
    with pytest.raises(InvalidArgument, match=dlg(1)):
        store.put_delegation(record(1, clock, parent="other", depth=2),
                             events=[event(EventType.DELEGATION_CREATED)])  # fmt: skip
    assert store.get_delegation(dlg(1)) == record(1, clock)
    assert store.events() == events  # its events went with it


def test_put_writes_its_events_in_the_same_transaction(store: StoreOps, clock):
    before = store.transactions
    returned = store.put_delegation(
        record(1, clock), events=[event(EventType.DELEGATION_CREATED, delegation_id=dlg(1))]
    )
    assert store.transactions == before + 1
    (stored,) = store.events()
    assert returned == (stored,) and stored.event_id is not None
    assert store.put_delegation(record(2, clock)) == ()
    assert stored.type is EventType.DELEGATION_CREATED and stored.data["delegation_id"] == dlg(1)


def test_bad_events_or_records_write_nothing(store: StoreOps, clock):
    with pytest.raises(InvalidArgument):
        store.put_delegation(record(1, clock), events=["DELEGATION_CREATED"])  # type: ignore[list-item]
    for bad in (
        record(1, clock, created_at=datetime(2026, 1, 1)),  # naive
        record(1, clock, depth=True),
        record(1, clock, depth=-1),
        record(1, clock, delegation_id=""),
        record(1, clock, grant_json="{\x00}"),
        record(1, clock, created_by_agent=None),
        record(1, clock, revoked_at=clock()),  # revoked_at without revoked_by
        "dlg",
    ):
        with pytest.raises(InvalidArgument):
            store.put_delegation(bad)  # type: ignore[arg-type]
    assert store.delegations(include_revoked=True) == () and store.events() == ()


def test_listed_in_creation_order_and_without_revoked_by_default(store: StoreOps, clock):
    store.put_delegation(record(3, clock))
    store.put_delegation(record(1, clock))  # same instant: the id decides
    clock.advance(seconds=1)
    store.put_delegation(record(2, clock, parent=dlg(1), depth=2))
    assert [r.delegation_id for r in store.delegations()] == [dlg(1), dlg(3), dlg(2)]
    store.revoke_delegation(dlg(3), by="cli:local", at=clock())
    assert [r.delegation_id for r in store.delegations()] == [dlg(1), dlg(2)]
    assert [r.delegation_id for r in store.delegations(include_revoked=True)] == [
        dlg(1), dlg(3), dlg(2)
    ]  # fmt: skip
    with pytest.raises(InvalidArgument):
        store.delegations(include_revoked="yes")  # type: ignore[arg-type]


def test_delegations_for_lists_the_direct_children_revoked_ones_too(store: StoreOps, clock):
    store.put_delegation(record(1, clock))
    store.put_delegation(record(2, clock, parent=dlg(1), depth=2))
    store.put_delegation(record(3, clock, parent=dlg(2), depth=3))
    store.put_delegation(record(4, clock, parent=dlg(1), depth=2))
    store.revoke_delegation(dlg(4), by="cli:local", at=clock())
    assert [r.delegation_id for r in store.delegations_for(dlg(1))] == [dlg(2), dlg(4)]
    assert [r.delegation_id for r in store.delegations_for("head-of-support")] == [dlg(1)]
    assert store.delegations_for("nobody") == ()


def test_revoke_is_a_compare_and_set_with_its_event(store: StoreOps, clock):
    store.put_delegation(record(1, clock))
    clock.advance(seconds=5)
    seen: list[DelegationRecord] = []

    def revoked(found: DelegationRecord) -> list[Event]:
        seen.append(found)
        return [event(EventType.DELEGATION_REVOKED, delegation_id=found.delegation_id,
                      revoked_by=found.revoked_by)]  # fmt: skip

    assert store.revoke_delegation(dlg(1), by="dana@example.com", at=clock(), events=revoked)
    stored = store.get_delegation(dlg(1))
    assert (stored.revoked_at, stored.revoked_by) == (clock(), "dana@example.com")
    assert seen == [stored]
    clock.advance(seconds=5)
    assert not store.revoke_delegation(dlg(1), by="someone-else", at=clock(), events=revoked)
    assert store.get_delegation(dlg(1)) == stored and len(seen) == 1  # irreversible, one event
    assert [e.type for e in store.events()] == [EventType.DELEGATION_REVOKED]


def test_revoking_an_unknown_id_is_refused(store: StoreOps, clock):
    with pytest.raises(InvalidArgument, match=dlg(9)):
        store.revoke_delegation(dlg(9), by="cli:local", at=clock(),
                                events=lambda r: [event(EventType.DELEGATION_REVOKED)])  # fmt: skip
    assert store.events() == ()


@pytest.mark.parametrize(
    "by, at", [("", None), ("two\nlines", None), ("cli:local", "now"), ("cli:local", "naive")]
)
def test_revoke_refuses_bad_arguments(store: StoreOps, clock, by, at):
    store.put_delegation(record(1, clock))
    moment = {None: clock(), "now": "2026-01-01", "naive": datetime(2026, 1, 1)}[at]
    with pytest.raises(InvalidArgument):
        store.revoke_delegation(dlg(1), by=by, at=moment)
    assert store.get_delegation(dlg(1)).revoked_at is None


def test_a_failing_event_builder_leaves_it_unrevoked(store: StoreOps, clock):
    store.put_delegation(record(1, clock))

    def broken(found: DelegationRecord) -> list[Event]:
        raise RuntimeError("no events today")

    with pytest.raises(RuntimeError):
        store.revoke_delegation(dlg(1), by="cli:local", at=clock(), events=broken)
    assert store.get_delegation(dlg(1)).revoked_at is None and store.events() == ()


def test_concurrent_revokes_one_wins(store: StoreOps, clock):
    store.put_delegation(record(1, clock))
    barrier = threading.Barrier(6)
    answers: list[bool] = []

    def revoke(n: int) -> None:
        barrier.wait()
        answers.append(store.revoke_delegation(
            dlg(1), by=f"revoker-{n}", at=clock(),
            events=lambda r: [event(EventType.DELEGATION_REVOKED, revoked_by=r.revoked_by)],
        ))  # fmt: skip

    threads = [threading.Thread(target=revoke, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(answers) == [False] * 5 + [True]
    (revoked,) = store.events()
    assert revoked.data["revoked_by"] == store.get_delegation(dlg(1)).revoked_by


def test_lookups_refuse_bad_ids(store: StoreOps):
    for call in (store.get_delegation, store.delegations_for):
        with pytest.raises(InvalidArgument):
            call("")
        with pytest.raises(InvalidArgument):
            call(None)  # type: ignore[arg-type]


def test_delegations_survive_reopening(durable_kind, tmp_path, clock):
    from .conftest import STORE_FACTORIES

    store = STORE_FACTORIES[durable_kind](tmp_path, clock)
    store.put_delegation(record(1, clock))
    store.revoke_delegation(dlg(1), by="cli:local", at=clock())
    store.close()
    again = STORE_FACTORIES[durable_kind](tmp_path, clock)
    assert again.get_delegation(dlg(1)).revoked_by == "cli:local"
    assert again.delegations() == () and len(again.delegations(include_revoked=True)) == 1
    again.close()


def test_an_unreadable_stored_row_is_refused_by_name(tmp_path, clock):
    """A row written by something else (a time ctrlrun never writes) fails loudly on read."""
    import sqlite3

    from ctrlrun.store import SQLiteStateStore

    store = SQLiteStateStore(tmp_path / "state.db", clock=clock)
    store.put_delegation(record(1, clock))
    with sqlite3.connect(tmp_path / "state.db") as conn:
        conn.execute("UPDATE delegations SET created_at = 'yesterday'")
    with pytest.raises(InvalidArgument, match=f"{dlg(1)}.*unreadable"):
        store.get_delegation(dlg(1))
    with pytest.raises(InvalidArgument, match="unreadable"):
        store.delegations()
    store.close()
