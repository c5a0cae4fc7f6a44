"""The ``notifications`` rows of a SQL store, and the reads the console's notifier needs.

Reached through the store's engine, each write in a transaction of its own (``BEGIN IMMEDIATE``
on SQLite, ``BEGIN`` on Postgres), so nothing here grows the ``StateStore`` protocol or touches
the protected call's path. A claim is the row's ``INSERT … ON CONFLICT DO NOTHING``: one row per
``(subject_id, kind, target)``, whichever process inserts it first; a retry is taken by a
compare-and-set on ``next_attempt_at``, so one sender holds each attempt.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import Connection, select, update
from sqlalchemy.exc import SQLAlchemyError

from .._time import format_precise
from ..approvals.records import ApprovalStatus
from ..errors import InvalidArgument, StoreUnavailable
from ..evidence.receipt import Event, EventType, Receipt
from . import codec
from .schema import approvals, events, notifications, receipts
from .sql import SQLStateStore

__all__ = ["Notification", "NotificationRows"]

T = TypeVar("T")
_IN_BATCH = 200  # ids per IN (...) list: far below either dialect's parameter limit


@dataclass(frozen=True, slots=True)
class Notification:
    """One delivery claim and what became of it (times as the store writes them)."""

    delivery_id: str
    subject_id: str
    kind: str
    target: str
    body: str
    created_at: str
    attempts: int
    last_status: str | None
    last_attempt_at: str | None
    next_attempt_at: str | None
    delivered_at: str | None


_FIELDS = tuple(Notification.__dataclass_fields__)
assert _FIELDS == tuple(c.name for c in notifications.c)


def _ts(moment: datetime) -> str:
    return format_precise(moment)


class NotificationRows:
    """The notification claims of one SQLite or Postgres store (its engine and schema)."""

    def __init__(self, store: Any) -> None:
        if not isinstance(store, SQLStateStore):
            raise InvalidArgument(
                f"notifications need a SQLite or Postgres store (sqlite://… or postgresql://…), "
                f"got {type(store).__name__}; open the store by its URL"
            )
        self._engine = store.engine
        self._begin = store.BEGIN_WRITE
        self._dialect = store.engine.dialect.name

    # -- transactions

    @contextmanager
    def _connection(self, doing: str) -> Iterator[Connection]:
        try:
            with self._engine.connect() as conn:
                yield conn
        except SQLAlchemyError as exc:
            raise StoreUnavailable(
                f"the store could not be used while {doing} ({getattr(exc, 'orig', exc)}); "
                "nothing of it was kept: the notifier tries again on its next pass"
            ) from None

    def _write(self, doing: str, operation: Callable[[Connection], T]) -> T:
        with self._connection(doing) as conn:
            conn.exec_driver_sql(self._begin)
            try:
                result = operation(conn)
            except BaseException:
                conn.exec_driver_sql("ROLLBACK")
                raise
            conn.exec_driver_sql("COMMIT")
            return result

    def _read(self, doing: str, operation: Callable[[Connection], T]) -> T:
        with self._connection(doing) as conn:
            return operation(conn)

    def _insert(self) -> Any:
        if self._dialect == "sqlite":
            from sqlalchemy.dialects import sqlite

            return sqlite.insert(notifications)
        from sqlalchemy.dialects import postgresql

        return postgresql.insert(notifications)

    # -- claims

    def claim(
        self, *, delivery_id: str, subject_id: str, kind: str, target: str, body: str,
        now: datetime, hold_until: datetime, event: Event | None = None,
        while_pending: str | None = None,
    ) -> bool:  # fmt: skip
        """Insert the claim (held by the caller until ``hold_until``) and ``event`` with it, in
        one transaction; False, writing nothing, when the row exists or request
        ``while_pending`` is no longer pending."""

        def insert(conn: Connection) -> bool:
            if while_pending is not None:
                status = conn.execute(
                    select(approvals.c.status).where(approvals.c.approval_id == while_pending)
                ).scalar()
                if status != ApprovalStatus.PENDING.value:
                    return False
            statement = (
                self._insert()
                .values(delivery_id=delivery_id, subject_id=subject_id, kind=kind, target=target,
                        body=body, created_at=_ts(now), attempts=0,
                        next_attempt_at=_ts(hold_until))  # fmt: skip
                .on_conflict_do_nothing(index_elements=["subject_id", "kind", "target"])
                .returning(notifications.c.delivery_id)
            )
            if conn.execute(statement).first() is None:
                return False
            if event is not None:
                conn.execute(events.insert().values(**codec.event_to_row(event)))
            return True

        return self._write("claiming a notification", insert)

    def take_due(self, now: datetime, hold_until: datetime, limit: int = 50) -> list[Notification]:
        """The rows due by ``now`` that this caller now holds until ``hold_until`` (each taken by
        a compare-and-set on its ``next_attempt_at``, so no other sender takes it meanwhile)."""
        n = notifications.c
        due = self._read(
            "reading the notifications due",
            lambda conn: conn.execute(
                select(n.delivery_id, n.next_attempt_at)
                .where(n.next_attempt_at.is_not(None), n.next_attempt_at <= _ts(now))
                .order_by(n.next_attempt_at)
                .limit(limit)
            ).all(),
        )
        taken: list[Notification] = []
        for delivery_id, when in due:

            def take(conn: Connection, delivery_id: str = delivery_id, when: str = when) -> Any:
                return conn.execute(
                    update(notifications)
                    .where(n.delivery_id == delivery_id, n.next_attempt_at == when)
                    .values(next_attempt_at=_ts(hold_until))
                    .returning(*notifications.c)
                ).first()

            row = self._write("taking a notification to send", take)
            if row is not None:
                taken.append(Notification(*row))
        return taken

    def record_attempt(
        self, delivery_id: str, *, status: str, at: datetime, delivered: bool,
        next_attempt_at: datetime | None,
    ) -> None:  # fmt: skip
        """Keep one attempt's result on the row: its status, when, and what is due next."""
        n = notifications.c

        def record(conn: Connection) -> None:
            conn.execute(
                update(notifications)
                .where(n.delivery_id == delivery_id)
                .values(attempts=n.attempts + 1, last_status=status, last_attempt_at=_ts(at),
                        delivered_at=_ts(at) if delivered else None,
                        next_attempt_at=None if next_attempt_at is None else _ts(next_attempt_at))
            )  # fmt: skip

        self._write("recording a delivery attempt", record)

    def claimed(self, subject_ids: Iterable[str]) -> set[tuple[str, str, str]]:
        """The ``(subject_id, kind, target)`` claims that exist among ``subject_ids``."""
        n = notifications.c
        found: set[tuple[str, str, str]] = set()
        for batch in _batches(subject_ids):
            rows = self._read(
                "reading the notification claims",
                lambda conn, b=batch: conn.execute(  # type: ignore[misc]
                    select(n.subject_id, n.kind, n.target).where(n.subject_id.in_(b))
                ).all(),
            )
            found.update((r[0], r[1], r[2]) for r in rows)
        return found

    def rows(self) -> list[Notification]:
        """Every claim, oldest first (for operators and tests)."""
        n = notifications.c
        rows = self._read(
            "reading the notifications",
            lambda conn: conn.execute(
                select(*notifications.c).order_by(n.created_at, n.delivery_id)
            ).all(),
        )
        return [Notification(*row) for row in rows]

    # -- what the notifier tells about

    def requested_effect_keys(self, approval_ids: Iterable[str]) -> Mapping[str, str | None]:
        """Each request's effect key as its ``APPROVAL_REQUESTED`` event names it (requests
        whose event is not found are left out)."""
        e = events.c
        found: dict[str, str | None] = {}
        for batch in _batches(approval_ids):
            rows = self._read(
                "reading approval requests' events",
                lambda conn, b=batch: conn.execute(  # type: ignore[misc]
                    select(e.approval_id, e.effect_key).where(
                        e.type == EventType.APPROVAL_REQUESTED.value, e.approval_id.in_(b)
                    )
                ).all(),
            )
            found.update((r[0], r[1]) for r in rows)
        return found

    def latest_receipt(self, effect_key: str) -> Receipt | None:
        """The newest readable receipt of ``effect_key``, or None."""
        r = receipts.c
        row = self._read(
            "reading an effect's receipt",
            lambda conn: conn.execute(
                select(*receipts.c).where(r.effect_key == effect_key)
                .order_by(r.seq.desc()).limit(1)
            ).first(),
        )  # fmt: skip
        if row is None:
            return None
        receipt = codec.receipt_from_row(dict(row._mapping))
        return receipt if isinstance(receipt, Receipt) else None


def _batches(ids: Iterable[str]) -> Iterator[list[str]]:
    pending = sorted(set(ids))
    for start in range(0, len(pending), _IN_BATCH):
        yield pending[start : start + _IN_BATCH]
