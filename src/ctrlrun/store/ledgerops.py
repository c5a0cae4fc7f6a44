"""The store API of delegation records and of the budget ledger, over ``_write``/``_read``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import TypeVar

from ..authority.ledger import Consumption, DelegationRecord
from .._time import format_precise
from ..evidence.acts import ActKind
from ..effects.records import check_line_text
from ..errors import InvalidArgument
from ..evidence.receipt import Event
from .evidenceops import record_act
from .ledger import check_delegation, check_filter, check_moment
from .rows import Tx
from .steps import _check_id, _stored, event_rows

__all__ = ["LedgerOps"]

T = TypeVar("T")


class LedgerOps:
    """Delegations (inserted once, revoked by compare-and-set, never deleted) and the ledger's
    rows, read back; part of every store through ``StoreOps``."""

    def _write(self, operation: Callable[[Tx, datetime], T]) -> T:  # pragma: no cover
        raise NotImplementedError

    def _read(self, operation: Callable[[Tx, datetime], T]) -> T:  # pragma: no cover
        raise NotImplementedError

    # -- delegations

    def put_delegation(
        self, record: DelegationRecord, *, events: Sequence[Event] = ()
    ) -> tuple[Event, ...]:
        """Insert a delegation and its events in one transaction: the events as stored (with
        their ids, for the sinks). A taken id is refused (``InvalidArgument``), never
        overwritten."""
        check_delegation(record)
        rows = event_rows(events)

        def put(tx: Tx, now: datetime) -> tuple[Event, ...]:
            if not tx.insert_delegation(record):
                raise InvalidArgument(
                    f"delegation {record.delegation_id} already exists; a delegation is "
                    "written once: mint a new id for a new delegation"
                )
            tx.returning = True
            stored = _stored(tx, rows, tx.insert_events(rows)) if rows else ()
            by = record.created_by_user or record.created_by_agent
            record_act(tx, now, ActKind.DELEGATE, record.delegation_id, by,
                       {"parent_id": record.parent_id, "depth": record.depth, "via": record.created_via})  # fmt: skip
            return stored

        return self._write(put)

    def get_delegation(self, delegation_id: str) -> DelegationRecord | None:
        _check_id(delegation_id, "delegation_id")
        return self._read(lambda tx, now: tx.delegation(delegation_id))

    def delegations(self, *, include_revoked: bool = False) -> tuple[DelegationRecord, ...]:
        """Every delegation (the revoked ones too with ``include_revoked``), in creation order."""
        if not isinstance(include_revoked, bool):
            raise InvalidArgument(f"include_revoked must be a bool, got {include_revoked!r}")
        return tuple(
            self._read(lambda tx, now: tx.list_delegations(include_revoked=include_revoked,
                                                            parent_id=None))
        )  # fmt: skip

    def delegations_for(self, parent_id: str) -> tuple[DelegationRecord, ...]:
        """The delegations made directly under ``parent_id`` (revoked ones included), in
        creation order."""
        _check_id(parent_id, "parent_id")
        return tuple(
            self._read(lambda tx, now: tx.list_delegations(include_revoked=True,
                                                            parent_id=parent_id))
        )  # fmt: skip

    def revoke_delegation(
        self,
        delegation_id: str,
        *,
        by: str,
        at: datetime,
        events: Callable[[DelegationRecord], Sequence[Event]] | None = None,
    ) -> bool:
        """Revoke by compare-and-set on ``revoked_at IS NULL``, writing ``events(revoked
        record)`` in the same transaction. False (nothing written) when it was revoked
        already; ``InvalidArgument`` for an unknown id. Of concurrent revokes, one is True."""
        _check_id(delegation_id, "delegation_id")
        check_line_text(by, "revoked_by")
        check_moment(at, "revoked at")

        def revoke(tx: Tx, now: datetime) -> bool:
            found = tx.delegation(delegation_id)
            if found is None:
                raise InvalidArgument(
                    f"no delegation {delegation_id} in this store; list them with "
                    "`ctrlrun inspect` or check the id"
                )
            if found.revoked_at is not None or not tx.revoke_delegation(delegation_id, by, at):
                return False
            if events is not None:
                revoked = replace(found, revoked_at=at, revoked_by=by)
                rows = event_rows(events(revoked))
                if rows:
                    tx.insert_events(rows)
            record_act(tx, now, ActKind.REVOKE, delegation_id, by, {"at": format_precise(at)})
            return True

        return self._write(revoke)

    # -- the ledger

    def consumptions(
        self,
        *,
        grant_id: str | None = None,
        metric: str | None = None,
        since: datetime | None = None,
        effect_key: str | None = None,
    ) -> tuple[Consumption, ...]:
        """The ledger rows (released ones too) matching every filter given, in insertion order;
        ``since``: consumed at or after it."""
        check_filter(grant_id, "grant_id")
        check_filter(metric, "metric")
        check_filter(effect_key, "effect_key")
        if since is not None:
            check_moment(since, "since")
        return tuple(
            self._read(
                lambda tx, now: tx.consumptions(
                    grant_id=grant_id, metric=metric, since=since, effect_key=effect_key
                )
            )
        )
