"""The attempt ceiling (``max_attempts``): the check on the number the store assigned, the fast
path that asks no human, the release of a refused reservation; on every store, and across OS
processes."""

from __future__ import annotations

import logging
import multiprocessing
from pathlib import Path
from typing import Any

import pytest

import ctrlrun
from ctrlrun import ActionDenied, ApprovalRequired, Control, NotExecuted, Policy

from ._workers import CEILING_POLICY, ceiling_worker
from .conftest import FakeClock

POLICY = CEILING_POLICY


class World:
    def __init__(self, store: Any, clock: FakeClock) -> None:
        self.store = store
        self.control = Control(Policy.from_yaml(POLICY), store, clock=clock)
        self.ran: list[str] = []
        self.outcome: BaseException | None = NotExecuted("not sent")

        @ctrlrun.protect("job.run", effect="job:{job_id}", control=self.control)
        def run(job_id: str, size: int) -> str:
            self.ran.append(job_id)
            if self.outcome is not None:
                raise self.outcome
            return "done"

        self.run = run

    def call(self, *, size: int = 1, **options: Any) -> Any:
        with ctrlrun.context(agent="worker"):
            return self.run(job_id="j1", size=size)


@pytest.fixture
def world(store: Any, clock: FakeClock) -> World:
    return World(store, clock)


def refusals(store: Any) -> list[dict[str, Any]]:
    return [dict(e.data) for e in store.events() if e.type == "EFFECT_RESERVATION_REFUSED"]


def test_two_attempts_then_the_fast_path_refuses_the_third(world: World) -> None:
    for _ in range(2):
        with pytest.raises(NotExecuted):
            world.call()
    record = world.store.get_effect("job:j1")
    assert (record.state, record.attempt) == ("failed", 2)
    with pytest.raises(ActionDenied) as refused:
        world.call()
    assert refused.value.reason == "attempt_ceiling"
    assert "max_attempts is 2" in str(refused.value)
    assert world.ran == ["j1", "j1"]
    assert refusals(world.store) == [{"reason": "attempt_ceiling", "attempt": 3, "max_attempts": 2}]
    record = world.store.get_effect("job:j1")
    assert (record.state, record.attempt) == ("failed", 2)  # nothing reserved
    last = world.store.receipts()[-1]
    assert (last.decision, last.result, last.attempt) == ("allow", "blocked", 3)


def test_the_fast_path_asks_no_human_and_leaves_a_presented_approval_granted(world: World) -> None:
    for _ in range(2):
        with pytest.raises(NotExecuted):
            world.call()
    before = len(world.store.pending_approvals())
    with pytest.raises(ActionDenied) as refused:
        world.call(size=50)  # the policy would ask a human: the ceiling refuses first
    assert refused.value.reason == "attempt_ceiling"
    assert len(world.store.pending_approvals()) == before
    assert not [e for e in world.store.events() if e.type == "APPROVAL_REQUESTED"]


def test_the_check_refuses_a_renewal_the_store_numbered_past_the_ceiling(world: World) -> None:
    with pytest.raises(NotExecuted):
        world.call()
    world.outcome = TimeoutError("the reply was lost")
    with pytest.raises(TimeoutError):
        world.call()
    assert world.store.get_effect("job:j1").state == "ambiguous"  # the fast path passes it
    asked: list[str] = []

    def hook(key: str) -> str:
        asked.append(key)
        return "not_executed"

    world.outcome = None

    @ctrlrun.protect("job.run", effect="job:{job_id}", control=world.control, reconcile=hook)
    def run(job_id: str, size: int) -> str:
        world.ran.append(job_id)
        return "done"

    with ctrlrun.context(agent="worker"), pytest.raises(ActionDenied) as refused:
        run(job_id="j1", size=1)
    assert refused.value.reason == "attempt_ceiling" and asked == ["job:j1"]
    assert world.ran == ["j1", "j1"]  # the third attempt's function never ran
    record = world.store.get_effect("job:j1")
    assert (record.state, record.attempt) == ("failed", 3)
    assert record.error == "attempt 3 refused: max_attempts is 2"
    last = world.store.receipts()[-1]
    assert (last.result, last.attempt) == ("blocked", 3)
    third = [e.type for e in world.store.events() if e.action_id == last.action_id]
    assert "EXECUTION_STARTED" not in third and "EFFECT_RESERVED" in third
    assert refusals(world.store)[-1] == {"reason": "attempt_ceiling", "attempt": 3, "max_attempts": 2}


def test_a_call_without_an_effect_key_has_no_ceiling_and_says_so_once(
    store: Any, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    control = Control(Policy.from_yaml(POLICY), store, clock=clock)
    def boom() -> None:
        raise NotExecuted("not sent")

    with caplog.at_level(logging.WARNING, logger="ctrlrun"):
        for _ in range(3):
            action = ctrlrun.Action("job.run", {"job_id": "j1", "size": 1}, ctrlrun.Principal("worker"))
            with pytest.raises(NotExecuted):
                control.execute(action, boom)
    assert len([r for r in caplog.records if "max_attempts" in r.getMessage()]) == 1


def test_a_committed_attempt_within_the_ceiling_runs_on_the_pipeline(world: World) -> None:
    world.outcome = None
    assert world.call() == "done"
    assert world.control.wiring.straight._ceilinged == frozenset({"job.run"})


def test_exactly_max_attempts_dispatches_across_processes(tmp_path: Path) -> None:
    ctrlrun.SQLiteStateStore(tmp_path / "state.db").close()
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(4), context.Queue()
    processes = [context.Process(target=ceiling_worker, args=(str(tmp_path), barrier, results)) for _ in range(4)]
    for process in processes:
        process.start()
    outcomes = [results.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(timeout=60)
    assert all(o and o[-1] == "attempt_ceiling" for o in outcomes), outcomes
    dispatched = (tmp_path / "dispatched.log").read_text(encoding="utf-8").splitlines()
    assert len(dispatched) == 2
    store = ctrlrun.SQLiteStateStore(tmp_path / "state.db")
    record = store.get_effect("job:race")
    assert record.state == "failed" and record.attempt >= 2
    store.close()


def test_an_approved_call_is_asked_about_only_while_under_the_ceiling(world: World) -> None:
    with pytest.raises(ApprovalRequired):
        world.call(size=50)


@pytest.mark.postgres
def test_exactly_max_attempts_dispatches_across_processes_on_postgres(tmp_path: Path, pg_url: str) -> None:
    from .conftest import create_pg_schema, drop_pg_schema

    schema = create_pg_schema(pg_url)
    try:
        url = f"{pg_url}?ctrlrun_schema={schema}"
        from ctrlrun.store import open_store_url

        open_store_url(url).close()  # created and migrated once, before the race
        context = multiprocessing.get_context("spawn")
        barrier, results = context.Barrier(4), context.Queue()
        processes = [context.Process(target=ceiling_worker, args=(str(tmp_path), barrier, results, url))
                     for _ in range(4)]  # fmt: skip
        for process in processes:
            process.start()
        outcomes = [results.get(timeout=120) for _ in processes]
        for process in processes:
            process.join(timeout=60)
        assert all(o and o[-1] == "attempt_ceiling" for o in outcomes), outcomes
        assert len((tmp_path / "dispatched.log").read_text(encoding="utf-8").splitlines()) == 2
    finally:
        drop_pg_schema(pg_url, schema)
