"""Clocks and the one timestamp format ctrlrun writes."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Callable

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    """The default clock: the current aware UTC time."""
    return datetime.now(timezone.utc)


def format_ts(moment: datetime) -> str:
    """UTC ISO-8601 with milliseconds (truncated) and ``Z``: ``2026-11-30T09:56:59.597Z``."""
    if moment.tzinfo is not timezone.utc:
        moment = moment.astimezone(timezone.utc)
    # what isoformat(timespec="milliseconds") writes (truncated, never rounded), "Z" for
    # "+00:00"; spelled out because it runs several times per call and this is twice as fast
    return "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ" % (
        moment.year, moment.month, moment.day,
        moment.hour, moment.minute, moment.second, moment.microsecond // 1000,
    )  # fmt: skip


_last_precise: tuple[object, str] = (None, "")  # the last moment formatted, and its text


def format_precise(moment: datetime) -> str:
    """UTC ISO-8601 at full (microsecond) precision, for exact storage round trips."""
    global _last_precise
    last = _last_precise
    if moment is last[0]:  # one write stamps several columns with the same moment
        return last[1]
    text = _format_precise(moment)
    _last_precise = (moment, text)  # one reference swapped: a thread sees one pair or another
    return text


def _format_precise(moment: datetime) -> str:
    if moment.tzinfo is not timezone.utc:
        moment = moment.astimezone(timezone.utc)
    # isoformat(timespec="microseconds"), spelled out as format_ts is
    return "%04d-%02d-%02dT%02d:%02d:%02d.%06d+00:00" % (
        moment.year, moment.month, moment.day,
        moment.hour, moment.minute, moment.second, moment.microsecond,
    )  # fmt: skip


def parse_ts(text: str) -> datetime:
    """Parse any timestamp this library wrote back to an aware UTC datetime."""
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc)


def require_aware(moment: datetime, what: str) -> datetime:
    """Refuse naive datetimes: every time ctrlrun compares is an aware one."""
    if type(moment) is datetime and moment.tzinfo is timezone.utc:
        return moment  # the default clock's kind: nothing to check
    from .errors import InvalidArgument

    if not isinstance(moment, datetime) or moment.tzinfo is None or moment.utcoffset() is None:
        raise InvalidArgument(f"{what} must be a timezone-aware datetime, got {moment!r}")
    return moment
