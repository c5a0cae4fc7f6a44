"""Authority: grants, delegations, containment and budgets, resolved for one action."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from .resolve import DENIAL_REASONS, DIMENSIONS, Authority, Budget, Charge, Consumption, Delegation, DelegationRecord, Grant, Resolution, UnreadableDelegation, charges_for, check_delegation, containment, grant_from_mapping, grant_from_yaml, new_delegation_id, parse_window, pattern_contains, pattern_matches, read_delegation, resolve

_LAZY: dict[str, str] = {
    "DENIAL_REASONS": "resolve",
    "DIMENSIONS": "resolve",
    "Authority": "resolve",
    "Budget": "resolve",
    "Charge": "resolve",
    "Consumption": "resolve",
    "Delegation": "resolve",
    "DelegationRecord": "resolve",
    "Grant": "resolve",
    "Resolution": "resolve",
    "UnreadableDelegation": "resolve",
    "charges_for": "resolve",
    "check_delegation": "resolve",
    "containment": "resolve",
    "grant_from_mapping": "resolve",
    "grant_from_yaml": "resolve",
    "new_delegation_id": "resolve",
    "parse_window": "resolve",
    "pattern_contains": "resolve",
    "pattern_matches": "resolve",
    "read_delegation": "resolve",
    "resolve": "resolve",
}

__all__ = [
    "Authority",
    "Budget",
    "Charge",
    "Consumption",
    "DENIAL_REASONS",
    "DIMENSIONS",
    "Delegation",
    "DelegationRecord",
    "Grant",
    "Resolution",
    "UnreadableDelegation",
    "charges_for",
    "check_delegation",
    "containment",
    "grant_from_mapping",
    "grant_from_yaml",
    "new_delegation_id",
    "parse_window",
    "pattern_contains",
    "pattern_matches",
    "read_delegation",
    "resolve",
]

if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
