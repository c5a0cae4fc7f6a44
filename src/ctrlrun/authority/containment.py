"""Containment: whether a child grant stays inside its parent, dimension by dimension.

A child that leaves out something its parent constrains is refused, never inherited.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..policy.patterns import pattern_contains, pattern_matches
from ..policy.grants import Grant
from ..policy.conditions import strict_equal

__all__ = ["DIMENSIONS", "containment", "containment_problem"]

#: The dimensions, in the order they are checked.
DIMENSIONS = (
    "subject",
    "actions",
    "resources",
    "tasks",
    "constraints",
    "environments",
    "expires_at",
    "budgets",
)


def _concrete(name: str | None) -> bool:
    return name is not None and "*" not in name


def _subject(child: Grant, parent: Grant) -> str | None:
    if not _concrete(child.agent):
        return "the child must name one concrete agent (no '*')"
    if child.user is not None and not _concrete(child.user):
        return "a child user never has '*'; name one user"
    if parent.user is not None:
        if child.user is None:
            return f"the parent is limited to user {parent.user!r}; name that user"
        if not pattern_matches(parent.user, child.user, ""):
            return f"user {child.user!r} is not one the parent's {parent.user!r} allows"
    return None


def _patterns(
    child: tuple[str, ...] | None, parent: tuple[str, ...] | None, sep: str, key: str
) -> str | None:
    if parent is None:
        return None
    if child is None:
        return f"the parent limits {key} to {list(parent)}; list {key} within them"
    for pattern in child:
        if not any(pattern_contains(pattern, theirs, sep) for theirs in parent):
            return f"{pattern!r} is not inside any of the parent's {list(parent)}"
    return None


def _stricter(op: str, child: Any, parent: Any) -> bool:
    if op in ("lt", "lte"):
        return bool(child <= parent)
    if op in ("gt", "gte"):
        return bool(child >= parent)
    if op == "in":
        return all(any(strict_equal(item, theirs) for theirs in parent) for item in child)
    return strict_equal(child, parent)


def _constraints(child: Grant, parent: Grant) -> str | None:
    mine = {key: operand for key, _, _, operand in child.constraint_parts()}
    for key, _, op, operand in parent.constraint_parts():
        if key not in mine:
            return f"the parent requires {key}: {operand!r}; add it to the child"
        if not _stricter(op, mine[key], operand):
            return f"{key}: {mine[key]!r} is looser than the parent's {operand!r}"
    return None


def _environments(child: Grant, parent: Grant) -> str | None:
    if parent.environments is None:
        return None
    if child.environments is None:
        return f"the parent is limited to {list(parent.environments)}; list environments"
    extra = [name for name in child.environments if name not in parent.environments]
    return f"{extra} are not among the parent's {list(parent.environments)}" if extra else None


def _expires_at(child: Grant, parent: Grant) -> str | None:
    if parent.expires_at is None:
        return None
    if child.expires_at is None:
        return f"the parent expires at {parent.expires_at.isoformat()}; set expires_at"
    if child.expires_at > parent.expires_at:
        return (
            f"{child.expires_at.isoformat()} is later than the parent's "
            f"{parent.expires_at.isoformat()}"
        )
    return None


def _budgets(child: Grant, parent: Grant) -> str | None:
    for theirs in parent.budgets or ():
        if not any(
            mine.metric == theirs.metric
            and mine.limit <= theirs.limit
            and mine.window >= theirs.window
            for mine in child.budgets or ()
        ):
            return (
                f"the parent allows {theirs.limit} {theirs.metric} per {theirs.window}s; the "
                "child needs a budget on that metric with no larger limit and no shorter window"
            )
    return None


_CHECKS: tuple[tuple[str, Callable[[Grant, Grant], str | None]], ...] = (
    ("subject", _subject),
    ("actions", lambda c, p: _patterns(c.actions, p.actions, ".", "actions")),
    ("resources", lambda c, p: _patterns(c.resources, p.resources, ":", "resources")),
    ("tasks", lambda c, p: _patterns(c.tasks, p.tasks, ":", "tasks")),
    ("constraints", _constraints),
    ("environments", _environments),
    ("expires_at", _expires_at),
    ("budgets", _budgets),
)


def containment_problem(child: Grant, parent: Grant) -> tuple[str, str] | None:
    """The first dimension in which ``child`` is not inside ``parent`` and why, or ``None``."""
    for dimension, check in _CHECKS:
        problem = check(child, parent)
        if problem is not None:
            return dimension, problem
    return None


def containment(child: Grant, parent: Grant) -> str | None:
    """The first dimension in which ``child`` is not inside ``parent``, or ``None``."""
    found = containment_problem(child, parent)
    return found[0] if found else None
