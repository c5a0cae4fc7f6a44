"""The read API that costs its page: iterators and pages over the indexes, each page its own
short read, so a listing holds one page in memory whatever the store holds."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any, TypeVar

from .._time import format_precise, format_ts, require_aware
from ..effects.records import EffectRecord, EffectState
from ..errors import InvalidArgument
from ..evidence.receipt import Event, Receipt, UnreadableReceipt
from .rows import Tx
from .steps import _effect_state

__all__ = ["PAGE", "ReadOps", "prefix_end"]

T = TypeVar("T")
PAGE = 500  # rows per read: small enough to hold, large enough that round trips do not dominate
Row = Receipt | UnreadableReceipt
_RECEIPT_LOOKUPS = ("receipt_id", "action_id", "effect_key", "approval_id")
_EVENT_LOOKUPS = ("action_id", "approval_id")


def _count(value: Any, what: str, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidArgument(f"{what} must be an int >= {minimum}, got {value!r}")
    return value


def prefix_end(prefix: str) -> str | None:
    """The least string above every string that starts with ``prefix`` (code point order, which
    is UTF-8 byte order): the prefix with its last character moved up one; ``None`` when none
    exists (a prefix of U+10FFFF characters only)."""
    text = prefix
    while text:
        point = ord(text[-1]) + 1
        if 0xD800 <= point <= 0xDFFF:  # no surrogate is stored: the next character is U+E000
            point = 0xE000
        if point <= 0x10FFFF:
            return text[:-1] + chr(point)
        text = text[:-1]
    return None


class ReadOps:
    """Paged and indexed reads over ``_read`` (mixed into ``StoreOps``)."""

    def _read(self, operation: Callable[[Tx, datetime], T]) -> T:  # pragma: no cover
        raise NotImplementedError

    # -- receipts

    def iter_receipts(
        self, after_seq: int = 0, limit: int | None = None, *, page: int = PAGE
    ) -> Iterator[Row]:
        """Receipts with ``seq > after_seq`` in chain order (from 0, the unchained ones written
        before the chain existed come first), at most ``limit``; read a page at a time."""
        after = _count(after_seq, "after_seq")
        left = None if limit is None else _count(limit, "limit")
        size = _count(page, "page", minimum=1)
        if after == 0:
            last_id = ""
            while left is None or left > 0:
                want = size if left is None else min(size, left)
                rows = self._read(lambda tx, now: tx.receipts_page(last_id, want, chained=False))
                yield from rows
                if left is not None:
                    left -= len(rows)
                if len(rows) < want:
                    break
                last_id = rows[-1].receipt_id or ""
        streamed = self._stream_after(after) if left is None else None
        if streamed is not None:
            yield from streamed
            return
        while left is None or left > 0:
            want = size if left is None else min(size, left)
            rows = self._read(lambda tx, now: tx.receipts_page(after, want))
            yield from rows
            if left is not None:
                left -= len(rows)
            if len(rows) < want:
                return
            after = _seq_of(rows[-1])

    def _stream_after(self, after_seq: int) -> Iterator[Row] | None:
        """A whole stream of the chained receipts after ``after_seq`` from a server-side cursor,
        where the store has one (Postgres); ``None``: read keyset pages."""
        return None

    def last_receipts(self, n: int) -> list[Row]:
        """The last ``n`` receipts by seq, in chain order (the tail of ``receipts()``)."""
        n = _count(n, "n")
        if n == 0:
            return []

        def read(tx: Tx, now: datetime) -> list[Row]:
            rows = tx.receipts_tail(n)
            if len(rows) < n:
                rows += tx.receipts_tail(n - len(rows), chained=False)
            return rows[::-1]

        return self._read(read)

    def iter_receipts_since(self, moment: datetime, *, page: int = PAGE) -> Iterator[Row]:
        """Receipts finished at or after ``moment`` (to the millisecond), in chain order.

        The start is found by bisecting seq (a few point reads): receipts are placed in the
        order they finish, so ``finished_at`` rises with seq; rows before the start are not
        read, rows after it with an earlier time (clocks of concurrent writers) are skipped."""
        since = format_ts(require_aware(moment, "since"))
        low, high = 1, self._read(lambda tx, now: tx.head() or (0, ""))[0]
        start = high + 1
        while low <= high:  # the first seq whose receipt's ts >= since
            middle = (low + high) // 2
            found = self._read(lambda tx, now: tx.receipt_at_or_after(middle))
            if found is None or found[0] > high:
                high = middle - 1
                continue
            seq, ts = found
            if ts is not None and ts >= since:
                start, high = seq, middle - 1
            else:
                low = seq + 1
        for row in self.iter_receipts(after_seq=start - 1, page=page):
            finished = getattr(row, "finished_at", None)
            if not isinstance(finished, str) or finished >= since:
                yield row

    def receipts_for(
        self, *, receipt_id: str | None = None, action_id: str | None = None,
        effect_key: str | None = None, approval_id: str | None = None,
    ) -> tuple[Row, ...]:  # fmt: skip
        """One receipt by id, or the receipts of one action, effect key or approval request, in
        chain order (each by its index)."""
        column, value = _one_of(_RECEIPT_LOOKUPS, receipt_id=receipt_id, action_id=action_id,
                                effect_key=effect_key, approval_id=approval_id)  # fmt: skip
        return tuple(self._read(lambda tx, now: tx.receipts_by(column, value)))

    def events_for(
        self, *, action_id: str | None = None, approval_id: str | None = None
    ) -> tuple[Event, ...]:
        """The events of one action or one approval request, by id (by its index)."""
        column, value = _one_of(_EVENT_LOOKUPS, action_id=action_id, approval_id=approval_id)
        return tuple(self._read(lambda tx, now: tx.events_by(column, value)))

    # -- effects

    def iter_effects(
        self, state: EffectState | str | None = None, key_prefix: str | None = None,
        limit: int | None = None, *, page: int = PAGE,
    ) -> Iterator[EffectRecord]:  # fmt: skip
        """Effect records in creation order (``created_at``, then key): of ``state``, whose key
        starts with ``key_prefix`` (a literal prefix: no character is a wildcard), at most
        ``limit``; read a page at a time."""
        wanted = _effect_state(state)
        if key_prefix is not None and not isinstance(key_prefix, str):
            raise InvalidArgument(f"key_prefix must be a string or None, got {key_prefix!r}")
        low = key_prefix or None
        high = prefix_end(key_prefix) if key_prefix else None
        left = None if limit is None else _count(limit, "limit")
        size = _count(page, "page", minimum=1)
        after: tuple[str, str] | None = None
        while left is None or left > 0:
            want = size if left is None else min(size, left)
            rows = self._read(lambda tx, now: tx.effects_page(wanted, low, high, after, want))
            yield from rows
            if left is not None:
                left -= len(rows)
            if len(rows) < want:
                return
            last = rows[-1]
            after = (format_precise(last.created_at), last.effect_key)


def _seq_of(row: Row) -> int:
    """The row's own ``seq`` column (a document's ``seq`` may say otherwise)."""
    seq = row.seq if isinstance(row, UnreadableReceipt) else row.stored_seq
    if not isinstance(seq, int):
        seq = row.seq
    assert isinstance(seq, int), "a chained page holds only rows with a seq"
    return seq


def _one_of(allowed: tuple[str, ...], **given: str | None) -> tuple[str, str]:
    chosen = [(name, value) for name, value in given.items() if value is not None]
    if len(chosen) != 1:
        raise InvalidArgument(f"give exactly one of {', '.join(allowed)}")
    name, value = chosen[0]
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{name} must be a non-empty string, got {value!r}")
    return name, value
