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
    # isoformat truncates to milliseconds (it never rounds); "+00:00" becomes "Z"
    return moment.replace(tzinfo=None).isoformat(timespec="milliseconds") + "Z"


def format_precise(moment: datetime) -> str:
    """UTC ISO-8601 at full (microsecond) precision, for exact storage round trips."""
    return moment.astimezone(timezone.utc).isoformat(timespec="microseconds")


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
    from .errors import InvalidArgument

    if not isinstance(moment, datetime) or moment.tzinfo is None or moment.utcoffset() is None:
        raise InvalidArgument(f"{what} must be a timezone-aware datetime, got {moment!r}")
    return moment
