"""Reading the ``authority:`` section and single grants (YAML, mappings, stored JSON) into
validated ``Grant`` values, and the section's form in the policy hash."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..action import thaw
from ..errors import PolicyError
from .grants import Budget, Grant, GrantInvalid, parse_expiry, parse_window
from .context import SCHEMAS, LoadContext, describe, type_name
from .loader import load_yaml

__all__ = [
    "AUTHORITY_KEYS",
    "BUDGET_KEYS",
    "DEFAULT_MAX_DEPTH",
    "GRANT_KEYS",
    "SUBJECT_KEYS",
    "grant_from_json",
    "grant_from_mapping",
    "grant_from_yaml",
    "hash_member",
    "parse_section",
    "validate_authority",
]

#: Grant keys and the schema level that introduced each.
GRANT_KEYS: dict[str, int] = {
    "id": 3,
    "subject": 3,
    "actions": 3,
    "resources": 3,
    "constraints": 3,
    "environments": 3,
    "delegable": 3,
    "expires_at": 3,
    "tasks": 7,
    "budgets": 7,
}
AUTHORITY_KEYS = ("max_delegation_depth", "grants", "break_glass")
SUBJECT_KEYS = ("agent", "user")
BUDGET_KEYS = ("metric", "limit", "window")
DEFAULT_MAX_DEPTH = 3
_LATEST = len(SCHEMAS)
_MODE_TOP = "mode is a top-level key only; move 'mode:' to the top of the document"


def _closed(ctx: LoadContext, where: str, what: str, value: Any, allowed: Any) -> None:
    """Refuse ``mode`` and any key outside ``allowed`` in the mapping ``value``."""
    if "mode" in value:
        raise ctx.error(where, _MODE_TOP, value)
    for key in value:
        if key not in allowed:
            raise ctx.error(where, f"unknown key {key!r}; {what} takes {', '.join(allowed)}", value)


def _list(ctx: LoadContext, where: str, key: str, value: Any, node: Any) -> list[Any]:
    if not isinstance(value, list):
        raise ctx.error(
            where,
            f"{key} must be a non-empty list, got {describe(value)}"
            + ("; omit the key instead of writing null" if value is None else ""),
            node,
        )
    return value


def _strings(ctx: LoadContext, where: str, key: str, value: Any, node: Any) -> tuple[str, ...]:
    items = _list(ctx, where, key, value, node)
    for item in items:
        if not isinstance(item, str):
            raise ctx.error(where, f"{key} item {describe(item)} must be a string (quote it)", node)
    return tuple(items)


def _subject(ctx: LoadContext, where: str, value: Any, node: Any) -> tuple[Any, Any]:
    if not isinstance(value, dict):
        raise ctx.error(
            where, f"subject must be a mapping {{agent, user}}, got {type_name(value)}", node
        )
    _closed(ctx, where, "a subject", value, SUBJECT_KEYS)
    names: list[Any] = []
    for key in SUBJECT_KEYS:
        if key in value and not isinstance(value[key], str):
            raise ctx.error(
                where,
                f"subject {key} must be a string pattern, got {describe(value[key])}"
                + (f"; omit {key} for any {key}" if value[key] is None else ""),
                value,
            )
        names.append(value.get(key))
    return names[0], names[1]


def _budgets(
    ctx: LoadContext, where: str, value: Any, node: Any, *, stored: bool
) -> tuple[Budget, ...]:
    items = _list(ctx, where, "budgets", value, node)
    if not items:
        raise ctx.error(where, "budgets must not be empty; omit it for none", node)
    budgets: list[Budget] = []
    for index, item in enumerate(items):
        here = f"{where} budgets[{index}]"
        if not isinstance(item, dict):
            raise ctx.error(
                here, f"a budget must be a mapping {{metric, limit, window}}, got {type_name(item)}"
            )
        _closed(ctx, here, "a budget", item, BUDGET_KEYS)
        for key in BUDGET_KEYS:
            if key not in item:
                raise ctx.error(here, f"a budget needs {key!r} (metric, limit, window)", item)
        window = item["window"]
        if stored:
            if type(window) is not int:
                raise ctx.error(here, f"window must be seconds, got {describe(window)}", item)
        else:
            try:
                window = parse_window(window)
            except PolicyError as exc:
                raise ctx.error(here, str(exc), item) from None
        try:
            budgets.append(Budget(item["metric"], item["limit"], window))
        except GrantInvalid as exc:
            raise ctx.error(here, exc.detail, item) from None
    return tuple(budgets)


def _grant(
    ctx: LoadContext,
    where: str,
    grant: Any,
    *,
    root: bool,
    stored: bool = False,
    grant_id: str = "",
    prefix: str = "",
) -> Grant:
    """One grant mapping as a ``Grant``: a root names its ``id``, a child gets ``grant_id``;
    ``stored`` reads the ``grant_json`` form (null = absent, windows in seconds)."""
    if not isinstance(grant, dict):
        raise ctx.error(where, f"a grant must be a mapping, got {type_name(grant)}")
    if root and isinstance(grant.get("id"), str) and grant["id"]:
        where = f"{prefix}grant {grant['id']!r}"
    allowed = tuple(GRANT_KEYS) if root else tuple(k for k in GRANT_KEYS if k != "id")
    if not root and "id" in grant:
        raise ctx.error(
            where, "a delegated grant has no 'id'; the Control mints one (dlg_...)", grant
        )
    _closed(ctx, where, "a grant", grant, allowed)
    for key in grant:
        ctx.gate(where, key, GRANT_KEYS[key], grant)
    if stored:
        grant = {key: value for key, value in grant.items() if value is not None}
        if isinstance(grant.get("subject"), dict):
            grant["subject"] = {k: v for k, v in grant["subject"].items() if v is not None}
    for key in ("id", "subject", "actions") if root else ("subject", "actions"):
        if key not in grant:
            raise ctx.error(where, f"a grant needs '{key}'", grant)
    if root:
        grant_id = grant["id"]
        if not isinstance(grant_id, str) or grant_id == "":
            raise ctx.error(
                where, f"id must be a non-empty string, got {describe(grant_id)}", grant
            )
        where = f"{prefix}grant {grant_id!r}"
    agent, user = _subject(ctx, where, grant["subject"], grant)
    fields: dict[str, Any] = {
        "id": grant_id,
        "agent": agent,
        "user": user,
        "actions": _strings(ctx, where, "actions", grant["actions"], grant),
    }
    for key in ("resources", "environments", "tasks"):
        if key in grant:
            fields[key] = _strings(ctx, where, key, grant[key], grant)
    if "constraints" in grant:
        constraints = grant["constraints"]
        if not isinstance(constraints, dict):
            raise ctx.error(
                where,
                f"constraints must be a non-empty mapping of conditions ({{amount_lte: 50000}}), "
                f"got {describe(constraints)}; omit it for none",
                grant,
            )
        if "mode" in constraints:
            raise ctx.error(where, _MODE_TOP, constraints)
        fields["constraints"] = constraints
    if "delegable" in grant:
        fields["delegable"] = grant["delegable"]
    if "expires_at" in grant:
        try:
            fields["expires_at"] = parse_expiry(grant["expires_at"])
        except PolicyError as exc:
            raise ctx.error(where, str(exc), grant) from None
    if "budgets" in grant:
        fields["budgets"] = _budgets(ctx, where, grant["budgets"], grant, stored=stored)
    try:
        return Grant(**fields)
    except GrantInvalid as exc:
        raise ctx.error(where, exc.detail, grant) from None


def parse_section(ctx: LoadContext, value: Any) -> tuple[int, tuple[Grant, ...]]:
    """``max_delegation_depth`` and the root grants (document order) of an ``authority:``
    mapping; ``PolicyError`` naming the first fault."""
    where = "authority"
    if not isinstance(value, dict):
        raise ctx.error(where, f"authority must be a mapping with 'grants', got {type_name(value)}")
    _closed(ctx, where, "authority", value, AUTHORITY_KEYS)
    if "break_glass" in value:
        raise ctx.error(where, "break_glass is reserved and not supported yet; remove it", value)
    if "grants" not in value:
        raise ctx.error(
            where, "authority needs 'grants' (a list); use 'authority: null' for none", value
        )
    depth = value.get("max_delegation_depth", DEFAULT_MAX_DEPTH)
    if type(depth) is not int or depth < 0:
        raise ctx.error(
            where,
            f"max_delegation_depth must be an integer of at least 0 (0 = no delegation), got "
            f"{describe(depth)}",
            value,
        )
    grants = value["grants"]
    if not isinstance(grants, list):
        raise ctx.error(
            where,
            f"grants must be a list of grants, got {describe(grants)}; write 'grants: []' to "
            "deny everything",
            value,
        )
    parsed: list[Grant] = []
    seen: set[str] = set()
    for index, item in enumerate(grants):
        grant = _grant(ctx, f"authority grants[{index}]", item, root=True, prefix="authority ")
        if grant.id in seen:
            raise ctx.error(
                f"authority grant {grant.id!r}",
                f"grant id {grant.id!r} is used twice; ids must be unique, rename one",
                item,
            )
        seen.add(grant.id)
        parsed.append(grant)
    return depth, tuple(parsed)


def hash_member(depth: int, grants: tuple[Grant, ...]) -> dict[str, Any]:
    """The section as the policy hash sees it (parsed values, grants keyed by id)."""
    return {
        "break_glass": {},
        "max_delegation_depth": depth,
        "grants": {grant.id: grant.hash_form() for grant in grants},
    }


def validate_authority(ctx: LoadContext, value: Any) -> dict[str, Any]:
    """Check an ``authority:`` section (not null) and return its policy-hash member."""
    return hash_member(*parse_section(ctx, value))


def _context(where: str) -> LoadContext:
    return LoadContext(source=where, level=_LATEST)


def grant_from_mapping(value: Mapping[str, Any], *, root: bool, where: str = "<grant>") -> Grant:
    """A ``Grant`` from a mapping of grant keys (``id`` only when ``root``); ``PolicyError``
    naming the key."""
    plain = thaw(value) if isinstance(value, Mapping) else value
    return _grant(_context(where), "", plain, root=root)


def grant_from_yaml(text: str) -> Grant:
    """A child grant from YAML: one grant's keys without ``id``; ``PolicyError`` naming the key."""
    if not isinstance(text, str):
        raise PolicyError(f"grant YAML must be a string, got {type_name(text)}")
    doc, lines = load_yaml(text, "<grant>")
    ctx = LoadContext(source="<grant>", level=_LATEST, lines=lines)
    return _grant(ctx, "", doc, root=False)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r}")
        result[key] = value
    return result


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def grant_from_json(text: str, grant_id: str) -> Grant:
    """The ``Grant`` a stored ``grant_json`` holds, under ``grant_id``; ``PolicyError`` if it
    does not parse as one."""
    if not isinstance(text, str):
        raise PolicyError(f"grant_json must be text, got {type_name(text)}")
    try:
        value = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise PolicyError(f"grant_json is not valid JSON ({exc})") from None
    return _grant(_context("grant_json"), "", value, root=False, stored=True, grant_id=grant_id)
