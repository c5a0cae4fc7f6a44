"""The verified mark: the chain head ``(seq, hash)`` the last successful verification reached.

It lives in the store it describes (SQL: the one-row ``verified_mark`` table; memory: an
attribute of the store object) and is a convenience, not evidence: ``verify_chain(store,
since_verified=True)`` walks only what follows it. Only a successful check moves it.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from .._time import format_precise
from ..errors import InvalidArgument
from .marks import MEMORY_ATTRIBUTE, VerifiedMark, mark_of

if TYPE_CHECKING:
    from ..evidence.chain import ChainReport

__all__ = ["VerifiedMark", "mark_verified", "read_mark", "verify_and_mark", "write_mark"]

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


def verify_and_mark(store: Any, *, since_verified: bool = False, at: datetime | None = None) -> ChainReport:
    """``verify_chain``, then the mark moved to the head it verified when the check passed."""
    from .verify import verify_chain  # the check reads the mark; it never moves it

    report = verify_chain(store, since_verified=since_verified)
    mark_verified(store, report, at)
    return report
