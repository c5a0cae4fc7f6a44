"""A function that ran keeps its outcome through a flaky store: the outcome write is retried on a
fresh connection, a write whose answer was lost is read back (never written twice), and the
error left after the deadline says that the function ran."""

from __future__ import annotations

from typing import Any

import pytest

from ctrlrun import Control, Policy, context, protect
from ctrlrun.effects.records import EffectState
from ctrlrun.errors import AmbiguousEffect, AmbiguousWrite
from ctrlrun.receipt import verify_chain
from ctrlrun.store import SQLiteStateStore

from .test_postgres import POLICY, admin, needs_server, pg, spy_messages  # noqa: F401 (pg: a fixture)


class Ticking:
    """A monotonic clock that moves one second each time it is read, and a sleep that records."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        self.now += 1.0
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


def _refund(store: Any, clock: Any, calls: list[str], body: Any = None) -> Any:
    control = Control(Policy.from_yaml(POLICY), store, clock=clock)

    @protect("stripe.refund", control=control)
    def refund(payment_id: str, amount: int) -> str:
        calls.append(payment_id)
        if body is not None:
            body()
        return "ok"

    return refund


def _finishes(message: str) -> bool:
    return message.startswith("BEGIN; WITH finished")


@needs_server
def test_a_backend_killed_while_the_function_runs_still_ends_committed_with_its_receipt(
    pg, pg_url, clock
):
    calls: list[str] = []
    pg._sleep = lambda seconds: None

    def kill_my_backend() -> None:  # what a restart or a failover does to the connection
        (dbapi, _) = pg._driver()
        admin(pg_url, "SELECT pg_terminate_backend(%s)", dbapi.info.backend_pid)

    refund = _refund(pg, clock, calls, kill_my_backend)
    with context(agent="agent-1"):
        assert refund(payment_id="txn_1", amount=100) == "ok"
    assert calls == ["txn_1"]
    record = pg.get_effect("refund:txn_1")
    assert record.state is EffectState.COMMITTED and record.result == "ok"
    (receipt,) = pg.receipts()
    assert receipt.result == "committed" and verify_chain(pg).ok


@needs_server
@pytest.mark.parametrize("when", ["after", "before"])
def test_an_unanswered_finish_is_read_back_and_never_written_twice(pg, clock, monkeypatch, when):
    import psycopg

    lost: list[str] = []

    def lose_the_first_finish(cursor: Any, message: str, params: Any) -> Any:
        if _finishes(message) and not lost:
            lost.append(message)
            if when == "after":
                cursor.execute(message, params)  # carried out; only the answer is lost
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return cursor.execute(message, params)

    calls: list[str] = []
    pg._sleep = lambda seconds: None
    refund = _refund(pg, clock, calls)
    messages = spy_messages(monkeypatch, pg, lose_the_first_finish)
    with context(agent="agent-1"):
        assert refund(payment_id="txn_1", amount=100) == "ok"
    assert calls == ["txn_1"] and lost
    finishes = [m for m in messages if _finishes(m)]
    assert len(finishes) == (1 if when == "after" else 2)  # landed: read back, not sent again
    monkeypatch.undo()
    assert pg.get_effect("refund:txn_1").state is EffectState.COMMITTED
    (receipt,) = pg.receipts()
    assert receipt.result == "committed" and verify_chain(pg).ok
    assert [e.type for e in pg.events()].count("EXECUTION_COMMITTED") == 1


@needs_server
def test_past_the_deadline_the_error_says_the_function_ran_and_names_the_key(pg, clock, monkeypatch):
    import psycopg

    def store_gone(cursor: Any, message: str, params: Any) -> Any:
        if _finishes(message) or message.startswith("BEGIN; SELECT"):
            raise psycopg.OperationalError("connection refused")
        return cursor.execute(message, params)

    ticking = Ticking()
    pg._monotonic, pg._sleep = ticking.monotonic, ticking.sleep
    calls: list[str] = []
    refund = _refund(pg, clock, calls)
    spy_messages(monkeypatch, pg, store_gone)
    with context(agent="agent-1"):
        with pytest.raises(AmbiguousWrite) as info:
            refund(payment_id="txn_1", amount=100)
    error = info.value
    assert not isinstance(error, AmbiguousEffect) and error.effect_key == "refund:txn_1"
    text = str(error)
    assert "the function ran" in text and "refund:txn_1" in text and "ctrlrun resolve" in text
    assert "nothing was run" not in text and "not run" not in text and "retry later" not in text
    assert "nothing was written" not in text and "this write was not kept" not in text
    assert ticking.slept and calls == ["txn_1"]  # retried, then gave up at the deadline
    monkeypatch.undo()
    assert pg.get_effect("refund:txn_1").state is EffectState.EXECUTING  # lapses into ambiguous


def test_sqlite_busy_after_the_function_ran_is_retried(tmp_path, clock, monkeypatch):
    import sqlite3

    from ctrlrun.store.sql import _Failed

    store = SQLiteStateStore(tmp_path / "state.db", clock=clock)
    store._sleep = lambda seconds: None
    real = store._try_write
    busy: list[int] = []

    def first_finish_busy(operation: Any) -> Any:
        if store.transactions >= 1 and not busy:  # the start went through; the finish meets a lock
            busy.append(1)
            cause = sqlite3.OperationalError("database is locked")
            raise _Failed(cause, store._driver_error(cause, "writing"), unknown=False)
        return real(operation)

    monkeypatch.setattr(store, "_try_write", first_finish_busy)
    calls: list[str] = []
    refund = _refund(store, clock, calls)
    with context(agent="agent-1"):
        assert refund(payment_id="txn_1", amount=100) == "ok"
    assert busy and calls == ["txn_1"]
    assert store.get_effect("refund:txn_1").state is EffectState.COMMITTED
    assert len(store.receipts()) == 1 and verify_chain(store).ok


def test_a_refusal_is_not_retried(tmp_path, clock):
    """A finish the store refuses (the record moved) is decided at once, not retried."""
    store = SQLiteStateStore(tmp_path / "state.db", clock=clock)
    ticking = Ticking()
    store._monotonic, store._sleep = ticking.monotonic, ticking.sleep
    calls: list[str] = []

    def resolved_meanwhile() -> None:  # another worker judged the lease lapsed
        store.mark_ambiguous("refund:txn_1", store.get_effect("refund:txn_1").action_id, "lapsed")

    refund = _refund(store, clock, calls, resolved_meanwhile)
    with context(agent="agent-1"):
        with pytest.raises(AmbiguousEffect) as info:
            refund(payment_id="txn_1", amount=100)
    assert not isinstance(info.value, AmbiguousWrite) and ticking.slept == []


@pytest.fixture
def tiny_disk(tmp_path):
    """A 4 MB filesystem of its own (tmpfs), so a test can fill it; skipped where mounting is
    not allowed (not root)."""
    import subprocess

    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem here: {mounted.stderr.decode().strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_sqlite_disk_full_after_the_function_ran_is_retried_until_space_returns(tiny_disk, clock):
    store = SQLiteStateStore(tiny_disk / "state.db", clock=clock)
    filler = tiny_disk / "filler"
    waited: list[float] = []

    def fill_the_disk() -> None:
        with open(filler, "wb") as out:
            try:
                while True:
                    out.write(b"\0" * 65536)
                    out.flush()
            except OSError:
                pass

    def space_returns(seconds: float) -> None:  # an operator frees space while it waits
        waited.append(seconds)
        filler.unlink(missing_ok=True)

    store._sleep = space_returns
    calls: list[str] = []
    refund = _refund(store, clock, calls, fill_the_disk)
    with context(agent="agent-1"):
        assert refund(payment_id="txn_1", amount=100) == "ok"
    assert calls == ["txn_1"] and waited  # the outcome met a full disk, and was written later
    assert store.get_effect("refund:txn_1").state is EffectState.COMMITTED
    assert len(store.receipts()) == 1 and verify_chain(store).ok
    store.close()


@needs_server
def test_a_call_without_an_effect_key_keeps_its_receipt_when_its_backend_is_killed(pg, pg_url, clock):
    policy = Policy.from_yaml(
        "schema: ctrlrun.policy/v2\nactions:\n  mail.send:\n    decision: allow\n"
    )
    control = Control(policy, pg, clock=clock)
    pg._sleep = lambda seconds: None
    sent: list[str] = []

    @protect("mail.send", control=control)
    def send(to: str) -> str:
        sent.append(to)
        (dbapi, _) = pg._driver()
        admin(pg_url, "SELECT pg_terminate_backend(%s)", dbapi.info.backend_pid)
        return "sent"

    with context(agent="agent-1"):
        assert send(to="ada@example.com") == "sent"
    assert sent == ["ada@example.com"]
    (receipt,) = pg.receipts()
    assert receipt.result == "committed" and receipt.effect_key is None and verify_chain(pg).ok


def test_sqlite_busy_past_the_deadline_says_the_function_ran(tmp_path, clock, monkeypatch):
    import sqlite3

    from ctrlrun.store.sql import _Failed

    store = SQLiteStateStore(tmp_path / "state.db", clock=clock)
    ticking = Ticking()
    store._monotonic, store._sleep = ticking.monotonic, ticking.sleep
    real = store._try_write

    def always_busy_after_the_start(operation: Any) -> Any:
        if store.transactions >= 1:
            store.transactions += 1
            cause = sqlite3.OperationalError("database is locked")
            raise _Failed(cause, store._driver_error(cause, "writing"), unknown=False)
        return real(operation)

    monkeypatch.setattr(store, "_try_write", always_busy_after_the_start)
    calls: list[str] = []
    refund = _refund(store, clock, calls)
    with context(agent="agent-1"), pytest.raises(AmbiguousWrite) as info:
        refund(payment_id="txn_1", amount=100)
    text = str(info.value)
    assert calls == ["txn_1"] and "the function ran" in text and "refund:txn_1" in text
    assert "busy" in text and "not kept" not in text and "retry" not in text.replace("retry blindly", "")
    monkeypatch.undo()
    assert store.get_effect("refund:txn_1").state is EffectState.EXECUTING
