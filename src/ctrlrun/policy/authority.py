"""Load-time validation of the ``authority:`` section (grants); the runtime is not built yet."""

from __future__ import annotations

import datetime as _dt
from typing import Any

from .conditions import ConditionError, check_operand_value, compile_condition
from .context import LoadContext, describe, type_name

__all__ = ["GRANT_KEYS", "validate_authority"]

#: Grant keys and the schema level that introduced each.
GRANT_KEYS: dict[str, int] = {
    "id": 3,
    "subject": 3,
    "actions": 3,
    "environments": 3,
    "constraints": 3,
    "delegable": 3,
    "expires_at": 3,
    "tasks": 7,
    "budgets": 7,
}
_MODE_TOP = "mode is a top-level key only; move 'mode:' to the top of the document"


def _text(ctx: LoadContext, where: str, key: str, value: Any, node: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ctx.error(where, f"{key} must be a non-empty string, got {describe(value)}", node)
    return value


def _text_list(ctx: LoadContext, where: str, key: str, value: Any, node: Any) -> list[str]:
    if not isinstance(value, list) or not value:
        raise ctx.error(
            where,
            f"{key} must be a non-empty list of strings, got {type_name(value)}",
            node,
        )
    return [_text(ctx, where, f"{key} item", item, node) for item in value]


def _grant(ctx: LoadContext, index: int, grant: Any, seen: set[str]) -> None:
    where = f"authority grants[{index}]"
    if not isinstance(grant, dict):
        raise ctx.error(where, f"a grant must be a mapping, got {type_name(grant)}")
    if "mode" in grant:
        raise ctx.error(where, _MODE_TOP, grant)
    for key in grant:
        if key not in GRANT_KEYS:
            raise ctx.error(
                where,
                f"unknown key {key!r}; a grant takes {', '.join(GRANT_KEYS)}",
                grant,
            )
        ctx.gate(where, key, GRANT_KEYS[key], grant)
    for key in ("id", "subject", "actions"):
        if key not in grant:
            raise ctx.error(where, f"a grant needs '{key}'", grant)
    grant_id = _text(ctx, where, "id", grant["id"], grant)
    if grant_id in seen:
        raise ctx.error(where, f"grant id {grant_id!r} is used twice; ids must be unique", grant)
    seen.add(grant_id)
    where = f"authority grant {grant_id!r}"
    subject = grant["subject"]
    if not isinstance(subject, dict):
        raise ctx.error(
            where, f"subject must be a mapping {{agent, user}}, got {type_name(subject)}", grant
        )
    for key in subject:
        if key not in ("agent", "user"):
            raise ctx.error(
                where, f"unknown subject key {key!r}; a subject takes agent, user", subject
            )
    if "agent" not in subject:
        raise ctx.error(where, "subject needs 'agent'", subject)
    _text(ctx, where, "subject agent", subject["agent"], subject)
    if subject.get("user") is not None:
        _text(ctx, where, "subject user", subject["user"], subject)
    _text_list(ctx, where, "actions", grant["actions"], grant)
    if "environments" in grant:
        _text_list(ctx, where, "environments", grant["environments"], grant)
    if "tasks" in grant:
        _text_list(ctx, where, "tasks", grant["tasks"], grant)
    if "delegable" in grant and not isinstance(grant["delegable"], bool):
        raise ctx.error(
            where, f"delegable must be true or false, got {grant['delegable']!r}", grant
        )
    if "expires_at" in grant:
        value = grant["expires_at"]
        parsed = None
        if isinstance(value, str):
            try:
                parsed = _dt.datetime.fromisoformat(value)
            except ValueError:
                parsed = None
        if parsed is None or parsed.utcoffset() is None:
            raise ctx.error(
                where,
                f"expires_at must be a quoted ISO 8601 timestamp with a timezone "
                f'("2026-09-03T10:00:00Z"), got {describe(value)}',
                grant,
            )
    if "constraints" in grant:
        constraints = grant["constraints"]
        if not isinstance(constraints, dict) or not constraints:
            raise ctx.error(where, "constraints must be a non-empty mapping of conditions", grant)
        for key, operand in constraints.items():
            try:
                compile_condition(key, operand)
            except ConditionError as exc:
                raise ctx.error(f"{where} constraints", str(exc), constraints) from None
    if "budgets" in grant:
        budgets = grant["budgets"]
        if not isinstance(budgets, list) or not all(isinstance(b, dict) for b in budgets):
            raise ctx.error(where, "budgets must be a list of mappings", grant)


def validate_authority(ctx: LoadContext, value: Any) -> None:
    """Check an ``authority:`` section (not null); raise ``PolicyError`` on any fault."""
    where = "authority"
    if not isinstance(value, dict):
        raise ctx.error(where, f"authority must be a mapping with 'grants', got {type_name(value)}")
    if "mode" in value:
        raise ctx.error(where, _MODE_TOP, value)
    for key in value:
        if key != "grants":
            raise ctx.error(where, f"unknown key {key!r}; authority takes only 'grants'", value)
    if "grants" not in value:
        raise ctx.error(
            where, "authority needs 'grants' (a list); use 'authority: null' for none", value
        )
    grants = value["grants"]
    if not isinstance(grants, list):
        raise ctx.error(where, f"grants must be a list, got {type_name(grants)}", value)
    try:
        check_operand_value(value, "authority")
    except ConditionError as exc:
        raise ctx.error(where, str(exc), value) from None
    seen: set[str] = set()
    for index, grant in enumerate(grants):
        _grant(ctx, index, grant, seen)
