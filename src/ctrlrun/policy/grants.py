"""The grant and its budgets: validated on construction, immutable, with their stored and
hashed forms."""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .patterns import pattern_problem
from ..action import canonical_bytes, freeze, thaw
from ..errors import PolicyError
from .conditions import (
    DATA_SCOPE,
    Condition,
    ConditionError,
    compile_condition,
    split_condition_key,
)
from .context import describe, type_name

__all__ = [
    "DELEGATION_ID",
    "MAX_WINDOW",
    "ROOT_ID",
    "Budget",
    "Grant",
    "GrantInvalid",
    "parse_expiry",
    "parse_window",
]

ROOT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
DELEGATION_ID = re.compile(r"dlg_[0-9a-f]{32}")
_DAY = 86_400
#: The longest budget window: 100 years of 365.25 days, in seconds.
MAX_WINDOW = 36_525 * _DAY
_WINDOW = re.compile(r"P(?:([0-9]+)D)?(?:T(?:([0-9]+)H)?(?:([0-9]+)M)?(?:([0-9]+)S)?)?")
_WINDOW_FORM = "P[nD][T[nH][nM][nS]] (P1D, PT24H, PT90S, P1DT2H)"

#: Action, resource and task patterns: which separator each uses.
SEPARATORS = {"actions": ".", "resources": ":", "tasks": ":"}


class GrantInvalid(PolicyError):
    """A grant value the authority rules refuse; ``key`` names the grant key at fault."""

    def __init__(self, label: str, key: str, detail: str) -> None:
        self.key = key
        self.detail = detail
        super().__init__(f"{label}: {detail}")


def parse_window(text: Any) -> int:
    """Seconds in an ISO-8601 duration ``P[nD][T[nH][nM][nS]]``, positive and at most 100 years."""
    if not isinstance(text, str):
        hint = " (numbers are refused; write PT90S or P1D)" if type(text) is int else ""
        raise PolicyError(
            f"window must be a duration string {_WINDOW_FORM}, got {describe(text)}{hint}"
        )
    match = _WINDOW.fullmatch(text) if len(text) <= 64 else None
    if match is None or not any(match.groups()) or text[-1:] == "T":
        raise PolicyError(
            f"window {text!r} is not a duration {_WINDOW_FORM}; months, weeks, years, fractions "
            "and lowercase letters are refused"
        )
    days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    total = days * _DAY + hours * 3600 + minutes * 60 + seconds
    if total <= 0:
        raise PolicyError(f"window {text!r} is zero; a budget window must be positive")
    if total > MAX_WINDOW:
        raise PolicyError(f"window {text!r} is longer than 100 years; shorten it")
    return total


def parse_expiry(value: Any) -> _dt.datetime:
    """An ``expires_at`` value: an ISO-8601 timestamp with an offset (text or a YAML datetime)."""
    moment: _dt.datetime | None = None
    if isinstance(value, _dt.datetime):
        moment = value
    elif isinstance(value, str):
        try:
            moment = _dt.datetime.fromisoformat(value)
        except ValueError:
            moment = None
    offset = moment.utcoffset() if moment is not None else None
    if moment is None or offset is None:
        if isinstance(value, _dt.datetime):
            shown = f"{value} (no offset)"
        elif isinstance(value, _dt.date):
            shown = f"the date {value} (no time, no offset)"
        else:
            shown = describe(value)
        raise PolicyError(
            "expires_at must be an ISO-8601 timestamp with a date, a time and an offset "
            f'(e.g. "2027-01-01T00:00:00Z" or "2027-01-01T09:00:00+02:00"), got {shown}'
        )
    return moment.replace(tzinfo=_dt.timezone(offset))


@dataclass(frozen=True, slots=True)
class Budget:
    """At most ``limit`` of ``metric`` (``count`` or an argument name) per rolling ``window``
    seconds."""

    metric: str
    limit: int
    window: int

    def __post_init__(self) -> None:
        label = "budget"
        if not isinstance(self.metric, str) or not self.metric.strip():
            raise GrantInvalid(
                label,
                "budgets",
                f"budget metric must be 'count' or an argument name, got {describe(self.metric)}",
            )
        if type(self.limit) is not int or self.limit < 0:
            raise GrantInvalid(
                label,
                "budgets",
                f"budget {self.metric!r} limit must be an integer of at least 0, got "
                f"{describe(self.limit)}; amounts are integer minor units",
            )
        if type(self.window) is not int or not 0 < self.window <= MAX_WINDOW:
            raise GrantInvalid(
                label,
                "budgets",
                f"budget {self.metric!r} window must be a positive number of seconds up to "
                f"100 years, got {describe(self.window)}",
            )

    def written(self) -> dict[str, Any]:
        """The stored and hashed form (window in seconds)."""
        return {"limit": self.limit, "metric": self.metric, "window": self.window}


def _patterns(label: str, key: str, value: Any, sep: str) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)):
        raise GrantInvalid(
            label, key, f"{key} must be a non-empty list of patterns, got {type_name(value)}"
        )
    items = tuple(value)
    if not items:
        raise GrantInvalid(label, key, f"{key} must not be empty; omit it or list patterns")
    for item in items:
        problem = pattern_problem(item, sep)
        if problem is not None:
            raise GrantInvalid(label, key, f"{key} pattern {item!r} {problem}")
    return items


def _subject(label: str, key: str, value: Any) -> None:
    if value is None:
        return
    problem = pattern_problem(value, "")
    if problem is not None:
        raise GrantInvalid(
            label, "subject", f"subject {key} {value!r} {problem} (a subject is one segment)"
        )


def _constraints(
    label: str, value: Any
) -> tuple[tuple[tuple[str, str, str, Any], ...], tuple[Condition, ...]]:
    if not isinstance(value, Mapping) or not value:
        raise GrantInvalid(
            label,
            "constraints",
            "constraints must be a non-empty mapping of conditions ({amount_lte: 50000}); "
            "omit it for none",
        )
    parts: list[tuple[str, str, str, Any]] = []
    checks: list[Condition] = []
    for key, operand in value.items():
        plain = thaw(operand)
        try:
            argument, op = split_condition_key(key)
            if argument == DATA_SCOPE:
                raise ConditionError(
                    f"condition key {key!r} tests data_scope, which policy derives and a grant "
                    "cannot see; constrain the arguments themselves"
                )
            _, check = compile_condition(key, plain)
        except ConditionError as exc:
            raise GrantInvalid(label, "constraints", f"constraints: {exc}") from None
        parts.append((key, argument, op, plain))
        checks.append(check)
    return tuple(parts), tuple(checks)


def _names(label: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)):
        raise GrantInvalid(
            label,
            "environments",
            f"environments must be a non-empty list of names, got {type_name(value)}",
        )
    items = tuple(value)
    if not items:
        raise GrantInvalid(label, "environments", "environments must not be empty; omit it for any")
    for item in items:
        if not isinstance(item, str) or not item.strip():
            raise GrantInvalid(
                label,
                "environments",
                f"environments item {describe(item)} must be a non-empty environment name",
            )
    return items


def _check_id(grant_id: Any) -> str:
    if not isinstance(grant_id, str):
        raise GrantInvalid("grant", "id", f"id must be a string, got {describe(grant_id)}")
    if grant_id == "" or DELEGATION_ID.fullmatch(grant_id):
        return "grant" if grant_id == "" else f"grant {grant_id!r}"
    label = f"grant {grant_id!r}"
    if ROOT_ID.fullmatch(grant_id) is None:
        raise GrantInvalid(
            label,
            "id",
            f"id {grant_id!r} must be a letter or digit followed by letters, digits, '.', '_' "
            "or '-'",
        )
    if grant_id[:4] == "dlg_":
        raise GrantInvalid(
            label, "id", f"id {grant_id!r} starts with 'dlg_', which delegations use; rename it"
        )
    return label


def _optional(value: Any) -> Any:
    return None if value is None else list(value)


@dataclass(frozen=True, slots=True, eq=False)
class Grant:
    """What a subject may propose: actions, and optionally resources, constraints,
    environments, tasks, budgets and an expiry. ``id`` is ``""`` for a child to delegate."""

    id: str
    agent: str | None
    user: str | None
    actions: tuple[str, ...]
    resources: tuple[str, ...] | None = None
    constraints: Mapping[str, Any] | None = None
    environments: tuple[str, ...] | None = None
    delegable: bool = False
    expires_at: _dt.datetime | None = None
    tasks: tuple[str, ...] | None = None
    budgets: tuple[Budget, ...] | None = None
    _parts: tuple[tuple[str, str, str, Any], ...] = field(
        default=(), init=False, repr=False, compare=False
    )
    _checks: tuple[Condition, ...] = field(default=(), init=False, repr=False, compare=False)
    _json: str = field(default="", init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        label = _check_id(self.id)
        set_ = object.__setattr__
        _subject(label, "agent", self.agent)
        _subject(label, "user", self.user)
        if self.agent is None and self.user is None:
            raise GrantInvalid(
                label,
                "subject",
                "subject names neither agent nor user; name an agent, a user or both "
                "({agent: support-bot})",
            )
        set_(self, "actions", _patterns(label, "actions", self.actions, "."))
        for key in ("resources", "tasks"):
            value = getattr(self, key)
            if value is not None:
                set_(self, key, _patterns(label, key, value, SEPARATORS[key]))
        if self.constraints is not None:
            parts, checks = _constraints(label, self.constraints)
            set_(self, "constraints", freeze({key: operand for key, _, _, operand in parts}))
            set_(self, "_parts", parts)
            set_(self, "_checks", checks)
        if self.environments is not None:
            set_(self, "environments", _names(label, self.environments))
        if type(self.delegable) is not bool:
            raise GrantInvalid(
                label,
                "delegable",
                f"delegable must be true or false, got {describe(self.delegable)}",
            )
        if self.expires_at is not None:
            if not isinstance(self.expires_at, _dt.datetime) or self.expires_at.utcoffset() is None:
                raise GrantInvalid(
                    label,
                    "expires_at",
                    f"expires_at must be a timezone-aware datetime, got {describe(self.expires_at)}",
                )
        elif self.delegable:
            raise GrantInvalid(
                label,
                "delegable",
                "delegable: true needs expires_at; a grant others can build on must end "
                '(add expires_at: "2027-01-01T00:00:00Z")',
            )
        if self.budgets is not None:
            budgets = tuple(self.budgets) if isinstance(self.budgets, (list, tuple)) else None
            if not budgets or not all(isinstance(b, Budget) for b in budgets):
                raise GrantInvalid(
                    label,
                    "budgets",
                    "budgets must be a non-empty list of budgets {metric, limit, window}; "
                    "omit it for none",
                )
            set_(self, "budgets", budgets)
        set_(self, "_json", canonical_bytes(self._form(written=True)).decode("utf-8"))

    def _form(self, *, written: bool) -> dict[str, Any]:
        constraints: Any = None
        if self.constraints is not None:
            constraints = (
                thaw(self.constraints)
                if written
                else {k: {"argument": a, "op": o, "operand": v} for k, a, o, v in self._parts}
            )
        return {
            "actions": list(self.actions),
            "budgets": None if self.budgets is None else [b.written() for b in self.budgets],
            "constraints": constraints,
            "delegable": self.delegable,
            "environments": _optional(self.environments),
            "expires_at": None if self.expires_at is None else self.expires_at.isoformat(),
            "resources": _optional(self.resources),
            "subject": {"agent": self.agent, "user": self.user},
            "tasks": _optional(self.tasks),
        }

    def to_json(self) -> str:
        """The stored ``grant_json``: compact sorted JSON of every key but ``id`` (absent ones
        null), ``expires_at`` with its offset, windows in seconds."""
        return self._json

    def hash_form(self) -> dict[str, Any]:
        """The grant as the policy hash sees it: constraints as argument, op and operand."""
        return self._form(written=False)

    def holds(self, arguments: Mapping[str, Any], action: str) -> bool:
        """Whether every constraint holds for ``arguments`` (each absent argument warned about)."""
        holds = True
        for check in self._checks:
            if not check(arguments, None, action):
                holds = False
        return holds

    def constraint_parts(self) -> tuple[tuple[str, str, str, Any], ...]:
        """Each constraint as ``(key, argument, op, operand)``, in written order."""
        return self._parts

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # rebuilt from its fields: the compiled constraints are closures and do not pickle
        return (
            Grant,
            (
                self.id,
                self.agent,
                self.user,
                self.actions,
                self.resources,
                None if self.constraints is None else thaw(self.constraints),
                self.environments,
                self.delegable,
                self.expires_at,
                self.tasks,
                self.budgets,
            ),
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Grant):
            return NotImplemented
        return self.id == other.id and self._json == other._json

    def __hash__(self) -> int:
        return hash((self.id, self._json))
