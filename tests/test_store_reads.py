"""The paged and indexed reads give what the whole-table reads give, on every store."""

from __future__ import annotations

import dataclasses
import sqlite3
import tracemalloc
from datetime import timedelta

import pytest

from ctrlrun.effects.records import EffectState
from ctrlrun.errors import InvalidArgument
from ctrlrun.evidence.receipt import Event, EventType
from ctrlrun.store import SQLiteStateStore
from ctrlrun.store.reads import prefix_end

from .test_store_conformance import LEASE, make_receipt

PAGES = (1, 2, 3, 7, 500)


def ids(rows):
    return [(r.seq, r.receipt_id) for r in rows]


def fill(store, clock, n, **fields):
    placed = []
    for i in range(n):
        clock.advance(seconds=1)
        finished = clock.now.strftime("%Y-%m-%dT%H:%M:%S.000Z")
        receipt = dataclasses.replace(make_receipt(i), finished_at=finished, **fields)
        placed.append(store.put_receipt(receipt))
    return placed


def test_empty_store_reads_nothing(store):
    assert list(store.iter_receipts()) == [] == store.last_receipts(5)
    assert list(store.iter_effects()) == [] == list(store.iter_receipts(after_seq=3, limit=2))


@pytest.mark.parametrize("page", PAGES)
def test_paged_receipts_equal_the_full_read(store, clock, page):
    fill(store, clock, 7)
    full = ids(store.receipts())
    assert len(full) == 7
    assert ids(store.iter_receipts(page=page)) == full
    for after in (0, 1, 3, 6, 7, 9):
        assert ids(store.iter_receipts(after_seq=after, page=page)) == full[after:]
        for limit in (0, 1, 2, 7, 10):
            got = ids(store.iter_receipts(after_seq=after, limit=limit, page=page))
            assert got == full[after:][:limit]


def test_last_receipts_is_the_tail_in_chain_order(store, clock):
    fill(store, clock, 5)
    full = ids(store.receipts())
    for n in (0, 1, 3, 5, 9):
        assert ids(store.last_receipts(n)) == (full[-n:] if n else [])
    with pytest.raises(InvalidArgument):
        store.last_receipts(-1)


def test_receipts_since_start_at_the_first_receipt_at_or_after_the_moment(store, clock):
    start = clock.now
    placed = fill(store, clock, 6)  # finished at start+1s … start+6s
    full = ids(store.receipts())
    for seconds in (0, 1, 3, 6, 7):
        since = start + timedelta(seconds=seconds)
        expected = [row for row, r in zip(full, placed) if r.finished_at >= since.strftime("%Y-%m-%dT%H:%M:%S.000Z")]
        assert ids(store.iter_receipts_since(since, page=2)) == expected


def test_unreadable_rows_are_paged_in_place(durable_kind, tmp_path, clock):
    from .conftest import STORE_FACTORIES

    store = STORE_FACTORIES[durable_kind](tmp_path, clock)
    try:
        fill(store, clock, 4)
        target = store.receipts()[1].receipt_id
        if durable_kind == "sqlite":
            with sqlite3.connect(tmp_path / "state.db") as conn:
                conn.execute("UPDATE receipts SET json = 'garbage' WHERE receipt_id = ?", (target,))
        else:
            import psycopg

            with psycopg.connect(store._conninfo, autocommit=True) as conn:
                conn.execute(f'UPDATE "{store.schema}".receipts SET json = %s WHERE receipt_id = %s',
                             ("garbage", target))  # fmt: skip
        full = store.receipts()
        assert type(full[1]).__name__ == "UnreadableReceipt"
        for page in (1, 2, 3):
            assert ids(store.iter_receipts(page=page)) == ids(full)
        assert ids(store.last_receipts(3)) == ids(full[1:])
    finally:
        store.close()


def test_indexed_lookups(store, clock):
    request = "apr_" + "1" * 32
    mine = fill(store, clock, 2, approval_id=request, effect_key="refund:1")
    fill(store, clock, 2)
    assert ids(store.receipts_for(approval_id=request)) == ids(mine)
    assert ids(store.receipts_for(effect_key="refund:1")) == ids(mine)
    assert ids(store.receipts_for(action_id=mine[0].action_id)) == ids(mine[:1])
    assert store.receipts_for(approval_id="apr_none") == ()
    event = Event(EventType.APPROVAL_GRANTED, "2026-11-30T09:00:00.000Z", action_id="act_9",
                  approval_id=request, data={"approver": "cli:local"})  # fmt: skip
    store.append_event(event)
    store.append_event(Event(EventType.ACTION_PROPOSED, "2026-11-30T09:00:00.000Z", action_id="act_9"))
    assert [e.type for e in store.events_for(action_id="act_9")] == [
        EventType.APPROVAL_GRANTED, EventType.ACTION_PROPOSED,
    ]  # fmt: skip
    assert [e.type for e in store.events_for(approval_id=request)] == [EventType.APPROVAL_GRANTED]
    with pytest.raises(InvalidArgument):
        store.receipts_for(action_id="act_9", effect_key="k")


KEYS = ("a%b:1", "a%b:2", "axb:1", "a_b:1", "aXb:1", "a\\b:1", "a\\c:1", "b:1", "a%:1", "ä:1")


@pytest.mark.parametrize("page", (1, 3, 500))
def test_effects_pages_equal_the_full_listing(store, clock, page):
    for i, key in enumerate(KEYS):
        clock.advance(seconds=1 if i % 3 else 0)  # some share a created_at: the key breaks ties
        store.reserve_effect(key, f"act_{i}", LEASE)
        if i % 2:
            store.begin_execution(key, f"act_{i}")
            store.commit_effect(key, f"act_{i}")
    full = [r.effect_key for r in store.list_effects()]
    assert sorted(full) == sorted(KEYS)
    assert [r.effect_key for r in store.iter_effects(page=page)] == full
    for prefix in ("a%", "a_", "a\\", "a", "ä", "", "zzz", "a%b:"):
        expected = [k for k in full if k.startswith(prefix)]
        assert [r.effect_key for r in store.iter_effects(key_prefix=prefix, page=page)] == expected
        for limit in (0, 1, 2):
            got = [r.effect_key for r in store.iter_effects(key_prefix=prefix, limit=limit, page=page)]
            assert got == expected[:limit]
    committed = [r.effect_key for r in store.list_effects(EffectState.COMMITTED)]
    assert [r.effect_key for r in store.iter_effects("committed", page=page)] == committed
    assert [r.effect_key for r in store.iter_effects("committed", "a%", page=page)] == [
        k for k in committed if k.startswith("a%")
    ]


def test_prefix_end_is_the_least_string_above_the_prefix():
    assert prefix_end("ab") == "ac"
    assert prefix_end("a\U0010ffff") == "b"
    assert prefix_end("\ud7ff") == "\ue000"
    assert prefix_end("\U0010ffff") is None


def test_pending_approvals_pages_by_its_index(store, clock):
    from .test_store_conformance import put_request

    made = []
    for _ in range(4):
        clock.advance(seconds=1)
        made.append(put_request(store, clock).request_id)
    assert [r.approval_id for r in store.pending_approvals(2)] == made[:2]
    assert [r.approval_id for r in store.pending_approvals()] == made


def test_iterating_a_large_sqlite_store_stays_in_bounded_memory(tmp_path, clock):
    path = tmp_path / "big.db"
    store = SQLiteStateStore(path, clock=clock, durability="normal")
    store.put_receipt(make_receipt(0))
    store.close()
    row = sqlite3.connect(path).execute("SELECT * FROM receipts").fetchone()
    with sqlite3.connect(path) as conn:  # 20,000 copies of one row (each its own seq)
        conn.executemany(
            "INSERT INTO receipts VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            ((f"ctr_{i:032x}", *row[1:6], i + 2, *row[7:]) for i in range(20000)),
        )  # fmt: skip
    store = SQLiteStateStore(path, clock=clock, migrate=False, read_only=True)
    try:
        tracemalloc.start()
        count = 0
        for _ in store.iter_receipts():
            count += 1
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    finally:
        store.close()
    assert count == 20001
    assert peak < 8_000_000  # a page of rows, not 20,000 (the whole table is ~40 MB as objects)


def test_every_paged_and_indexed_read_searches_an_index_on_sqlite(tmp_path):
    store = SQLiteStateStore(tmp_path / "plan.db")
    sql = store._statements
    statements = [
        sql.receipts_page(True), sql.receipts_page(False), sql.receipts_tail(True),
        sql.receipts_tail(False), sql.receipt_at_or_after(), sql.events_by("action_id"),
        sql.events_by("approval_id"), sql.effects_page(False, False, False, True),
        sql.effects_page(True, False, False, True), sql.effects_page(False, True, True, False),
        *(sql.receipts_by(c) for c in ("receipt_id", "action_id", "effect_key", "approval_id")),
    ]  # fmt: skip
    store.close()
    with sqlite3.connect(tmp_path / "plan.db") as conn:
        for statement in statements:
            plan = conn.execute("EXPLAIN QUERY PLAN " + statement.sql, [None] * len(statement.names))
            steps = [row[3] for row in plan]
            assert steps[0].startswith("SEARCH") and "USING" in steps[0], (statement.sql, steps)
            assert not any(step.startswith("SCAN") for step in steps), (statement.sql, steps)


@pytest.mark.postgres
def test_a_whole_postgres_stream_reads_through_a_server_side_cursor(tmp_path, clock):
    """An unlimited ``iter_receipts`` on Postgres fetches from a cursor the server holds, a
    batch at a time (nothing of the table buffered on the client); a limited one pages."""
    from .conftest import STORE_FACTORIES, postgres_url

    psycopg = pytest.importorskip("psycopg")
    url = postgres_url()
    store = STORE_FACTORIES["postgres"](tmp_path, clock)
    try:
        fill(store, clock, 3)
        stream = store.iter_receipts()
        first = next(stream)
        with psycopg.connect(url, autocommit=True) as conn:
            queries = [q for (q,) in conn.execute(
                "SELECT query FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
                "AND state = 'idle in transaction'")]  # fmt: skip
        assert any(q.lstrip().upper().startswith(("DECLARE", "FETCH")) for q in queries), queries
        assert [first.seq, *(r.seq for r in stream)] == [1, 2, 3]
    finally:
        store.close()
