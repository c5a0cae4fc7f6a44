"""What authority needs of a store: delegation records and the budget ledger read back (the
charges are taken with the reservation, ``StateStore.start_attempt(charges=...)``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Protocol, runtime_checkable

from ..evidence.receipt import Event
from .ledger import Consumption, DelegationRecord

__all__ = ["AuthorityStore"]


@runtime_checkable
class AuthorityStore(Protocol):
    """Delegations (put, read, walked, revoked) and the ledger's rows."""

    def put_delegation(
        self, record: DelegationRecord, *, events: Sequence[Event] = ()
    ) -> tuple[Event, ...]:
        """Insert a delegation with its events (handed back stored); a taken id is
        ``InvalidArgument``."""
        ...

    def get_delegation(self, delegation_id: str) -> DelegationRecord | None: ...

    def delegations(self, *, include_revoked: bool = False) -> tuple[DelegationRecord, ...]:
        """In creation order (``created_at``, then id)."""
        ...

    def delegations_for(self, parent_id: str) -> tuple[DelegationRecord, ...]:
        """The delegations made directly under ``parent_id``, revoked ones too."""
        ...

    def revoke_delegation(
        self,
        delegation_id: str,
        *,
        by: str,
        at: datetime,
        events: Callable[[DelegationRecord], Sequence[Event]] | None = None,
    ) -> bool:
        """Compare-and-set on not revoked, with ``events(revoked record)`` in its transaction;
        False (nothing written) if it was revoked already, ``InvalidArgument`` if unknown."""
        ...

    def consumptions(
        self,
        *,
        grant_id: str | None = None,
        metric: str | None = None,
        since: datetime | None = None,
        effect_key: str | None = None,
    ) -> tuple[Consumption, ...]:
        """Ledger rows (released ones too), in insertion order."""
        ...
