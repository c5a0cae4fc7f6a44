"""OS processes racing one SQLite file: one winner per key and per approval, a gapless chain."""

from __future__ import annotations

import multiprocessing
import threading
from datetime import timedelta

import pytest

from ctrlrun.errors import ApprovalMismatch, CTRLRunError, DuplicateEffect
from ctrlrun.receipt import verify_chain
from ctrlrun.store import SQLiteStateStore

from .test_store_conformance import make_action, make_receipt, put_request

PROCESSES = 8
RECEIPTS_EACH = 5
_barrier: threading.Barrier | None = None


def _init(barrier) -> None:
    global _barrier
    _barrier = barrier


def _go() -> None:
    assert _barrier is not None
    _barrier.wait(timeout=60)


def _race_reserve(path: str, worker: int) -> tuple[str, object]:
    store = SQLiteStateStore(path)
    try:
        _go()
        reservation = store.reserve_effect("refund:txn_race", f"act_{worker}", timedelta(minutes=5))
        return "won", reservation.attempt
    except DuplicateEffect as exc:
        return "duplicate", exc.state
    except CTRLRunError as exc:
        return "error", repr(exc)
    finally:
        store.close()


def _race_consume(path: str, worker: int, approval_id: str, action_hash: str) -> tuple[str, object]:
    store = SQLiteStateStore(path)
    try:
        _go()
        store.consume_approval_and_reserve(
            approval_id, action_hash, f"refund:txn_{worker}", f"act_{worker}"
        )
        return "won", worker
    except ApprovalMismatch as exc:
        return "refused", exc.reason
    except CTRLRunError as exc:
        return "error", repr(exc)
    finally:
        store.close()


def _race_receipts(path: str, worker: int) -> tuple[str, object]:
    _go()
    store = SQLiteStateStore(path)  # a fresh file: every process migrates concurrently
    try:
        return "wrote", [store.put_receipt(make_receipt(worker)).seq for _ in range(RECEIPTS_EACH)]
    except CTRLRunError as exc:
        return "error", repr(exc)
    finally:
        store.close()


@pytest.fixture(scope="module")
def pool():
    spawn = multiprocessing.get_context("spawn")
    workers = spawn.Pool(PROCESSES, initializer=_init, initargs=(spawn.Barrier(PROCESSES),))
    yield workers
    workers.terminate()  # idle by now
    workers.join()


def _run(pool, task, *args) -> list[tuple[str, object]]:
    pending = [pool.apply_async(task, (*args[:1], i, *args[1:])) for i in range(PROCESSES)]
    return [p.get(timeout=120) for p in pending]


def test_one_winner_per_effect_key(pool, tmp_path):
    path = str(tmp_path / "state.db")
    SQLiteStateStore(path).close()
    outcomes = _run(pool, _race_reserve, path)
    assert sorted(outcomes) == [("duplicate", "in_progress")] * (PROCESSES - 1) + [("won", 1)]
    store = SQLiteStateStore(path)
    assert store.get_effect("refund:txn_race").attempt == 1
    store.close()


def test_one_consumer_per_approval(pool, tmp_path):
    path = str(tmp_path / "state.db")
    store = SQLiteStateStore(path)
    action = make_action()
    request = put_request(store, store.clock, action)
    store.grant_approval(request.request_id, "cli:local")
    outcomes = _run(pool, _race_consume, path, request.request_id, action.action_hash)
    winners = [o for o in outcomes if o[0] == "won"]
    assert len(winners) == 1, outcomes
    assert sorted(o for o in outcomes if o[0] != "won") == [("refused", "consumed")] * (
        PROCESSES - 1
    )
    assert [r.effect_key for r in store.list_effects()] == [f"refund:txn_{winners[0][1]}"]
    store.close()


def test_receipt_chain_gapless_under_concurrency(pool, tmp_path):
    path = str(tmp_path / "fresh" / "state.db")
    outcomes = _run(pool, _race_receipts, path)
    assert [o for o in outcomes if o[0] == "error"] == []
    total = PROCESSES * RECEIPTS_EACH
    assert sorted(seq for _, seqs in outcomes for seq in seqs) == list(range(1, total + 1))
    store = SQLiteStateStore(path)
    assert [r.seq for r in store.receipts()] == list(range(1, total + 1))
    assert verify_chain(store).ok and store.chain_head()[0] == total
    store.close()
