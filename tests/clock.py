"""A settable clock for tests: no sleeps, time moves when the test says so."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone


class Clock:
    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or datetime(2026, 11, 30, 9, 0, tzinfo=timezone.utc)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **kwargs: float) -> datetime:
        self.now += timedelta(**kwargs)
        return self.now
