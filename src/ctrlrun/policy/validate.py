"""Validation of a loaded policy document: schema gates, entries, rules, registry, data labels."""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field
from typing import Any, cast

from .authority import validate_authority
from .conditions import DATA_SCOPE, Condition, ConditionError, compile_condition
from .context import SCHEMAS, LoadContext, describe, type_name
from .model import ActionSettings, ControlDef, Decision, UpstreamPin
from .templates import TemplateSyntaxError, template_placeholders
from .upstream import validate_upstream

__all__ = ["CHANGE_ACTION", "Document", "EntryPlan", "RulePlan", "validate_document"]

CHANGE_ACTION = "ctrlrun.policy.change"

#: Top-level keys and the schema level that introduced each.
TOP_KEYS: dict[str, int] = {
    "schema": 1,
    "actions": 1,
    "environment": 3,
    "mode": 3,
    "authority": 3,
    "version": 4,
    "controls": 4,
}
#: Entry keys and the schema level that introduced each (``controls`` is not gated).
ENTRY_KEYS: dict[str, int] = {
    "decision": 1,
    "rules": 1,
    "effect": 2,
    "resource": 2,
    "mcp": 2,
    "controls": 1,
    "data": 4,
    "max_attempts": 5,
    "approvals_required": 6,
    "upstream": 8,
}
RULE_KEYS = ("when", "decision", "controls")
CONTROL_KEYS: dict[str, int] = {"title": 4, "source": 4, "approver_role": 6}
MODES = ("enforce", "observe")
_DECISIONS = {d.value: d for d in Decision}
_MODE_TOP = "mode is a top-level key only; move 'mode:' to the top of the document"
_BAD_ID_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})


@dataclass(frozen=True)
class RulePlan:
    """One rule, its conditions compiled."""

    conditions: tuple[Condition, ...]
    decision: Decision
    controls: tuple[str, ...]
    uses_data_scope: bool


@dataclass(frozen=True)
class EntryPlan:
    """One action entry: a bare decision or rules, plus its runtime settings."""

    settings: ActionSettings
    decision: Decision | None
    rules: tuple[RulePlan, ...]


@dataclass
class Document:
    """Everything a valid document declares."""

    schema: str
    level: int
    mode: str
    environment: str | None
    version: str | None
    actions_raw: dict[str, Any]
    controls_raw: dict[str, Any] | None
    authority_raw: dict[str, Any] | None
    authority_hash: dict[str, Any] | None = None
    registry: dict[str, ControlDef] = field(default_factory=dict)
    entries: dict[str, EntryPlan] = field(default_factory=dict)


def _label_text(value: Any) -> bool:
    return isinstance(value, str) and value.strip() != ""


def _schema(ctx: LoadContext, doc: dict[Any, Any]) -> int:
    value = doc.get("schema")
    if isinstance(value, str) and value in SCHEMAS:
        return SCHEMAS.index(value) + 1
    shown = "absent" if "schema" not in doc else f"{describe(value)}"
    raise ctx.error(
        "schema",
        f"unknown policy schema ({shown}); 'schema:' is required and must be exactly one of "
        f"{', '.join(SCHEMAS)}",
    )


def _decision(ctx: LoadContext, where: str, value: Any, node: Any) -> Decision:
    if isinstance(value, str) and value in _DECISIONS:
        return _DECISIONS[value]
    raise ctx.error(
        where,
        f"decision {value!r} ({type_name(value)}) is not a decision; write exactly allow, "
        "approve or deny (lowercase)",
        node,
    )


def _nonblank(ctx: LoadContext, key: str, value: Any, node: Any) -> str:
    if not _label_text(value):
        hint = f' (quote it: "{value}")' if isinstance(value, (int, float)) else ""
        raise ctx.error(key, f"{key} must be a non-empty string, got {describe(value)}{hint}", node)
    return cast(str, value)


def _control_id_problem(value: Any) -> str | None:
    if not isinstance(value, str):
        return f"is {describe(value)}, not a string (quote it)"
    if not value.strip():
        return "is empty or whitespace-only"
    if len(value) > 200:
        return "is longer than 200 characters"
    for ch in value:
        if ch in "\n\r\x85\u2028\u2029" or unicodedata.category(ch) in _BAD_ID_CATEGORIES:
            return f"contains the control or format character U+{ord(ch):04X}"
    return None


def _registry(ctx: LoadContext, value: Any) -> dict[str, ControlDef]:
    where = "controls"
    if not isinstance(value, dict):
        raise ctx.error(
            where, f"the control registry must be a mapping of id to entry, got {type_name(value)}"
        )
    registry: dict[str, ControlDef] = {}
    for control_id, entry in value.items():
        problem = _control_id_problem(control_id)
        if problem:
            raise ctx.error(where, f"control id {control_id!r} {problem}", value)
        here = f"control {control_id!r}"
        if not isinstance(entry, dict):
            raise ctx.error(
                here, f"a control must be a mapping with 'title', got {type_name(entry)}", value
            )
        for key in entry:
            if key not in CONTROL_KEYS:
                raise ctx.error(
                    here, f"unknown key {key!r}; a control takes {', '.join(CONTROL_KEYS)}", entry
                )
            ctx.gate(here, key, CONTROL_KEYS[key], entry)
        if "title" not in entry:
            raise ctx.error(here, "a control needs 'title' (a non-empty string)", entry)
        for key in ("title", "source"):
            if key in entry and not _label_text(entry[key]):
                raise ctx.error(
                    here,
                    f"{key} must be a non-empty string, got {describe(entry[key])}",
                    entry,
                )
        role = entry.get("approver_role")
        if "approver_role" in entry and (
            not isinstance(role, str) or role == "" or role != role.strip()
        ):
            raise ctx.error(
                here,
                f"approver_role must be a non-empty string without leading or trailing "
                f"whitespace, got {describe(role)}",
                entry,
            )
        registry[control_id] = ControlDef(
            title=entry["title"], source=entry.get("source"), approver_role=role
        )
    return registry


def _citations(
    ctx: LoadContext, where: str, value: Any, registry: dict[str, ControlDef], node: Any
) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ctx.error(
            where,
            f"controls must be a list of control ids ([id, ...]), got {type_name(value)}",
            node,
        )
    cited: dict[str, None] = {}
    for item in value:
        if not isinstance(item, str) or item == "":
            raise ctx.error(where, f"controls item {item!r} must be a non-empty control id", node)
        if item not in registry:
            hint = (
                "the top-level 'controls:' registry does not define it"
                if ctx.level >= 4
                else "a controls registry needs schema: ctrlrun.policy/v4 or later"
            )
            raise ctx.error(where, f"control {item!r} is not defined; {hint}", node)
        cited.setdefault(item, None)
    return tuple(cited)


def _template(ctx: LoadContext, name: str, key: str, value: Any, entry: Any) -> str:
    where = f"action {name!r} {key}"
    try:
        placeholders = template_placeholders(value)
    except TemplateSyntaxError as exc:
        raise ctx.error(where, str(exc), entry) from None
    if DATA_SCOPE in placeholders:
        raise ctx.error(
            where,
            "{data_scope} is derived by policy and is never an argument; use another name",
            entry,
        )
    if name != CHANGE_ACTION:
        if CHANGE_ACTION in value:
            raise ctx.error(
                where, f"the text {CHANGE_ACTION!r} is reserved for that action's own entry", entry
            )
        if key == "effect" and value.startswith("policy:"):
            raise ctx.error(
                where, "effect keys starting with 'policy:' are reserved for policy changes", entry
            )
    return cast(str, value)


def _data(ctx: LoadContext, name: str, value: Any, entry: Any) -> dict[str, str]:
    where = f"action {name!r} data"
    if not isinstance(value, dict):
        raise ctx.error(
            where, f"data must be a mapping of argument to label, got {type_name(value)}", entry
        )
    labels: dict[str, str] = {}
    for arg, spec in value.items():
        if not _label_text(arg):
            raise ctx.error(where, f"argument name {arg!r} must be a non-empty string", value)
        if arg == DATA_SCOPE:
            raise ctx.error(
                where, "'data_scope' is derived by policy and cannot be an argument name", value
            )
        if isinstance(spec, dict):
            if "redact" in spec:
                raise ctx.error(
                    where,
                    f"argument {arg!r}: 'redact' does not exist; labels only attribute",
                    value,
                )
            extra = [k for k in spec if k != "label"]
            if extra or "label" not in spec:
                raise ctx.error(
                    where,
                    f"argument {arg!r}: a label mapping takes only 'label' ({{label: phi}})",
                    value,
                )
            spec = spec["label"]
        if not _label_text(spec):
            raise ctx.error(
                where,
                f"argument {arg!r}: label must be a non-empty string, got {describe(spec)}",
                value,
            )
        labels[arg] = spec
    return labels


def _positive_int(ctx: LoadContext, where: str, key: str, value: Any, entry: Any) -> int:
    if type(value) is not int or value < 1:
        raise ctx.error(
            where, f"{key} must be an integer of at least 1, got {describe(value)}", entry
        )
    return value


def _rule(
    ctx: LoadContext, name: str, index: int, rule: Any, registry: dict[str, ControlDef]
) -> RulePlan:
    where = f"action {name!r} rule[{index}]"
    if not isinstance(rule, dict):
        raise ctx.error(where, f"a rule must be a mapping with 'decision', got {describe(rule)}")
    if "mode" in rule:
        raise ctx.error(where, _MODE_TOP, rule)
    for key in rule:
        if key not in RULE_KEYS:
            raise ctx.error(
                where, f"unknown key {key!r}; a rule takes only {', '.join(RULE_KEYS)}", rule
            )
    if "decision" not in rule:
        raise ctx.error(where, "a rule needs 'decision' (allow, approve or deny)", rule)
    decision = _decision(ctx, where, rule["decision"], rule)
    conditions: list[Condition] = []
    uses_scope = False
    if "when" in rule:
        when = rule["when"]
        if not isinstance(when, dict) or not when:
            raise ctx.error(
                f"{where} when",
                f"when must be a non-empty mapping of conditions, got {describe(when)};"
                f" for a catch-all rule omit 'when'",
                rule,
            )
        for key, operand in when.items():
            try:
                subject, condition = compile_condition(key, operand)
            except ConditionError as exc:
                raise ctx.error(f"{where} when key {key!r}", str(exc), when) from None
            uses_scope = uses_scope or subject == DATA_SCOPE
            conditions.append(condition)
    controls = _citations(ctx, f"{where} controls", rule.get("controls"), registry, rule)
    return RulePlan(tuple(conditions), decision, controls, uses_scope)


def _entry(ctx: LoadContext, name: Any, entry: Any, registry: dict[str, ControlDef]) -> EntryPlan:
    if not isinstance(name, str) or name == "":
        raise ctx.error(
            "actions",
            f"action name {describe(name)} is not a string; names must be non-empty strings "
            '(quote keys such as "yes" or "1")',
        )
    where = f"action {name!r}"
    if not isinstance(entry, dict):
        raise ctx.error(
            where,
            f"an action entry must be a mapping with 'decision' or 'rules', got {describe(entry)}",
        )
    if "mode" in entry:
        raise ctx.error(where, _MODE_TOP, entry)
    for key in entry:
        if key not in ENTRY_KEYS:
            raise ctx.error(
                where, f"unknown key {key!r}; an action entry takes {', '.join(ENTRY_KEYS)}", entry
            )
        ctx.gate(where, key, ENTRY_KEYS[key], entry)
    if name == CHANGE_ACTION and ctx.level < 6:
        raise ctx.error(
            where,
            f"declaring {CHANGE_ACTION!r} needs schema: ctrlrun.policy/v6 or later, but this "
            f"document declares {ctx.schema}",
            entry,
        )
    has_decision, has_rules = "decision" in entry, "rules" in entry
    if has_decision == has_rules:
        raise ctx.error(where, "an action entry needs exactly one of 'decision' and 'rules'", entry)
    decision = None
    rules: tuple[RulePlan, ...] = ()
    if has_decision:
        decision = _decision(ctx, where, entry["decision"], entry)
    else:
        raw_rules = entry["rules"]
        if not isinstance(raw_rules, list) or not raw_rules:
            raise ctx.error(
                f"{where} rules",
                f"rules must be a non-empty list of rule mappings, got {type_name(raw_rules)}",
                entry,
            )
        rules = tuple(_rule(ctx, name, i, rule, registry) for i, rule in enumerate(raw_rules))

    effect = entry.get("effect")
    resource = entry.get("resource")
    if effect is not None:
        effect = _template(ctx, name, "effect", effect, entry)
    if resource is not None:
        resource = _template(ctx, name, "resource", resource, entry)
    not_executed = False
    if entry.get("mcp") is not None:
        mcp = entry["mcp"]
        if not isinstance(mcp, dict):
            raise ctx.error(f"{where} mcp", f"mcp must be a mapping, got {type_name(mcp)}", entry)
        for key in mcp:
            if key != "not_executed_on_error":
                raise ctx.error(
                    f"{where} mcp",
                    f"unknown key {key!r}; mcp takes only not_executed_on_error",
                    mcp,
                )
        if "not_executed_on_error" in mcp:
            flag = mcp["not_executed_on_error"]
            if not isinstance(flag, bool):
                raise ctx.error(
                    f"{where} mcp",
                    f"not_executed_on_error must be true or false, got {describe(flag)}",
                    mcp,
                )
            not_executed = flag
    data = _data(ctx, name, entry["data"], entry) if entry.get("data") is not None else {}
    max_attempts = None
    if "max_attempts" in entry:
        max_attempts = _positive_int(ctx, where, "max_attempts", entry["max_attempts"], entry)
    approvals = 1
    if "approvals_required" in entry:
        approvals = _positive_int(
            ctx, where, "approvals_required", entry["approvals_required"], entry
        )
    upstream: UpstreamPin | None = None
    if entry.get("upstream") is not None:
        upstream = validate_upstream(ctx, where, entry["upstream"])
    controls = _citations(ctx, f"{where} controls", entry.get("controls"), registry, entry)
    settings = ActionSettings(
        effect=effect,
        resource=resource,
        not_executed_on_error=not_executed,
        max_attempts=max_attempts,
        approvals_required=approvals,
        upstream=upstream,
        data=data,
        controls=controls,
    )
    return EntryPlan(settings, decision, rules)


def validate_document(ctx: LoadContext, doc: Any) -> Document:
    """Validate a loaded document; raise ``PolicyError`` naming the first fault."""
    if not isinstance(doc, dict):
        shown = "empty" if doc is None else f"a {type_name(doc)}"
        raise ctx.error(
            "",
            f"the policy document is {shown}; it must be a mapping with 'schema:' and 'actions:'",
        )
    ctx.level = _schema(ctx, doc)
    for key in doc:
        if key not in TOP_KEYS:
            raise ctx.error(
                "top level",
                f"unknown key {key!r}; the top level takes {', '.join(TOP_KEYS)}",
            )
        ctx.gate("top level", key, TOP_KEYS[key])
    if "actions" not in doc:
        raise ctx.error("top level", "'actions:' is required (a mapping of action name to entry)")
    actions = doc["actions"]
    if not isinstance(actions, dict):
        raise ctx.error(
            "actions",
            f"actions must be a mapping of action name to entry, got {type_name(actions)}",
        )
    environment = None
    if "environment" in doc:
        environment = _nonblank(ctx, "environment", doc["environment"], doc)
    mode = "enforce"
    if "mode" in doc:
        mode = doc["mode"]
        if not isinstance(mode, str) or mode not in MODES:
            raise ctx.error(
                "mode",
                f"mode must be exactly 'enforce' or 'observe', got {describe(mode)}"
                + (
                    " (YAML reads an unquoted off/on/no/yes as a bool)"
                    if isinstance(mode, bool)
                    else ""
                ),
            )
    version = None
    if "version" in doc:
        version = _nonblank(ctx, "version", doc["version"], doc)
    controls_raw = doc.get("controls")
    registry = _registry(ctx, controls_raw) if controls_raw is not None else {}
    authority_raw = doc.get("authority")
    authority_hash = None
    if authority_raw is not None:
        authority_hash = validate_authority(ctx, authority_raw)
    entries = {name: _entry(ctx, name, entry, registry) for name, entry in actions.items()}
    return Document(
        schema=ctx.schema,
        level=ctx.level,
        mode=mode,
        environment=environment,
        version=version,
        actions_raw=actions,
        controls_raw=controls_raw,
        authority_raw=authority_raw,
        authority_hash=authority_hash,
        registry=registry,
        entries=entries,
    )
