"""Conditions: parse ``<argument>_<op>`` keys, check operands, compile them to closures."""

from __future__ import annotations

import datetime as _dt
import logging
import operator
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from .context import describe, type_name

__all__ = [
    "OPERATORS",
    "RESERVED_SUBJECTS",
    "Condition",
    "ConditionError",
    "canonical_value",
    "check_operand_value",
    "compile_condition",
    "split_condition_key",
    "strict_equal",
]

logger = logging.getLogger("ctrlrun.policy")

OPERATORS: tuple[str, ...] = ("eq", "neq", "lt", "lte", "gt", "gte", "in")
NUMERIC_OPERATORS = frozenset({"lt", "lte", "gt", "gte"})
RESERVED_SUBJECTS = frozenset(
    {
        "action_id",
        "agent",
        "claims",
        "environment",
        "expires_at",
        "issuer",
        "principal",
        "resource",
        "user",
    }
)
DATA_SCOPE = "data_scope"

#: A compiled condition: ``(arguments, data_scope_or_None, action_name) -> holds``.
Condition = Callable[[Mapping[str, Any], "frozenset[str] | None", str], bool]

_MINOR_UNITS = "amounts are integer minor units (write 50000 for 500.00)"


class ConditionError(ValueError):
    """A condition key or operand the policy language does not allow."""


# -- strict equality ------------------------------------------------------------------------

_BOOL, _INT, _STR, _NULL, _LIST, _MAP, _OTHER = range(7)
_KINDS: dict[type, int] = {
    bool: _BOOL,
    int: _INT,
    str: _STR,
    type(None): _NULL,
    list: _LIST,
    tuple: _LIST,
    dict: _MAP,
    MappingProxyType: _MAP,
}
_SCALARS = frozenset({_BOOL, _INT, _STR, _NULL})


def _kind(value: Any) -> int:
    return _KINDS.get(type(value), _OTHER)


def strict_equal(a: Any, b: Any) -> bool:
    """Type-strict equality: ``True`` never equals ``1``; containers compare item by item."""
    ka, kb = _kind(a), _kind(b)
    if ka != kb or ka == _OTHER:
        return False
    if ka == _LIST:
        return len(a) == len(b) and all(strict_equal(x, y) for x, y in zip(a, b))
    if ka == _MAP:
        return a.keys() == b.keys() and all(strict_equal(a[k], b[k]) for k in a)
    return bool(a == b)


def _matcher(operand: Any) -> Callable[[Any], bool]:
    """A one-argument predicate for ``value strictly equals operand``."""
    kind = _kind(operand)
    if kind == _NULL:
        return lambda v: v is None
    if kind == _BOOL:
        return lambda v: type(v) is bool and v == operand
    if kind == _INT:
        return lambda v: type(v) is int and v == operand
    if kind == _STR:
        return lambda v: type(v) is str and v == operand
    return lambda v: strict_equal(v, operand)


def _member_matcher(items: list[Any]) -> Callable[[Any], bool]:
    """A predicate for ``value strictly equals at least one of items``."""
    scalars = frozenset((_kind(x), x) for x in items if _kind(x) in _SCALARS)
    containers = tuple(x for x in items if _kind(x) not in _SCALARS)

    def member(v: Any) -> bool:
        kind = _kind(v)
        if kind in _SCALARS:
            return (kind, v) in scalars
        if kind == _OTHER:
            return False
        return any(strict_equal(v, c) for c in containers)

    return member


_EXACT = frozenset({str, int, bool, type(None)})


def canonical_value(value: Any) -> Any:
    """The value as the canonical JSON round trip yields it (plain str/int/bool/None/list/dict)."""
    kind = type(value)
    if kind in _EXACT:
        return value
    if isinstance(value, bool):  # pragma: no cover - bool cannot be subclassed
        return bool(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, Mapping):
        return {str.__str__(k): canonical_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [canonical_value(v) for v in value]
    return value


# -- keys and operands ----------------------------------------------------------------------


def split_condition_key(key: Any) -> tuple[str, str]:
    """Split ``payment_id_eq`` into ``("payment_id", "eq")``; ``ConditionError`` if malformed."""
    ops = ", ".join(OPERATORS)
    if not isinstance(key, str):
        raise ConditionError(
            f"condition key {describe(key)} is not a string; a condition key is the string "
            f"<argument>_<op> with op one of {ops} (quote it if YAML typed it)"
        )
    subject, sep, op = key.rpartition("_")
    if not sep or op not in OPERATORS:
        raise ConditionError(
            f"condition key {key!r} does not end in _<op>; op must be one of {ops} "
            "(lowercase), e.g. amount_lte"
        )
    if subject == "":
        raise ConditionError(
            f"condition key {key!r} names no argument; write <argument>_{op}, e.g. amount_{op}"
        )
    if subject in RESERVED_SUBJECTS:
        raise ConditionError(
            f"condition key {key!r} tests {subject!r}, which is an action or principal field; "
            "conditions address arguments only, so rename the argument (e.g. "
            f"{subject}_name) and test that"
        )
    return subject, op


def check_operand_value(value: Any, path: str = "operand") -> None:
    """Refuse anything an argument can never be: floats, dates, non-string mapping keys, others."""
    if value is None or isinstance(value, (bool, str)) or type(value) is int:
        return
    if isinstance(value, float):
        raise ConditionError(
            f"{path} {value!r} is a float; floats are refused, {_MINOR_UNITS}, "
            'or quote a decimal string ("20.00")'
        )
    if isinstance(value, (_dt.date, _dt.datetime)):
        raise ConditionError(
            f"{path} {value} is a YAML {type(value).__name__}, which an argument can never be; "
            f'quote it ("{value}") to compare the string'
        )
    if type(value) is list:
        for index, item in enumerate(value):
            check_operand_value(item, f"{path}[{index}]")
        return
    if type(value) is dict:
        for key, item in value.items():
            if not isinstance(key, str):
                raise ConditionError(
                    f"{path} has the mapping key {describe(key)}; argument mappings "
                    "have string keys, so quote it"
                )
            check_operand_value(item, f"{path}.{key}")
        return
    raise ConditionError(
        f"{path} is a {type(value).__name__}, which an argument can never be; use strings, "
        "integers, booleans, null, lists and mappings with string keys"
    )


def _check_operand(key: str, op: str, operand: Any) -> None:
    check_operand_value(operand)
    if op in NUMERIC_OPERATORS:
        if type(operand) is not int:
            raise ConditionError(
                f"{key} needs an integer operand, got {describe(operand)}; {_MINOR_UNITS}"
            )
    elif op == "in":
        if type(operand) is not list:
            raise ConditionError(
                f"{key} needs a list operand (e.g. {key}: [a, b]), got {describe(operand)}"
            )
    elif type(operand) is list and any(type(x) in (list, dict) for x in operand):
        raise ConditionError(
            f"{key}: a list operand may not contain lists or mappings; to match a whole "
            f"nested value use {key.rpartition('_')[0]}_in: [[...]]"
        )


# -- warnings ---------------------------------------------------------------------------------


def _warn_absent(action: str, key: str, subject: str, args: Mapping[str, Any]) -> None:
    if logger.isEnabledFor(logging.WARNING):
        carried = ", ".join(repr(str.__str__(k)) for k in sorted(args)) or "none"
        logger.warning(
            "action %r: condition %r is false because argument %r is absent "
            "(the call carries: %s); check the argument name",
            action,
            key,
            subject,
            carried,
        )


def _warn_not_int(action: str, key: str, subject: str, value: Any) -> None:
    logger.warning(
        "action %r: condition %r is false because argument %r is a %s, not an integer; "
        "numeric conditions never coerce (%s)",
        action,
        key,
        subject,
        type_name(value),
        _MINOR_UNITS,
    )


# -- compilation ------------------------------------------------------------------------------

_COMPARE = {"lt": operator.lt, "lte": operator.le, "gt": operator.gt, "gte": operator.ge}
_MISSING = object()


def _compile_argument(key: str, subject: str, op: str, operand: Any) -> Condition:
    if op in NUMERIC_OPERATORS:
        compare = _COMPARE[op]
        bound = operand

        def numeric(args: Mapping[str, Any], scope: Any, action: str) -> bool:
            value = args.get(subject, _MISSING)
            if value is _MISSING:
                _warn_absent(action, key, subject, args)
                return False
            if type(value) not in _EXACT:
                value = canonical_value(value)
            if type(value) is not int:
                _warn_not_int(action, key, subject, value)
                return False
            return bool(compare(value, bound))

        return numeric

    match = _member_matcher(operand) if op == "in" else _matcher(operand)
    negate = op == "neq"

    def equality(args: Mapping[str, Any], scope: Any, action: str) -> bool:
        value = args.get(subject, _MISSING)
        if value is _MISSING:
            _warn_absent(action, key, subject, args)
            return False
        if type(value) not in _EXACT:
            value = canonical_value(value)
        return match(value) is not negate

    return equality


def _compile_data_scope(key: str, op: str, operand: Any) -> Condition:
    if op in NUMERIC_OPERATORS:

        def numeric(args: Mapping[str, Any], scope: Any, action: str) -> bool:
            logger.warning(
                "action %r: condition %r is false because data_scope is a set of labels, "
                "not an integer; use data_scope_in or data_scope_eq",
                action,
                key,
            )
            return False

        return numeric
    if op == "in":
        wanted = frozenset(x for x in operand if type(x) is str)
        return lambda args, scope, action: not wanted.isdisjoint(scope or ())
    if type(operand) is list:
        labels = frozenset(operand) if all(type(x) is str for x in operand) else None
        if op == "eq":
            return lambda args, scope, action: labels is not None and scope == labels
        return lambda args, scope, action: labels is None or scope != labels
    # a non-list operand never equals a set of labels
    return lambda args, scope, action: op == "neq"


def compile_condition(key: Any, operand: Any) -> tuple[str, Condition]:
    """Check one ``when`` entry and compile it; returns ``(subject, condition)``."""
    subject, op = split_condition_key(key)
    _check_operand(key, op, operand)
    if subject == DATA_SCOPE:
        return subject, _compile_data_scope(key, op, operand)
    return subject, _compile_argument(key, subject, op, operand)
