"""What authority hands the store: budget charges, ledger rows and delegation records — pure.

The store keeps these rows and calls ``first_exhausted`` inside the reservation's own
transaction; ``ctrlrun.authority`` builds the charges and reads the delegation records back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

__all__ = [
    "CREATED_VIA",
    "Charge",
    "Consumption",
    "DelegationRecord",
    "first_exhausted",
    "ledger_rows",
]

#: How a delegation can have been made.
CREATED_VIA = ("api", "cli")


@dataclass(frozen=True, slots=True)
class Charge:
    """One budget of one grant, measured on one call: ``amount`` of ``metric`` against
    ``limit`` over the last ``window`` seconds."""

    grant_id: str
    metric: str
    amount: int
    limit: int
    window: int


@dataclass(frozen=True, slots=True)
class Consumption:
    """One ledger row: a charge taken by one attempt of one effect key, released (never
    deleted) when that attempt's record moves to ``failed``."""

    id: int
    grant_id: str
    metric: str
    amount: int
    effect_key: str
    attempt: int
    consumed_at: datetime
    released_at: datetime | None


@dataclass(frozen=True, slots=True)
class DelegationRecord:
    """A delegation as the store keeps it; ``ctrlrun.authority`` re-validates ``grant_json``
    on every read (a row that does not parse denies every action)."""

    delegation_id: str
    parent_id: str
    depth: int
    grant_json: str
    created_by_agent: str
    created_by_user: str | None
    created_via: str
    created_at: datetime
    revoked_at: datetime | None = None
    revoked_by: str | None = None


def first_exhausted(charges: Sequence[Charge], spent: Callable[[str, str, int], int]) -> Charge | None:
    """The first charge that does not fit (``spent + amount > limit``), or ``None``.

    ``spent(grant_id, metric, window)`` is the sum of the un-released ledger rows of that grant
    and metric consumed within the last ``window`` seconds, read before this call's rows exist.
    """
    for charge in charges:
        if spent(charge.grant_id, charge.metric, charge.window) + charge.amount > charge.limit:
            return charge
    return None


def ledger_rows(charges: Sequence[Charge]) -> list[tuple[str, str, int]]:
    """The ``(grant_id, metric, amount)`` rows a passing set of charges writes, in charge order:
    one per grant and metric (two budgets on one metric measure one amount)."""
    rows: list[tuple[str, str, int]] = []
    seen: set[tuple[str, str]] = set()
    for charge in charges:
        if (charge.grant_id, charge.metric) not in seen:
            seen.add((charge.grant_id, charge.metric))
            rows.append((charge.grant_id, charge.metric, charge.amount))
    return rows
