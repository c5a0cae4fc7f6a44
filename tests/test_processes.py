"""Once stays once: eight OS processes race one effect key against one SQLite file."""

from __future__ import annotations

import multiprocessing
import shutil

import pytest

from ctrlrun import SQLiteStateStore
from ctrlrun.receipt import verify_chain

from . import _workers
from .vectors import ROOT

PROCESSES = 8


@pytest.fixture
def clean_env(monkeypatch):
    for name in ("CTRLRUN_CONFIG", "CTRLRUN_STATE", "CTRLRUN_STORE_URL", "CTRLRUN_ENVIRONMENT"):
        monkeypatch.delenv(name, raising=False)


def test_eight_processes_one_effect_key(tmp_path, clean_env):
    shutil.copy(ROOT / "ctrlrun.yaml", tmp_path / "ctrlrun.yaml")
    SQLiteStateStore(tmp_path / ".ctrlrun" / "state.db").close()  # migrate once, up front
    spawn = multiprocessing.get_context("spawn")
    barrier = spawn.Barrier(PROCESSES)
    results = spawn.Queue()
    workers = [
        spawn.Process(target=_workers.race_refund, args=(str(tmp_path), barrier, results))
        for _ in range(PROCESSES)
    ]
    for worker in workers:
        worker.start()
    outcomes = [results.get(timeout=120) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0

    assert [o for o in outcomes if o[0] == "error"] == []
    assert sorted(o[0] for o in outcomes) == ["duplicate"] * (PROCESSES - 1) + ["ran"]
    assert len((tmp_path / "remote.log").read_text().splitlines()) == 1

    store = SQLiteStateStore(tmp_path / ".ctrlrun" / "state.db")
    receipts = store.receipts()
    assert sorted(r.result for r in receipts) == ["blocked"] * (PROCESSES - 1) + ["committed"]
    assert [r.seq for r in receipts] == list(range(1, PROCESSES + 1))
    assert verify_chain(store).ok
    store.close()
