"""The timestamp texts are isoformat's, whatever moments come in and in whatever order."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from hypothesis import given
from hypothesis import strategies as st

from ctrlrun._time import format_precise, format_ts, parse_ts

_moments = st.datetimes(
    min_value=datetime(2, 1, 1), max_value=datetime(9999, 12, 31, 23, 58),
    timezones=st.sampled_from([timezone.utc, timezone(timedelta(hours=5, minutes=30))]),
)  # fmt: skip


def _iso(moment: datetime, spec: str) -> str:
    return moment.astimezone(timezone.utc).isoformat(timespec=spec)


@given(st.lists(_moments, min_size=1, max_size=6))
def test_each_moment_is_written_as_isoformat_writes_it(moments: list[datetime]) -> None:
    for moment in moments:  # a minute kept from the moment before never leaks into the next
        assert format_ts(moment) == _iso(moment, "milliseconds").replace("+00:00", "Z")
        assert format_precise(moment) == _iso(moment, "microseconds")
        # right after format_precise, format_ts reuses its text: the same milliseconds
        assert format_ts(moment) == _iso(moment, "milliseconds").replace("+00:00", "Z")
        assert parse_ts(format_precise(moment)) == moment


def test_moments_a_minute_apart_keep_their_own_minute() -> None:
    moment = datetime(2026, 12, 31, 23, 59, 59, 999_999, tzinfo=timezone.utc)
    assert format_ts(moment) == "2026-12-31T23:59:59.999Z"
    assert format_precise(moment + timedelta(microseconds=1)) == "2027-01-01T00:00:00.000000+00:00"
    assert format_ts(moment.replace(year=2025)) == "2025-12-31T23:59:59.999Z"
    assert format_ts(moment.replace(month=11, day=30)) == "2026-11-30T23:59:59.999Z"
    assert format_ts(moment.replace(hour=22)) == "2026-12-31T22:59:59.999Z"
    assert format_ts(moment.replace(minute=58, microsecond=1_000)) == "2026-12-31T23:58:59.001Z"
