"""Clocks and the one timestamp format ctrlrun writes."""

from __future__ import annotations

from datetime import datetime, timezone
from functools import partial
from typing import Callable

Clock = Callable[[], datetime]


#: The default clock: the current aware UTC time (``datetime.now(timezone.utc)``, called
#: without a Python frame of its own: it is read several times per call).
utc_now: Callable[[], datetime] = partial(datetime.now, timezone.utc)


def format_ts(moment: datetime) -> str:
    """UTC ISO-8601 with milliseconds (truncated) and ``Z``: ``2026-11-30T09:56:59.597Z``."""
    last = _last_precise
    if moment is last[0]:  # a lease's expiry, written precisely by its store a moment ago
        return last[1][:23] + "Z"
    if moment.tzinfo is not timezone.utc:
        moment = moment.astimezone(timezone.utc)
    # what isoformat(timespec="milliseconds") writes (truncated, never rounded), "Z" for
    # "+00:00"; each minute's text is written once
    prefix = _minutes.get((moment.minute, moment.hour, moment.day, moment.month, moment.year))
    if prefix is None:
        prefix = _minute_text(moment)
    return prefix + _TWO[moment.second] + "." + _THREE[moment.microsecond // 1000] + "Z"


def format_precise(moment: datetime) -> str:
    """UTC ISO-8601 at full (microsecond) precision, for exact storage round trips."""
    global _last_precise
    last = _last_precise
    if moment is last[0]:  # one write stamps several columns with the same moment
        return last[1]
    given = moment
    if moment.tzinfo is not timezone.utc:
        moment = moment.astimezone(timezone.utc)
    # isoformat(timespec="microseconds"), with the minute's text kept as format_ts keeps it
    prefix = _minutes.get((moment.minute, moment.hour, moment.day, moment.month, moment.year))
    if prefix is None:
        prefix = _minute_text(moment)
    micro = moment.microsecond
    text = prefix + _TWO[moment.second] + "." + _THREE[micro // 1000] + _THREE[micro % 1000] + "+00:00"
    _last_precise = (given, text)  # one reference swapped: a thread sees one pair or another
    return text


_last_precise: tuple[object, str] = (None, "")  # the last moment formatted, and its text


_TWO = tuple("%02d" % n for n in range(60))  # a second's digits (a leap second never reaches here)
_THREE = tuple("%03d" % n for n in range(1000))  # milliseconds, or a half of the microseconds
#: the minutes formatted lately (a call stamps its moments and its lease's expiry, minutes apart)
_minutes: dict[tuple[int, int, int, int, int], str] = {}


def _minute_text(moment: datetime) -> str:
    """``YYYY-MM-DDTHH:MM:`` of ``moment``, kept for the next moments of that minute."""
    if len(_minutes) >= 16:
        _minutes.clear()
    text = _minutes[(moment.minute, moment.hour, moment.day, moment.month, moment.year)] = (
        "%04d-%02d-%02dT%02d:%02d:" % (moment.year, moment.month, moment.day, moment.hour, moment.minute)
    )  # fmt: skip
    return text


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
