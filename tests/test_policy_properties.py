"""Property tests (hypothesis) for the policy grammar, strict equality, hashing and templates."""

from __future__ import annotations

import hashlib
import json
import random
from typing import Any

import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ctrlrun.action import Action, Principal
from ctrlrun.errors import EffectKeyError
from ctrlrun.policy import (
    Decision,
    Placeholder,
    Policy,
    parse_template,
    render_effect_key,
    strict_equal,
    template_placeholders,
)

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DOC_SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

# -- strategies -------------------------------------------------------------------------------

# PyYAML's emitter folds line-break characters (U+0085, U+2028, ...) inside quoted scalars, so
# text that goes through yaml.safe_dump leaves out control and line/paragraph separators.
texts = st.text(alphabet=st.characters(exclude_categories=("Cs", "Cc", "Zl", "Zp")), max_size=8)

names = st.text(
    alphabet=st.characters(categories=["L", "N"], include_characters="_.-"), min_size=1, max_size=12
)
identifiers = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True)
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**80), max_value=2**80), texts
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(texts, inner, max_size=4)),
    max_leaves=12,
)
argument_names = st.sampled_from(["amount", "currency", "value", "meta", "tags", "flag"])
arguments = st.dictionaries(st.one_of(argument_names, texts), values, max_size=6)


def _tag(value: Any) -> Any:
    """A reference form in which Python equality is the policy's type-strict equality."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int):
        return ("int", value)
    if isinstance(value, str):
        return ("str", value)
    if value is None:
        return ("null",)
    if isinstance(value, (list, tuple)):
        return ("list", tuple(_tag(v) for v in value))
    return ("map", tuple(sorted((k, _tag(v)) for k, v in value.items())))


def _flat_operand(draw: st.DrawFn, op: str) -> Any:
    if op in ("lt", "lte", "gt", "gte"):
        return draw(st.integers(min_value=-(2**70), max_value=2**70))
    if op == "in":
        return draw(st.lists(values, max_size=4))
    value = draw(values)
    if isinstance(value, list):
        value = [v for v in value if not isinstance(v, (list, dict))]
    return value


@st.composite
def conditions(draw: st.DrawFn) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        op = draw(st.sampled_from(["eq", "neq", "lt", "lte", "gt", "gte", "in"]))
        subject = draw(st.one_of(argument_names, identifiers.filter(lambda s: s not in _RESERVED)))
        result[f"{subject}_{op}"] = _flat_operand(draw, op)
    return result


_RESERVED = {
    "action_id",
    "agent",
    "claims",
    "environment",
    "expires_at",
    "issuer",
    "principal",
    "resource",
    "user",
    "data_scope",
}
decisions = st.sampled_from(["allow", "approve", "deny"])


@st.composite
def entries(draw: st.DrawFn) -> dict[str, Any]:
    entry: dict[str, Any] = {}
    if draw(st.booleans()):
        entry["decision"] = draw(decisions)
    else:
        rules = []
        for _ in range(draw(st.integers(min_value=1, max_value=4))):
            rule: dict[str, Any] = {"decision": draw(decisions)}
            if draw(st.integers(min_value=0, max_value=3)):
                rule["when"] = draw(conditions())
            rules.append(rule)
        entry["rules"] = rules
    if draw(st.booleans()):
        entry["effect"] = draw(st.one_of(st.none(), identifiers.map(lambda n: f"k:{{{n}}}")))
    return entry


@st.composite
def documents(draw: st.DrawFn) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schema": "ctrlrun.policy/v4",
        "actions": draw(st.dictionaries(names, entries(), max_size=4)),
    }
    if draw(st.booleans()):
        doc["environment"] = draw(st.sampled_from(["production", "staging", "eu west"]))
    if draw(st.booleans()):
        doc["mode"] = draw(st.sampled_from(["enforce", "observe"]))
    if draw(st.booleans()):
        doc["version"] = draw(texts.filter(str.strip))
    return doc


def _reference_hash(doc: dict[str, Any]) -> str:
    document = {
        "actions": doc["actions"],
        "authority": doc.get("authority"),
        "controls": doc.get("controls"),
        "environment": doc.get("environment", "production"),
        "mode": doc.get("mode", "enforce"),
        "schema": doc["schema"],
    }
    encoded = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(encoded.encode("utf-8")).hexdigest()


def _shuffled(value: Any, rng: random.Random) -> Any:
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: _shuffled(v, rng) for k, v in items}
    if isinstance(value, list):
        return [_shuffled(v, rng) for v in value]
    return value


def _dump(doc: dict[str, Any], flow: bool | None) -> str:
    return yaml.safe_dump(
        doc, sort_keys=False, default_flow_style=flow, allow_unicode=True, width=60
    )


# -- hashing ----------------------------------------------------------------------------------


@DOC_SETTINGS
@given(documents(), st.randoms(use_true_random=False), st.sampled_from([None, True, False]))
def test_hash_ignores_key_order_and_style(
    doc: dict[str, Any], rng: random.Random, flow: bool | None
) -> None:
    original = Policy.from_yaml(_dump(doc, False))
    assert original.policy_hash == _reference_hash(doc)
    reshaped = Policy.from_yaml("# reshaped\n" + _dump(_shuffled(doc, rng), flow))
    assert reshaped.policy_hash == original.policy_hash


@DOC_SETTINGS
@given(documents())
def test_dump_and_reload_keeps_the_hash(doc: dict[str, Any]) -> None:
    first = Policy.from_yaml(_dump(doc, None))
    again = Policy.from_yaml(_dump(yaml.safe_load(_dump(doc, None)), True))
    assert again.policy_hash == first.policy_hash
    assert again.actions == first.actions


@DOC_SETTINGS
@given(documents(), st.lists(st.tuples(decisions, conditions()), min_size=2, max_size=4))
def test_rule_order_changes_the_hash(
    doc: dict[str, Any], drawn: list[tuple[str, dict[str, Any]]]
) -> None:
    rules = [{"when": when, "decision": decision} for decision, when in drawn]
    assume(_tag(rules[0]) != _tag(rules[-1]))
    doc["actions"]["ordered.action"] = {"rules": rules}
    before = Policy.from_yaml(_dump(doc, False)).policy_hash
    doc["actions"]["ordered.action"] = {"rules": list(reversed(rules))}
    assert Policy.from_yaml(_dump(doc, False)).policy_hash != before


@DOC_SETTINGS
@given(documents(), texts.filter(str.strip))
def test_version_label_never_changes_the_hash(doc: dict[str, Any], label: str) -> None:
    doc.pop("version", None)
    before = Policy.from_yaml(_dump(doc, False)).policy_hash
    doc["version"] = label
    assert Policy.from_yaml(_dump(doc, False)).policy_hash == before


# -- evaluation -------------------------------------------------------------------------------

REASONS = {"decision", "no_matching_rule", "unknown_action"}


@DOC_SETTINGS
@given(documents(), st.data())
def test_evaluate_never_raises(doc: dict[str, Any], data: st.DataObject) -> None:
    policy = Policy.from_yaml(_dump(doc, None))
    candidates = list(doc["actions"]) + ["not.declared"]
    name = data.draw(st.sampled_from(candidates))
    action = Action(name, data.draw(arguments), Principal("agent"))
    evaluation = policy.evaluate(action)
    assert evaluation.decision in set(Decision)
    assert evaluation.reason in REASONS or evaluation.reason.startswith("rule[")
    assert policy.evaluate(action) == evaluation
    canonical = Action(name, action.canonical_arguments, Principal("agent"))
    assert policy.evaluate(canonical) == evaluation
    if name == "not.declared":
        assert tuple(evaluation) == (Decision.DENY, "unknown_action", ())


def _single(key: str, operand: Any) -> Policy:
    doc = {
        "schema": "ctrlrun.policy/v1",
        "actions": {"a": {"rules": [{"when": {key: operand}, "decision": "allow"}]}},
    }
    return Policy.from_yaml(_dump(doc, None))


def _holds(policy: Policy, /, **arguments: Any) -> bool:
    return policy.evaluate(Action("a", arguments, Principal("agent"))).decision is Decision.ALLOW


@SETTINGS
@given(values, values)
def test_eq_is_type_strict(operand: Any, argument: Any) -> None:
    if isinstance(operand, list):
        operand = [v for v in operand if not isinstance(v, (list, dict))]
    expected = _tag(operand) == _tag(argument)
    assert strict_equal(operand, argument) is expected
    assert _holds(_single("value_eq", operand), value=argument) is expected
    assert _holds(_single("value_neq", operand), value=argument) is (not expected)


@SETTINGS
@given(st.integers(min_value=-(2**70), max_value=2**70))
def test_bools_never_equal_ints(n: int) -> None:
    for flag in (True, False):
        assert not _holds(_single("value_eq", n), value=flag)
        assert not _holds(_single("value_eq", flag), value=n)
        assert not _holds(_single("value_in", [n]), value=flag)
        assert not _holds(_single("value_lte", n), value=flag)
        assert not strict_equal([n], [flag])


@SETTINGS
@given(st.lists(values, max_size=5), values)
def test_in_means_some_item_is_strictly_equal(items: list[Any], argument: Any) -> None:
    expected = any(_tag(item) == _tag(argument) for item in items)
    assert _holds(_single("value_in", items), value=argument) is expected


@SETTINGS
@given(
    st.sampled_from(["lt", "lte", "gt", "gte"]),
    st.integers(min_value=-(2**130), max_value=2**130),
    st.integers(min_value=-(2**130), max_value=2**130),
)
def test_numeric_operators_match_python_on_big_ints(op: str, bound: int, value: int) -> None:
    compare = {"lt": int.__lt__, "lte": int.__le__, "gt": int.__gt__, "gte": int.__ge__}[op]
    assert _holds(_single(f"amount_{op}", bound), amount=value) is compare(value, bound)
    assert _holds(_single(f"amount_{op}", bound), amount=value + 1) is compare(value + 1, bound)


@SETTINGS
@given(
    identifiers.filter(lambda s: s not in _RESERVED),
    st.sampled_from(["eq", "neq", "lt", "in"]),
    arguments,
)
def test_absent_argument_never_holds(subject: str, op: str, args: dict[str, Any]) -> None:
    args.pop(subject, None)
    operand = 5 if op == "lt" else ([1] if op == "in" else 1)
    assert not _holds(_single(f"{subject}_{op}", operand), **args)


# -- condition keys ---------------------------------------------------------------------------


@SETTINGS
@given(
    identifiers.filter(lambda s: s not in _RESERVED),
    st.sampled_from(["eq", "neq", "lt", "lte", "gt", "gte", "in"]),
)
def test_last_suffix_is_the_operator(subject: str, op: str) -> None:
    operand = [1] if op == "in" else 1
    policy = _single(f"{subject}_{op}", operand)
    value = {"eq": 1, "neq": 2, "lt": 0, "lte": 1, "gt": 2, "gte": 1, "in": 1}[op]
    assert _holds(policy, **{subject: value})


# -- templates --------------------------------------------------------------------------------

literals = texts.filter(lambda s: "{" not in s and "}" not in s)


@SETTINGS
@given(st.lists(st.one_of(literals, identifiers.map(Placeholder)), min_size=1, max_size=6))
def test_template_round_trip(parts: list[Any]) -> None:
    text = "".join(p if isinstance(p, str) else "{" + p.name + "}" for p in parts)
    assume(text)
    merged: list[Any] = []
    for part in parts:
        if isinstance(part, str):
            if not part:
                continue
            if merged and isinstance(merged[-1], str):
                merged[-1] += part
                continue
        merged.append(part)
    assert parse_template(text) == tuple(merged)
    names = [p.name for p in parts if isinstance(p, Placeholder)]
    assert template_placeholders(text) == tuple(dict.fromkeys(names))
    values_by_name = {name: f"v{i}" for i, name in enumerate(dict.fromkeys(names))}
    assume("resource" not in values_by_name)
    rendered = render_effect_key(text, values_by_name, None)
    expected = "".join(p if isinstance(p, str) else values_by_name[p.name] for p in parts)
    assert rendered == expected


class _Text(str):
    """A str subclass: a checked argument whose canonical form is a plain str."""


@SETTINGS
@given(
    st.lists(st.one_of(literals, st.sampled_from(["amount", "meta", "resource", "x"]).map(Placeholder)),
             min_size=1, max_size=4),
    st.dictionaries(st.sampled_from(["amount", "meta", "x"]),
                    st.one_of(values, texts.map(_Text)), max_size=3),
    st.one_of(st.none(), st.just("db://main")),
)  # fmt: skip
def test_plain_effect_key_agrees_with_the_canonical_render(parts, given, resource) -> None:
    """Rendered from the checked arguments, the key is the one their canonical form renders, or
    nothing (the general render decides)."""
    from ctrlrun.action import Action, Principal
    from ctrlrun.policy.templates import plain_effect_key

    text = "".join(p if isinstance(p, str) else "{" + p.name + "}" for p in parts)
    assume(text)
    action = Action("a.b", given, Principal("agent"), resource)
    plain = plain_effect_key(text, action.arguments)
    try:
        expected = render_effect_key(text, action._arguments_view(), action.resource)
    except EffectKeyError:
        assert plain is None
    else:
        assert plain is None or plain == expected
    if plain is None and all(type(given.get(p.name)) in (str, int) and given.get(p.name) != ""
                             for p in parts if isinstance(p, Placeholder) and p.name != "resource"):
        assert any(isinstance(p, Placeholder) and p.name == "resource" for p in parts)


@SETTINGS
@given(values)
def test_effect_key_value_rule(value: Any) -> None:
    renders = (isinstance(value, str) and value != "") or (
        isinstance(value, int) and not isinstance(value, bool)
    )
    try:
        key = render_effect_key("k:{x}", {"x": value}, None)
    except EffectKeyError:
        assert not renders
    else:
        assert renders and key == f"k:{value}"
