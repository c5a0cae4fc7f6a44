"""Stored delegations read back and walked to their root: the part of authority that sees the
store's rows (never the store itself)."""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import Any, cast

from .containment import containment
from .ledger import CREATED_VIA, DelegationRecord
from ..action import Principal
from ..errors import CTRLRunError
from ..policy.grants import DELEGATION_ID, ROOT_ID, Grant
from ..policy.authority import grant_from_json

__all__ = [
    "Delegation",
    "Graph",
    "UnreadableDelegation",
    "Walk",
    "new_delegation_id",
    "read_delegation",
    "read_graph",
    "walk",
]


class UnreadableDelegation(CTRLRunError):
    """A stored delegation row that does not read back as one; while it exists every action is
    denied (``authority_unreadable``)."""

    def __init__(self, delegation_id: Any, problem: str) -> None:
        self.delegation_id = delegation_id if isinstance(delegation_id, str) else None
        self.problem = problem
        super().__init__(
            f"delegation {delegation_id!r} cannot be read: {problem}; every action is denied "
            "until the row is repaired or removed (ctrlrun did not write it this way)"
        )


@dataclass(frozen=True, slots=True)
class Delegation:
    """A grant delegated under ``parent_id``; its ``grant.id`` is ``delegation_id``."""

    delegation_id: str
    parent_id: str
    depth: int
    grant: Grant
    created_by: Principal
    created_via: str
    created_at: datetime
    revoked_at: datetime | None = None
    revoked_by: str | None = None


def new_delegation_id() -> str:
    """A fresh delegation id: ``dlg_`` + 32 lowercase hex (128 random bits)."""
    return "dlg_" + secrets.token_hex(16)


@lru_cache(maxsize=4096)
def _grant_of(text: str, delegation_id: str) -> Grant:
    return grant_from_json(text, delegation_id)


def _aware(value: Any) -> bool:
    return isinstance(value, datetime) and value.utcoffset() is not None


def read_delegation(record: DelegationRecord) -> Delegation:
    """The ``Delegation`` a stored row holds, re-validated; ``UnreadableDelegation`` if the row
    does not parse, has a malformed id or parent, or an unknown ``created_via``."""
    raw_id = getattr(record, "delegation_id", None)

    def bad(problem: str) -> UnreadableDelegation:
        return UnreadableDelegation(raw_id, problem)

    if not isinstance(raw_id, str) or DELEGATION_ID.fullmatch(raw_id) is None:
        raise bad("its id does not match dlg_ + 32 lowercase hex")
    parent = getattr(record, "parent_id", None)
    if not isinstance(parent, str) or ROOT_ID.fullmatch(parent) is None:
        raise bad(f"its parent_id {parent!r} is not a grant id")
    if parent[:4] == "dlg_" and DELEGATION_ID.fullmatch(parent) is None:
        raise bad(f"its parent_id {parent!r} is not a delegation id")
    depth = getattr(record, "depth", None)
    if type(depth) is not int or depth < 1:
        raise bad(f"its depth {depth!r} is not a positive integer")
    via = getattr(record, "created_via", None)
    if via not in CREATED_VIA:
        raise bad(f"created_via {via!r} is not one of {', '.join(CREATED_VIA)}")
    created_at = getattr(record, "created_at", None)
    revoked_at = getattr(record, "revoked_at", None)
    revoked_by = getattr(record, "revoked_by", None)
    if not _aware(created_at):
        raise bad("created_at is not a timezone-aware datetime")
    if revoked_at is not None and not _aware(revoked_at):
        raise bad("revoked_at is not a timezone-aware datetime")
    if revoked_by is not None and not isinstance(revoked_by, str):
        raise bad("revoked_by is not text")
    try:
        creator = Principal(
            agent=getattr(record, "created_by_agent", None),  # type: ignore[arg-type]
            user=getattr(record, "created_by_user", None),
        )
        grant = _grant_of(getattr(record, "grant_json", None), raw_id)
    except (CTRLRunError, TypeError, ValueError) as exc:
        raise bad(str(exc)) from None
    return Delegation(
        raw_id,
        parent,
        depth,
        grant,
        creator,
        via,
        cast(datetime, created_at),
        revoked_at,
        revoked_by,
    )


@dataclass(frozen=True, slots=True)
class Graph:
    """Every stored delegation that reads back, by id, and what makes the store unreadable."""

    nodes: Mapping[str, Delegation]
    unreadable: tuple[UnreadableDelegation, ...]
    cycle_at: str | None

    @property
    def broken(self) -> bool:
        """Whether some row is unreadable or the rows form a cycle."""
        return bool(self.unreadable) or self.cycle_at is not None


def _cycle_at(nodes: Mapping[str, Delegation], roots: Mapping[str, Grant]) -> str | None:
    """The smallest id on a cycle of parent links, or ``None`` (a root id ends every walk)."""
    done: set[str] = set()
    found: list[str] = []
    for start in sorted(nodes):
        path: list[str] = []
        on_path: set[str] = set()
        current: str | None = start
        while current is not None and current not in done and current not in roots:
            if current in on_path:
                found.extend(path[path.index(current) :])
                break
            node = nodes.get(current)
            if node is None:
                break
            path.append(current)
            on_path.add(current)
            current = node.parent_id
        done.update(path)
    return min(found) if found else None


def read_graph(records: Sequence[DelegationRecord], roots: Mapping[str, Grant]) -> Graph:
    """Read every record; unreadable rows, repeated ids and cycles are reported, not raised."""
    nodes: dict[str, Delegation] = {}
    unreadable: list[UnreadableDelegation] = []
    for record in records:
        try:
            delegation = read_delegation(record)
        except UnreadableDelegation as exc:
            unreadable.append(exc)
            continue
        if delegation.delegation_id in nodes:
            unreadable.append(UnreadableDelegation(delegation.delegation_id, "its id repeats"))
            continue
        nodes[delegation.delegation_id] = delegation
    unreadable.sort(key=lambda exc: exc.delegation_id or "")
    return Graph(nodes, tuple(unreadable), _cycle_at(nodes, roots))


def _expired(grant: Grant, now: datetime) -> bool:
    return grant.expires_at is not None and now > grant.expires_at


@dataclass(frozen=True, slots=True)
class Walk:
    """A delegation walked to its root: the first failure (reason and detail), the walked
    depth, and the chain of grants nearest-first (ending at the root when it was reached)."""

    reason: str | None
    detail: Mapping[str, Any] = field(default_factory=dict)
    depth: int | None = None
    chain: tuple[Grant, ...] = ()


def walk(
    start: Delegation, roots: Mapping[str, Grant], graph: Graph, max_depth: int, now: datetime
) -> Walk:
    """Walk from ``start`` to its root in at most ``max_depth + 1`` steps; the first failure
    wins in this order: missing or unreadable ancestor, revoked node, expired ancestor, a step
    not contained, cycle or too deep, an undelegable ancestor."""
    nodes = [start]
    seen = {start.delegation_id}
    root: Grant | None = None
    stop: tuple[str, str] | None = None
    current = start
    for _ in range(max_depth + 1):
        parent_id = current.parent_id
        root = roots.get(parent_id)
        if root is not None:
            break
        if parent_id in seen:
            stop = ("cycle", parent_id)
            break
        node = graph.nodes.get(parent_id)
        if node is None:
            unread = any(exc.delegation_id == parent_id for exc in graph.unreadable)
            stop = ("unreadable" if unread else "missing", parent_id)
            break
        seen.add(parent_id)
        nodes.append(node)
        current = node
    grants = tuple(node.grant for node in nodes) + ((root,) if root is not None else ())
    depth = len(nodes) if root is not None else None
    if stop is not None and stop[0] == "missing":
        return Walk("authority_escalation", {"missing_parent_id": stop[1]})
    if stop is not None and stop[0] == "unreadable":
        return Walk("authority_unreadable")
    if any(node.revoked_at is not None for node in nodes):
        return Walk("authority_revoked", depth=depth)
    for ancestor in grants[1:]:
        if _expired(ancestor, now):
            return Walk("authority_escalation", {"expired_parent_id": ancestor.id}, depth)
    for child, parent in zip(grants, grants[1:]):
        dimension = containment(child, parent)
        if dimension is not None:
            return Walk("authority_escalation", {"dimension": dimension}, depth)
    if stop is not None:
        return Walk("authority_unreadable", {"cycle_at": stop[1]})
    if depth is None or depth > max_depth:
        return Walk("authority_escalation", {"depth_exceeded": max_depth}, depth)
    if not all(ancestor.delegable for ancestor in grants[1:]):
        return Walk("authority_escalation", {}, depth)
    return Walk(None, {}, depth, grants)
