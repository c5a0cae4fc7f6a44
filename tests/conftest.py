"""Shared fixtures: a settable clock and one ``store`` fixture run against every backend."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest


class FakeClock:
    """An aware UTC clock that moves only when a test sets or advances it."""

    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or datetime(2026, 11, 30, 9, 0, tzinfo=timezone.utc)

    def __call__(self) -> datetime:
        return self.now

    def set(self, moment: datetime) -> datetime:
        if moment.utcoffset() is None:
            raise ValueError("FakeClock needs an aware datetime")
        self.now = moment
        return self.now

    def advance(self, delta: timedelta | None = None, **kwargs: float) -> datetime:
        self.now += delta if delta is not None else timedelta(**kwargs)
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def _memory(tmp_path: Path, clock: FakeClock) -> Any:
    from ctrlrun.store import InMemoryStateStore

    return InMemoryStateStore(clock=clock)


def _sqlite(tmp_path: Path, clock: FakeClock) -> Any:
    from ctrlrun.store import SQLiteStateStore

    return SQLiteStateStore(tmp_path / "state.db", clock=clock)


# Every backend the conformance suite runs against. A Postgres entry goes here later
# (skipped unless CTRLRUN_TEST_POSTGRES_URL is set), e.g. "postgres": _postgres.
STORE_FACTORIES: dict[str, Callable[[Path, FakeClock], Any]] = {
    "memory": _memory,
    "sqlite": _sqlite,
}


@pytest.fixture(params=sorted(STORE_FACTORIES))
def store(request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock) -> Iterator[Any]:
    instance = STORE_FACTORIES[request.param](tmp_path, clock)
    yield instance
    instance.close()
