"""Authority: whether a principal may propose an action at all, and how much of it.

Pure rules over the policy's grants and the store's delegation rows: resolving an action,
checking a new delegation, and the budget charges a passing action takes.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any, NoReturn

from .containment import DIMENSIONS, containment, containment_problem
from .delegations import (
    Delegation,
    Graph,
    UnreadableDelegation,
    new_delegation_id,
    read_delegation,
    read_graph,
    walk,
)
from .ledger import Charge, Consumption, DelegationRecord
from ..policy.patterns import pattern_contains, pattern_matches
from ..action import Action, Principal, thaw
from ..errors import ActionDenied, AuthorityEscalation, InvalidArgument, PolicyError
from ..policy.grants import DELEGATION_ID, Budget, Grant, parse_window
from ..policy.authority import (
    DEFAULT_MAX_DEPTH,
    grant_from_mapping,
    grant_from_yaml,
    hash_member,
    parse_section,
)
from ..policy.conditions import canonical_value
from ..policy.context import SCHEMAS, LoadContext

__all__ = [
    "DENIAL_REASONS",
    "DIMENSIONS",
    "Authority",
    "Budget",
    "Charge",
    "Consumption",
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

#: Denial reasons, the one reported first when several candidates fail.
DENIAL_REASONS = (
    "authority_unreadable",
    "authority_escalation",
    "authority_revoked",
    "authority_expired",
    "authority_task",
    "authority_constraint",
    "no_authority",
)
logger = logging.getLogger("ctrlrun.authority")
_RANK = {reason: rank for rank, reason in enumerate(DENIAL_REASONS)}
PASSED = "authority_grant"


@dataclass(frozen=True, slots=True)
class Authority:
    """The root grants of a policy (document order) and how deep delegation may go."""

    max_delegation_depth: int = DEFAULT_MAX_DEPTH
    grants: tuple[Grant, ...] = ()
    _roots: Mapping[str, Grant] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        depth = self.max_delegation_depth
        if type(depth) is not int or depth < 0:
            raise PolicyError(
                f"max_delegation_depth must be an integer of at least 0, got {depth!r}"
            )
        if not isinstance(self.grants, (list, tuple)):
            raise PolicyError(f"grants must be a list of Grant, got {type(self.grants).__name__}")
        roots: dict[str, Grant] = {}
        for grant in self.grants:
            if not isinstance(grant, Grant):
                raise PolicyError(f"grants must hold Grant values, got {grant!r}")
            if grant.id == "" or DELEGATION_ID.fullmatch(grant.id):
                raise PolicyError(
                    f"a root grant needs its own id (not {grant.id!r}); name it, e.g. "
                    "id='head-of-support'"
                )
            if grant.id in roots:
                raise PolicyError(f"grant id {grant.id!r} is used twice; rename one")
            roots[grant.id] = grant
        object.__setattr__(self, "grants", tuple(self.grants))
        object.__setattr__(self, "_roots", MappingProxyType(roots))

    @classmethod
    def from_section(cls, section: Mapping[str, Any]) -> Authority:
        """The authority of a loaded ``authority:`` section (``Policy.authority``)."""
        plain = thaw(section) if isinstance(section, Mapping) else section
        ctx = LoadContext(source="authority section", level=len(SCHEMAS))
        depth, grants = parse_section(ctx, plain)
        return cls(depth, grants)

    def root(self, grant_id: str) -> Grant | None:
        """The root grant named ``grant_id``, or ``None``."""
        return self._roots.get(grant_id)

    def hash_member(self) -> dict[str, Any]:
        """This authority as the policy hash's ``authority`` member."""
        return hash_member(self.max_delegation_depth, self.grants)


# -- resolution -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Resolution:
    """What authority says about one action: passed or the denial reason, the grant reported,
    and (on a pass) the chain to charge, the passing grant first and its root last."""

    passed: bool
    reason: str
    grant_id: str | None = None
    delegation_id: str | None = None
    depth: int | None = None
    detail: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    chain: tuple[Grant, ...] = ()

    def event_data(self) -> dict[str, Any]:
        """The ``AUTHORITY_RESOLVED`` / ``AUTHORITY_DENIED`` event data (absent keys left out)."""
        data: dict[str, Any] = {"reason": self.reason}
        for key in ("grant_id", "delegation_id", "depth"):
            value = getattr(self, key)
            if value is not None:
                data[key] = value
        data.update(self.detail)
        return data


def _denied(
    reason: str,
    grant_id: str | None = None,
    delegation_id: str | None = None,
    depth: int | None = None,
    detail: Mapping[str, Any] | None = None,
) -> Resolution:
    return Resolution(
        False, reason, grant_id, delegation_id, depth, MappingProxyType(dict(detail or {}))
    )


def _subject_matches(grant: Grant, principal: Principal) -> bool:
    if grant.agent is not None and not pattern_matches(grant.agent, principal.agent, ""):
        return False
    if grant.user is not None:
        return principal.user is not None and pattern_matches(grant.user, principal.user, "")
    return True


def _shape_matches(grant: Grant, action: Action, environment: str) -> bool:
    if not _subject_matches(grant, action.principal):
        return False
    if not any(pattern_matches(p, action.name, ".") for p in grant.actions):
        return False
    if grant.resources is not None:
        resource = action.resource
        if resource is None or not any(pattern_matches(p, resource, ":") for p in grant.resources):
            return False
    return grant.environments is None or environment in grant.environments


def _own_rules(grant: Grant, action: Action, task: str | None, now: datetime) -> str | None:
    """The grant's own expiry, task rule and constraints: the first failing reason, or None."""
    if grant.expires_at is not None and now > grant.expires_at:
        return "authority_expired"
    if grant.tasks is not None and (
        not isinstance(task, str) or not any(pattern_matches(p, task, ":") for p in grant.tasks)
    ):
        return "authority_task"
    if not grant.holds(action.arguments, action.name):
        return "authority_constraint"
    return None


def _unreadable(graph: Graph) -> Resolution:
    if graph.unreadable:
        return _denied("authority_unreadable", delegation_id=graph.unreadable[0].delegation_id)
    return _denied("authority_unreadable", detail={"cycle_at": graph.cycle_at})


def _resolve(
    authority: Authority,
    records: Sequence[DelegationRecord],
    action: Action,
    environment: str,
    task: str | None,
    now: datetime,
) -> Resolution:
    roots = authority._roots
    graph = read_graph(records, roots)
    if graph.broken:
        return _unreadable(graph)
    passing: list[Resolution] = []
    failing: list[tuple[int, str, Resolution]] = []
    for grant in authority.grants:
        if not _shape_matches(grant, action, environment):
            continue
        reason = _own_rules(grant, action, task, now)
        if reason is None:
            passing.append(Resolution(True, PASSED, grant.id, chain=(grant,)))
        else:
            failing.append((_RANK[reason], grant.id, _denied(reason, grant.id)))
    for delegation_id, delegation in graph.nodes.items():
        grant = delegation.grant
        if not _shape_matches(grant, action, environment):
            continue
        walked = walk(delegation, roots, graph, authority.max_delegation_depth, now)
        if walked.reason is not None:
            denial = _denied(
                walked.reason, delegation_id, delegation_id, walked.depth, walked.detail
            )
            failing.append((_RANK[walked.reason], delegation_id, denial))
            continue
        reason = _own_rules(grant, action, task, now)
        if reason is None:
            passing.append(
                Resolution(
                    True, PASSED, delegation_id, delegation_id, walked.depth, chain=walked.chain
                )
            )
        else:
            denial = _denied(reason, delegation_id, delegation_id, walked.depth)
            failing.append((_RANK[reason], delegation_id, denial))
    if passing:
        return min(passing, key=lambda resolution: resolution.grant_id or "")
    if failing:
        return min(failing, key=lambda item: (item[0], item[1]))[2]
    return _denied("no_authority")


def resolve(
    authority: Authority,
    records: Sequence[DelegationRecord],
    *,
    action: Action,
    environment: str,
    task: str | None,
    now: datetime,
) -> Resolution:
    """Whether some grant or stored delegation lets ``action`` through; never raises (a fault
    denies as ``authority_unreadable``)."""
    try:
        return _resolve(authority, records, action, environment, task, now)
    except Exception:  # authority must fail closed, never raise
        logger.exception("authority resolution failed; denying")
        return _denied("authority_unreadable")


# -- delegation -------------------------------------------------------------------------------


def _escalation(
    reason: str, parent_id: str, message: str, dimension: str | None = None
) -> NoReturn:
    raise AuthorityEscalation(
        f"delegation under {parent_id!r} refused: {reason}: {message}",
        reason=reason,
        parent_id=parent_id,
        dimension=dimension,
    )


def _parent(
    authority: Authority, records: Sequence[DelegationRecord], graph: Graph, parent_id: str
) -> Grant | Delegation | None:
    """The parent named ``parent_id`` (a root wins a collision), ``None`` when there is no
    such grant or unrevoked delegation; check 1."""
    root = authority.root(parent_id)
    if root is not None:
        return root
    node = graph.nodes.get(parent_id)
    if node is not None:
        return node if node.revoked_at is None else None
    for record in records:  # an unreadable row still names its id and revocation
        if getattr(record, "delegation_id", None) == parent_id:
            if getattr(record, "revoked_at", None) is None:
                _escalation(
                    "parent_not_valid",
                    parent_id,
                    "the parent's stored row cannot be read; repair or remove it",
                )
    return None


def check_delegation(
    authority: Authority,
    records: Sequence[DelegationRecord],
    parent_id: str,
    child: Grant,
    by: Principal,
    now: datetime,
) -> int:
    """Check that ``by`` may delegate ``child`` under ``parent_id``; returns the child's depth,
    or raises ``AuthorityEscalation`` with the first failing check's reason."""
    if not isinstance(child, Grant) or child.id != "":
        raise InvalidArgument(
            "the child must be a Grant with id='' (grant_from_yaml builds one); the Control "
            "mints its dlg_ id"
        )
    if not isinstance(by, Principal):
        raise InvalidArgument(f"by must be a Principal, got {type(by).__name__}")
    if not isinstance(parent_id, str) or parent_id == "":
        raise InvalidArgument("parent_id must be a root grant id or a dlg_ delegation id")
    graph = read_graph(records, authority._roots)
    found = _parent(authority, records, graph, parent_id)
    if found is None:
        _escalation(
            "unknown_parent",
            parent_id,
            "no root grant or unrevoked delegation has this id; check the id (ctrlrun inspect)",
        )
    parent = found.grant if isinstance(found, Delegation) else found
    if not parent.delegable:
        _escalation(
            "parent_not_delegable",
            parent_id,
            "the parent grant is not delegable; delegate from a grant with delegable: true",
        )
    if graph.broken:
        culprit = graph.unreadable[0].delegation_id if graph.unreadable else graph.cycle_at
        _escalation(
            "parent_not_valid",
            parent_id,
            f"the store holds an unreadable delegation ({culprit!r}), so every action is denied; "
            "repair or remove that row first",
        )
    if parent.expires_at is not None and now > parent.expires_at:
        _escalation(
            "parent_not_valid",
            parent_id,
            f"the parent expired at {parent.expires_at.isoformat()}; delegate from a live grant",
        )
    depth = 0
    if isinstance(found, Delegation):
        walked = walk(found, authority._roots, graph, authority.max_delegation_depth, now)
        if walked.reason is not None and "depth_exceeded" not in walked.detail:
            detail = ", ".join(f"{k} {v!r}" for k, v in walked.detail.items())
            _escalation(
                "parent_not_valid",
                parent_id,
                f"the parent's chain is no longer valid ({walked.reason}"
                + (f", {detail}" if detail else "")
                + "); delegate from a valid grant",
            )
        depth = walked.depth if walked.depth is not None else authority.max_delegation_depth + 1
    if not _subject_matches(parent, by):
        _escalation(
            "not_the_subject",
            parent_id,
            f"{by.agent!r}" + (f" / {by.user!r}" if by.user else "") + " is not the parent's "
            "subject; only the subject a grant names may delegate it",
        )
    if depth + 1 > authority.max_delegation_depth:
        _escalation(
            "max_depth",
            parent_id,
            f"the child would be at depth {depth + 1}, beyond max_delegation_depth "
            f"{authority.max_delegation_depth}; delegate from a grant nearer the root",
        )
    problem = containment_problem(child, parent)
    if problem is not None:
        dimension, why = problem
        _escalation(
            "containment",
            parent_id,
            f"the child widens the parent in {dimension} ({why}); narrow the child's "
            f"{dimension} to within the parent's",
            dimension,
        )
    return depth + 1


# -- budgets ----------------------------------------------------------------------------------

_MISSING = object()


def _amount(metric: str, arguments: Mapping[str, Any]) -> int | str:
    """The amount ``metric`` measures on this call, or a phrase saying why it cannot."""
    if metric == "count":
        return 1
    value = arguments.get(metric, _MISSING)
    if value is _MISSING:
        return f"the call has no argument {metric!r}"
    value = canonical_value(value)
    if type(value) is not int:
        return f"argument {metric!r} is {type(value).__name__}, not an integer"
    if value < 0:
        return f"argument {metric!r} is negative"
    return value


def charges_for(
    resolution: Resolution,
    arguments: Mapping[str, Any],
    effect_key: str | None,
    *,
    action_id: str | None = None,
) -> tuple[Charge, ...]:
    """One charge per budget of the passing grant, then of each ancestor nearest-first; ``()``
    when none has budgets. Raises ``ActionDenied`` (``budget_unkeyed``, ``budget_unmeasurable``)."""
    budgeted = [(grant, budget) for grant in resolution.chain for budget in grant.budgets or ()]
    if not resolution.passed or not budgeted:
        return ()
    if effect_key is None:
        grant, budget = budgeted[0]
        raise ActionDenied(
            f"budget_unkeyed: grant {grant.id!r} budgets {budget.metric!r}, but this call has no "
            "effect key, so its charge could not be held or released; give the action an "
            "effect: template",
            reason="budget_unkeyed",
            action_id=action_id,
        )
    charges: list[Charge] = []
    for grant, budget in budgeted:
        amount = _amount(budget.metric, arguments)
        if isinstance(amount, str):
            raise ActionDenied(
                f"budget_unmeasurable: grant {grant.id!r} budgets {budget.metric!r}, but {amount}; "
                f"pass {budget.metric!r} as a non-negative integer (minor units for money)",
                reason="budget_unmeasurable",
                action_id=action_id,
            )
        charges.append(Charge(grant.id, budget.metric, amount, budget.limit, budget.window))
    return tuple(charges)
