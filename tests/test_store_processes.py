"""OS processes racing one store (one SQLite file, one Postgres schema): one winner per key and
per approval, a gapless receipt chain, concurrent migrations that all succeed.

Every process opens its own store objects (its own engine and connections), which is what
separate hosts do; ``stores_per_process=2`` adds a second, independent store per process, raced
from a second thread, so 16 separate engines contend.
"""

from __future__ import annotations

import multiprocessing
import threading
from datetime import timedelta
from typing import Any

import pytest

from ctrlrun.errors import (
    AmbiguousEffect,
    ApprovalMismatch,
    CTRLRunError,
    DuplicateEffect,
)
from ctrlrun.receipt import verify_chain
from ctrlrun.store import SQLiteStateStore

from .conftest import create_pg_schema, drop_pg_schema, postgres_url
from .test_store_conformance import make_action, make_receipt, put_request

pytestmark = pytest.mark.slow

PROCESSES = 8
RECEIPTS_EACH = 5
_barrier: Any = None

Site = tuple[str, ...]  # ("sqlite", path) or ("postgres", url, schema): picklable


def open_site(site: Site, **kwargs: Any) -> Any:
    if site[0] == "sqlite":
        return SQLiteStateStore(site[1], **kwargs)
    from ctrlrun.postgres import PostgresStateStore

    return PostgresStateStore(site[1], schema=site[2], **kwargs)


def _init(barrier) -> None:
    global _barrier
    _barrier = barrier


def _go() -> None:
    assert _barrier is not None
    _barrier.wait(timeout=60)


def _each_store(site: Site, count: int, task, *, open_after_go: bool = False) -> list[Any]:
    """Open ``count`` separate stores, wait for every process, run ``task(store, n)`` at once."""
    stores: list[Any] = [] if open_after_go else [open_site(site) for _ in range(count)]
    outcomes: list[Any] = [None] * count

    def run(n: int) -> None:
        store = stores[n] if stores else open_site(site)
        try:
            outcomes[n] = task(store, n)
        except CTRLRunError as exc:
            outcomes[n] = ("error", repr(exc))
        finally:
            store.close()

    try:
        _go()
        threads = [threading.Thread(target=run, args=(n,)) for n in range(1, count)]
        for thread in threads:
            thread.start()
        run(0)
        for thread in threads:
            thread.join(timeout=120)
    finally:
        for store in stores:
            store.close()
    return outcomes


def _race_reserve(site: Site, worker: int, count: int) -> list[tuple[str, object]]:
    def reserve(store, n: int) -> tuple[str, object]:
        try:
            reservation = store.reserve_effect("refund:txn_race", f"act_{worker}_{n}")
            return "won", reservation.attempt
        except DuplicateEffect as exc:
            return "duplicate", exc.state
        except AmbiguousEffect as exc:
            return "ambiguous", exc.action_id

    return _each_store(site, count, reserve)


def _race_consume(
    site: Site, worker: int, count: int, approval_id: str, action_hash: str
) -> list[tuple[str, object]]:
    def consume(store, n: int) -> tuple[str, object]:
        key = f"refund:txn_{worker}_{n}"
        try:
            store.consume_approval_and_reserve(approval_id, action_hash, key, f"act_{worker}_{n}")
            return "won", key
        except ApprovalMismatch as exc:
            return "refused", exc.reason

    return _each_store(site, count, consume)


def _race_receipts(site: Site, worker: int, count: int) -> list[tuple[str, object]]:
    def write(store, n: int) -> tuple[str, object]:
        return "wrote", [store.put_receipt(make_receipt(worker)).seq for _ in range(RECEIPTS_EACH)]

    # Opened after the barrier on a fresh store: every process migrates at once.
    return _each_store(site, count, write, open_after_go=True)


@pytest.fixture(scope="module")
def pool():
    spawn = multiprocessing.get_context("spawn")
    workers = spawn.Pool(PROCESSES, initializer=_init, initargs=(spawn.Barrier(PROCESSES),))
    yield workers
    workers.terminate()  # idle by now
    workers.join()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def site(request, tmp_path):
    if request.param == "sqlite":
        yield ("sqlite", str(tmp_path / "fresh" / "state.db"))
        return
    url = postgres_url()
    schema = create_pg_schema(url)
    yield ("postgres", url, schema)
    drop_pg_schema(url, schema)


@pytest.fixture(params=[1, 2], ids=["1-store-each", "2-stores-each"])
def stores_per_process(request) -> int:
    return request.param


def _run(pool, task, site: Site, count: int, *args) -> list[tuple[str, object]]:
    pending = [pool.apply_async(task, (site, i, count, *args)) for i in range(PROCESSES)]
    return [outcome for p in pending for outcome in p.get(timeout=120)]


def test_one_winner_per_effect_key(pool, site, stores_per_process):
    open_site(site).close()  # migrated up front
    outcomes = _run(pool, _race_reserve, site, stores_per_process)
    contenders = PROCESSES * stores_per_process
    assert sorted(outcomes) == [("duplicate", "in_progress")] * (contenders - 1) + [("won", 1)]
    store = open_site(site)
    record = store.get_effect("refund:txn_race")
    assert record.attempt == 1 and len(store.list_effects()) == 1
    store.close()


def test_one_consumer_per_approval(pool, site, stores_per_process):
    store = open_site(site)
    action = make_action()
    request = put_request(store, store.clock, action)
    store.grant_approval(request.request_id, "cli:local")
    outcomes = _run(
        pool, _race_consume, site, stores_per_process, request.request_id, action.action_hash
    )
    winners = [o for o in outcomes if o[0] == "won"]
    assert len(winners) == 1, outcomes
    contenders = PROCESSES * stores_per_process
    assert sorted(o for o in outcomes if o[0] != "won") == [("refused", "consumed")] * (
        contenders - 1
    )
    assert [r.effect_key for r in store.list_effects()] == [winners[0][1]]
    store.close()


def test_receipt_chain_gapless_under_concurrency(pool, site, stores_per_process):
    outcomes = _run(pool, _race_receipts, site, stores_per_process)
    assert [o for o in outcomes if o[0] == "error"] == []
    total = PROCESSES * stores_per_process * RECEIPTS_EACH
    assert sorted(seq for _, seqs in outcomes for seq in seqs) == list(range(1, total + 1))
    store = open_site(site)
    assert [r.seq for r in store.receipts()] == list(range(1, total + 1))
    assert verify_chain(store).ok and store.chain_head()[0] == total
    store.close()


def test_lapsed_lease_one_renewal_across_processes(pool, site):
    """Over a lapsed ``reserved`` record exactly one process renews (attempt 2)."""
    store = open_site(site)
    store.reserve_effect("refund:txn_race", "crashed", timedelta(microseconds=1))
    store.close()
    outcomes = _run(pool, _race_reserve, site, 1)
    assert sorted(outcomes) == [("duplicate", "in_progress")] * (PROCESSES - 1) + [("won", 2)]
