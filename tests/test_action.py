"""The action, its canonical form and its hash: the vectors byte for byte, and properties."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from hypothesis import given, strategies as st

from ctrlrun import Action, InvalidArgument, Principal, action_hash, canonical_bytes, canonicalize
from ctrlrun.action import action_from_dict, action_to_dict

from .vectors import load

VECTORS = load("action_hash.json")


@pytest.mark.parametrize("case", VECTORS["cases"], ids=lambda c: c["action_hash"][7:19])
def test_vector_hash(case):
    action = Action(
        case["name"],
        case["arguments"],
        Principal(case["agent"], case["user"]),
        case["resource"],
        case["environment"],
    )
    assert canonicalize(action) == case["canonical"].encode("utf-8")
    assert action_hash(action) == case["action_hash"] == action.action_hash


@pytest.mark.parametrize("case", VECTORS["refused"], ids=lambda c: c["arguments_repr"])
def test_vector_refused(case):
    arguments = eval(case["arguments_repr"])  # the vector file spells Python literals
    with pytest.raises(InvalidArgument):
        Action("x.y", arguments, Principal("a"))


def test_spec_example():
    action = Action("stripe.refund", {"payment_id": "txn_2", "amount": 250000}, Principal("refund-agent"))
    assert action.action_hash == (
        "sha256:c378d5722f4527c0aab233b30e3d63f11b3b6138649f85e3e5c4fd3f1c6156e6"
    )


def test_float_message_names_path_and_fix():
    with pytest.raises(InvalidArgument) as info:
        Action("shop.order", {"items": [{"sku": "a"}, {"sku": "b"}, {"price": 2.5}]}, Principal("a"))
    assert "arguments.items[2].price" in str(info.value)
    assert "minor units" in str(info.value)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"name": ""},
        {"environment": ""},
        {"resource": ""},
        {"arguments": [1, 2]},
    ],
)
def test_refused_fields(kwargs):
    values = {"name": "a.b", "arguments": {}, "principal": Principal("a")} | kwargs
    with pytest.raises(InvalidArgument):
        Action(**values)


def test_principal_validation():
    with pytest.raises(InvalidArgument):
        Principal("")
    with pytest.raises(InvalidArgument):
        Principal("a", "")
    with pytest.raises(InvalidArgument):
        Principal("a", claims={"x": 1.5})
    with pytest.raises(InvalidArgument):
        Principal("a", expires_at=datetime(2026, 1, 1))


def test_identity_and_freezing():
    source = {"items": [1, 2], "meta": {"k": "v"}}
    action = Action("a.b", source, Principal("a"))
    other = Action("a.b", source, Principal("a"))
    assert action != other and action.action_hash == other.action_hash
    assert action == action and len({action, other}) == 2
    assert action.action_id.startswith("act_") and len(action.action_id) == 36
    source["items"].append(3)
    assert action.canonical_arguments == {"items": [1, 2], "meta": {"k": "v"}}
    with pytest.raises(TypeError):
        action.arguments["meta"]["k"] = "w"  # type: ignore[index]
    fresh = action.canonical_arguments
    fresh["items"].append(9)
    assert action.canonical_arguments["items"] == [1, 2]


def test_only_agent_and_user_enter_the_hash():
    plain = Action("a.b", {}, Principal("a", "u"))
    rich = Action(
        "a.b",
        {},
        Principal("a", "u", {"role": "x"}, "issuer", datetime(2030, 1, 1, tzinfo=timezone.utc)),
    )
    assert plain.action_hash == rich.action_hash


def test_round_trip_through_dict():
    action = Action(
        "a.b",
        {"n": 2**80, "flag": True, "nested": {"l": [None, "é"]}},
        Principal("a", "u", {"roles": ["x", "y"]}, "iss", datetime(2030, 1, 1, tzinfo=timezone.utc)),
        "res",
        "staging",
    )
    again = action_from_dict(action_to_dict(action))
    assert again == action and again.action_hash == action.action_hash
    assert again.principal == action.principal


# -- properties -------------------------------------------------------------------------------

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.text(alphabet=st.characters(blacklist_categories=["Cs"]))
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=5), inner, max_size=4)),
    max_leaves=12,
)
arguments = st.dictionaries(st.text(max_size=8), values, max_size=5)


@given(arguments)
def test_key_order_never_changes_the_hash(args):
    reordered = dict(reversed(list(args.items())))
    assert Action("a", args, Principal("p")).action_hash == Action("a", reordered, Principal("p")).action_hash


@given(st.lists(values, max_size=5))
def test_list_and_tuple_hash_the_same(items):
    assert (
        Action("a", {"x": items}, Principal("p")).action_hash
        == Action("a", {"x": tuple(items)}, Principal("p")).action_hash
    )


@given(arguments, st.text(min_size=1, max_size=8), values)
def test_any_value_change_changes_the_hash(args, key, value):
    changed = dict(args)
    changed[key] = value
    same = canonical_bytes(changed) == canonical_bytes(args)
    assert (Action("a", args, Principal("p")).action_hash == Action("a", changed, Principal("p")).action_hash) == same


@given(
    st.sampled_from(["name", "resource", "environment", "agent", "user"]),
    st.text(min_size=1, max_size=6, alphabet=st.characters(blacklist_categories=["Cs"])),
)
def test_any_field_change_changes_the_hash(field, text):
    base = {"name": "n", "resource": "r", "environment": "e", "agent": "a", "user": "u"}
    other = dict(base, **{field: base[field] + text})

    def build(v):
        return Action(v["name"], {}, Principal(v["agent"], v["user"]), v["resource"], v["environment"])

    assert build(base).action_hash != build(other).action_hash


@given(arguments, st.lists(st.sampled_from(["k", "j"]), min_size=0, max_size=3), st.floats(allow_nan=True))
def test_floats_refused_at_any_depth(args, path, number):
    nested = number
    for key in reversed(path):
        nested = {key: nested}
    with pytest.raises(InvalidArgument):
        Action("a", dict(args, deep=[nested]), Principal("p"))


@pytest.mark.parametrize("name", ["action_hash.json", "policy_cases.json"])
def test_vector_copies_match_the_specification(name):
    from .vectors import COPIES, SHARED

    if not SHARED.is_dir():
        pytest.skip("the specification checkout is not beside this repository")
    assert (COPIES / name).read_bytes() == (SHARED / name).read_bytes()


# --------------------------------------------------------------------------- encoder_of


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@pytest.mark.parametrize("ensure_ascii", [False, True])
@pytest.mark.parametrize("sort_keys", [False, True])
@given(value=_JSON_VALUES)
def test_encoder_of_writes_what_the_encoder_writes(ensure_ascii, sort_keys, value):
    import json

    from ctrlrun.action import encoder_of

    encoder = json.JSONEncoder(
        sort_keys=sort_keys, separators=(",", ":"), ensure_ascii=ensure_ascii, allow_nan=False
    )
    fast = encoder_of(encoder)
    try:
        expected: object = encoder.encode(value)
    except ValueError as exc:
        expected = str(exc)
    try:
        got: object = fast(value)
    except ValueError as exc:
        got = str(exc)
    assert got == expected


def test_encoder_of_still_refuses_a_circular_value():
    import json

    from ctrlrun.action import encoder_of

    looped: list[object] = []
    looped.append(looped)
    with pytest.raises(ValueError, match="Circular"):
        encoder_of(json.JSONEncoder())(looped)


@pytest.mark.parametrize("name", [["refund"], "", 7, "refund\ud800"])
def test_a_bad_name_is_refused_after_good_actions_share_its_environment_and_principal(name):
    principal = Principal("agent-1")
    for _ in range(2):  # the second is built from the text the first kept
        good = Action("refund", {"amount": 1}, principal, None, "production")
    assert good.action_hash == Action("refund", {"amount": 1}, principal).action_hash
    with pytest.raises(InvalidArgument, match="action name"):
        Action(name, {"amount": 1}, principal, None, "production")


@given(st.text(min_size=1), st.text(min_size=1), st.one_of(st.none(), st.text(min_size=1)))
def test_repeated_actions_hash_as_the_first_of_them(name, environment, user):
    def build() -> Action:
        return Action(name, {}, Principal("agent", user), None, environment)

    try:
        first = build()
    except InvalidArgument:
        with pytest.raises(InvalidArgument):
            build()  # refused again: nothing kept for a refused text
        return
    assert build()._canonical == first._canonical == canonical_bytes(
        {"arguments": {}, "environment": environment, "name": name,
         "principal": {"agent": "agent", "user": user}, "resource": None,
         "schema": "ctrlrun.action/v1"}
    )  # fmt: skip
