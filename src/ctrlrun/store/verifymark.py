"""The verified mark: the chain head ``(seq, hash)`` the last successful verification reached.

It lives in the store it describes (SQL: the one-row ``verified_mark`` table; memory: an
attribute of the store object) and is a convenience, not evidence: ``verify_chain(store,
since_verified=True)`` walks only what follows it. Only a successful check moves it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .._time import format_precise
from ..errors import InvalidArgument

if TYPE_CHECKING:
    from ..evidence.chain import ChainReport

__all__ = ["VerifiedMark", "mark_verified", "read_mark", "write_mark"]

MEMORY_ATTRIBUTE = "verified_mark"  # where an InMemoryStateStore keeps its mark
MARK_SELECT = "SELECT seq, hash, verified_at, acts_seq, acts_hash FROM verified_mark WHERE id = 1"  # SQLite


@dataclass(frozen=True, slots=True)
class VerifiedMark:
    """Where the last successful check ended: the head it verified, and when."""

    seq: int
    hash: str
    verified_at: str
    acts_seq: int | None = None  # the acts chain's head it verified too (None: not recorded)
    acts_hash: str | None = None


def mark_of(row: Any) -> VerifiedMark | None:
    """A ``(seq, hash, verified_at[, acts_seq, acts_hash])`` row as a mark (``None`` for no row)."""
    if row is None:
        return None
    acts = (int(row[3]), str(row[4])) if len(row) > 4 and row[3] is not None and row[4] is not None else (None, None)
    return VerifiedMark(int(row[0]), str(row[1]), str(row[2]), *acts)


def _kind(store: Any) -> str:
    from .memory import InMemoryStateStore
    from .sql import SQLStateStore

    if isinstance(store, InMemoryStateStore):
        return "memory"
    if isinstance(store, SQLStateStore):
        return str(store.engine.dialect.name)
    raise InvalidArgument(
        f"a verified mark needs a ctrlrun store (memory, sqlite://… or postgresql://…), got "
        f"{type(store).__name__}; verify_chain(store) without since_verified needs none"
    )


def read_mark(store: Any) -> VerifiedMark | None:
    """The store's verified mark, ``None`` when no check has succeeded on it yet."""
    kind = _kind(store)
    if kind == "memory":
        with store._lock:
            mark: VerifiedMark | None = getattr(store, MEMORY_ATTRIBUTE, None)
            return mark
    from sqlalchemy import select
    from sqlalchemy.exc import SQLAlchemyError

    from .schema import verified_mark

    table = verified_mark.c
    try:
        with store.engine.connect() as conn:
            row = conn.execute(
                select(table.seq, table.hash, table.verified_at, table.acts_seq, table.acts_hash).where(table.id == 1)
            ).first()
    except SQLAlchemyError as exc:
        raise store._driver_error(exc, "reading the verified mark") from None
    return mark_of(row)


def write_mark(
    store: Any, seq: int, hash: str, at: datetime, acts: tuple[int, str] | None = None
) -> VerifiedMark:
    """Set the mark to ``(seq, hash)`` (and the acts head it verified), verified ``at`` (one
    statement: it is written whole)."""
    mark = VerifiedMark(seq, hash, format_precise(at), *(acts or (None, None)))
    kind = _kind(store)
    if kind == "memory":
        with store._lock:
            setattr(store, MEMORY_ATTRIBUTE, mark)
        return mark
    from sqlalchemy.exc import SQLAlchemyError

    from .schema import verified_mark

    if kind == "sqlite":
        from sqlalchemy.dialects.sqlite import insert
    else:
        from sqlalchemy.dialects.postgresql import insert  # type: ignore[assignment]
    values = {"seq": mark.seq, "hash": mark.hash, "verified_at": mark.verified_at,
              "acts_seq": mark.acts_seq, "acts_hash": mark.acts_hash}  # fmt: skip
    statement = insert(verified_mark).values(id=1, **values)
    statement = statement.on_conflict_do_update(index_elements=["id"], set_=values)
    try:
        with store.engine.connect() as conn:
            conn.execute(statement)
            conn.commit()
    except SQLAlchemyError as exc:
        raise store._driver_error(exc, "moving the verified mark") from None
    return mark


def mark_verified(store: Any, report: ChainReport, at: datetime | None = None) -> VerifiedMark | None:
    """Move the mark to the head ``report`` verified; a failed check moves nothing (``None``)."""
    if not report.ok or report.head_hash is None:
        return None
    at = at if at is not None else store._now()  # the store's own clock
    acts = None
    if report.acts_head_seq is not None and report.acts_head_hash is not None:
        acts = (report.acts_head_seq, report.acts_head_hash)
    return write_mark(store, report.to_seq, report.head_hash, at, acts)
