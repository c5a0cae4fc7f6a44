"""A worker killed (SIGKILL) inside its protected function: the key refuses every retry until a
human resolves it, and nothing runs twice without that human's say-so (04 §11)."""

from __future__ import annotations

import multiprocessing
import os
import signal
from datetime import timedelta
from pathlib import Path

import pytest

from ctrlrun import (
    AmbiguousEffect,
    Control,
    DuplicateEffect,
    EffectState,
    Policy,
    context,
    protect,
)
from ctrlrun._time import utc_now
from ctrlrun.effects.records import DEFAULT_LEASE, LAPSED_LEASE_ERROR
from ctrlrun.receipt import verify_chain

from .conftest import FakeClock, create_pg_schema, drop_pg_schema, postgres_url
from .test_store_processes import Site, open_site

pytestmark = pytest.mark.slow

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    decision: allow
"""
KEY = "refund:txn_crash"


def _refund(control: Control, log: Path, inside=None):
    @protect("stripe.refund", control=control)
    def refund(payment_id: str, amount: int) -> dict:
        with open(log, "a", encoding="utf-8") as handle:  # one line per execution
            handle.write(f"{os.getpid()} {payment_id}\n")
            handle.flush()
            os.fsync(handle.fileno())
        if inside is not None:
            inside.send("inside")  # the parent kills us now
            inside.recv()  # never answered
        return {"id": f"re_{payment_id}"}

    return refund


def _child(site: Site, log: str, inside) -> None:
    store = open_site(site)  # the real clock, the default five-minute lease
    refund = _refund(Control(Policy.from_yaml(POLICY), store), Path(log), inside)
    with context(agent="agent-crashing"):
        refund(payment_id="txn_crash", amount=100)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def site(request, tmp_path):
    if request.param == "sqlite":
        yield ("sqlite", str(tmp_path / "state.db"))
        return
    url = postgres_url()
    schema = create_pg_schema(url)
    yield ("postgres", url, schema)
    drop_pg_schema(url, schema)


def executions(log: Path) -> list[str]:
    return log.read_text(encoding="utf-8").splitlines() if log.exists() else []


@pytest.mark.parametrize("outcome", [EffectState.COMMITTED, EffectState.FAILED])
def test_sigkill_inside_the_function(site, tmp_path, outcome):
    open_site(site).close()  # migrated before the race to kill
    log = tmp_path / "executions.log"
    spawn = multiprocessing.get_context("spawn")
    parent_end, child_end = spawn.Pipe()
    child = spawn.Process(target=_child, args=(site, str(log), child_end))
    child.start()
    try:
        assert parent_end.poll(60), "the child never reached its protected function"
        assert parent_end.recv() == "inside"
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.join(timeout=60)
    assert child.exitcode == -signal.SIGKILL
    assert len(executions(log)) == 1

    clock = FakeClock(utc_now())  # now: the dead worker's lease is still live
    store = open_site(site, clock=clock)
    try:
        record = store.get_effect(KEY)
        assert (record.state, record.attempt) == (EffectState.EXECUTING, 1)
        refund = _refund(Control(Policy.from_yaml(POLICY), store, clock=clock), log)
        with context(agent="agent-retrying"):
            with pytest.raises(DuplicateEffect) as live:
                refund(payment_id="txn_crash", amount=100)
            assert live.value.state == "in_progress"

            clock.advance(DEFAULT_LEASE + timedelta(seconds=1))  # the lease lapses
            with pytest.raises(AmbiguousEffect) as lapsed:
                refund(payment_id="txn_crash", amount=100)
            assert lapsed.value.effect_key == KEY
            record = store.get_effect(KEY)
            assert record.state is EffectState.AMBIGUOUS and record.error == LAPSED_LEASE_ERROR
            with pytest.raises(AmbiguousEffect):  # still refused: nobody has decided yet
                refund(payment_id="txn_crash", amount=100)
            assert len(executions(log)) == 1

            # What `ctrlrun resolve KEY --committed|--failed` does.
            resolved = store.resolve_effect(KEY, outcome, "cli:local")
            assert resolved.state is outcome and resolved.resolved_by == "cli:local"
            if outcome is EffectState.COMMITTED:
                with pytest.raises(DuplicateEffect) as done:
                    refund(payment_id="txn_crash", amount=100)
                assert done.value.state == "committed"
                assert len(executions(log)) == 1  # it never ran again
            else:
                assert refund(payment_id="txn_crash", amount=100) == {"id": "re_txn_crash"}
                record = store.get_effect(KEY)
                assert (record.state, record.attempt) == (EffectState.COMMITTED, 2)
                assert len(executions(log)) == 2  # once more, because a human said it failed
        assert verify_chain(store).ok
        assert [r.result for r in store.receipts()][:3] == ["blocked", "blocked", "blocked"]
    finally:
        store.close()
