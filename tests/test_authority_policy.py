"""The ``authority:`` section at policy load: every refusal, the parsed form, the policy hash."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from ctrlrun.authority.resolve import (
    Authority,
    Budget,
    Grant,
    grant_from_mapping,
    grant_from_yaml,
    parse_window,
)
from ctrlrun.errors import PolicyError
from ctrlrun.policy import Policy

from .policies import WORKED  # 08 §2, verbatim
WORKED_HASH = "sha256:4d977a1b8fb25b31314aa79703985c2e00c465769bfd2ee88362ca798748517c"

GRANT = """\
    - id: g1
      subject: {agent: support}
      actions: [stripe.refund]
"""


def doc(grants: str = GRANT, top: str = "", schema: str = "v7") -> str:
    return (
        f"schema: ctrlrun.policy/{schema}\nauthority:\n{top}  grants:\n{grants}"
        "actions:\n  stripe.refund: {decision: allow}\n"
    )


def with_keys(extra: str) -> str:
    return doc(GRANT + "".join(f"      {line}\n" for line in extra.splitlines()))


def refused(text: str, *needles: str) -> str:
    with pytest.raises(PolicyError) as info:
        Policy.from_yaml(text)
    message = str(info.value)
    for needle in needles:
        assert needle in message, message
    return message


# -- the hash ---------------------------------------------------------------------------------


def test_worked_example_hash() -> None:
    assert Policy.from_yaml(WORKED).policy_hash == WORKED_HASH


def test_without_authority_the_member_is_null() -> None:
    plain = "schema: ctrlrun.policy/v3\nactions:\n  a: {decision: allow}\n"
    explicit = "schema: ctrlrun.policy/v3\nauthority: null\nactions:\n  a: {decision: allow}\n"
    assert Policy.from_yaml(plain).policy_hash == Policy.from_yaml(explicit).policy_hash


def hash_of(text: str) -> str:
    return Policy.from_yaml(text).policy_hash


def test_hash_sees_parsed_values() -> None:
    assert hash_of(WORKED.replace("window: P1D", "window: PT24H")) == WORKED_HASH
    assert hash_of(WORKED.replace("window: P1D", "window: PT86400S")) == WORKED_HASH
    assert hash_of(WORKED.replace("window: P1D", "window: P2D")) != WORKED_HASH
    unquoted = WORKED.replace('"2027-01-01T00:00:00Z"', "2027-01-01T00:00:00Z")
    assert hash_of(unquoted) == WORKED_HASH
    assert hash_of(WORKED.replace("00:00:00Z", "00:00:00+00:00")) == WORKED_HASH
    # the written offset is kept: the same instant written at +02:00 is a different document
    assert hash_of(WORKED.replace("T00:00:00Z", "T02:00:00+02:00")) != WORKED_HASH
    flow = WORKED.replace(
        "amount_gte: 0, amount_lte: 10000000 }", "amount_lte: 10000000, amount_gte: 0 }"
    )
    assert hash_of(flow) == WORKED_HASH


def test_hash_member_is_the_parsed_form() -> None:
    policy = Policy.from_yaml(
        WORKED.replace("delegable: true", "delegable: true\n      tasks: [run]")
    )
    authority = Authority.from_section(policy.authority or {})
    member = authority.hash_member()
    assert member["break_glass"] == {} and member["max_delegation_depth"] == 2
    grant = member["grants"]["head-of-support"]
    assert grant["constraints"]["amount_lte"] == {
        "argument": "amount",
        "op": "lte",
        "operand": 10000000,
    }
    assert grant["budgets"] == [{"limit": 50000000, "metric": "amount", "window": 86400}]
    assert grant["expires_at"] == "2027-01-01T00:00:00+00:00"
    assert grant["tasks"] == ["run"]
    assert grant["subject"] == {"agent": "head-of-support", "user": "dana@example.com"}
    minimal = Authority.from_section(Policy.from_yaml(doc()).authority or {}).hash_member()
    assert minimal["max_delegation_depth"] == 3
    assert minimal["grants"]["g1"] == {
        "actions": ["stripe.refund"],
        "budgets": None,
        "constraints": None,
        "delegable": False,
        "environments": None,
        "expires_at": None,
        "resources": None,
        "subject": {"agent": "support", "user": None},
        "tasks": None,
    }


def test_from_section_reads_the_policy_section() -> None:
    authority = Authority.from_section(Policy.from_yaml(WORKED).authority or {})
    assert authority.max_delegation_depth == 2
    grant = authority.root("head-of-support")
    assert grant is not None and authority.grants == (grant,)
    assert grant.expires_at == datetime(2027, 1, 1, tzinfo=timezone.utc)
    assert grant.budgets == (Budget("amount", 50000000, 86400),)
    assert grant.resources == ("payment:*",)
    assert dict(grant.constraints or {}) == {"amount_gte": 0, "amount_lte": 10000000}
    assert authority.root("nope") is None


def test_empty_grants_load_and_document_order_is_kept() -> None:
    empty = "schema: ctrlrun.policy/v3\nauthority: {grants: []}\nactions: {}\n"
    assert Authority.from_section(Policy.from_yaml(empty).authority or {}).grants == ()
    two = doc(
        "    - {id: zeta, subject: {agent: a}, actions: [x]}\n"
        "    - {id: alpha, subject: {user: u}, actions: [y]}\n"
    )
    authority = Authority.from_section(Policy.from_yaml(two).authority or {})
    assert [g.id for g in authority.grants] == ["zeta", "alpha"]


# -- refusals ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("top", "needles"),
    [
        ("  max_delegation_depth: -1\n", ("max_delegation_depth", "at least 0")),
        ("  max_delegation_depth: true\n", ("max_delegation_depth",)),
        ("  max_delegation_depth: 1.5\n", ("max_delegation_depth",)),
        ("  max_delegation_depth: '2'\n", ("max_delegation_depth",)),
        ("  max_delegation_depth: null\n", ("max_delegation_depth",)),
        ("  break_glass: {}\n", ("break_glass", "not supported yet")),
        ("  break_glass: null\n", ("break_glass", "not supported yet")),
        ("  mode: observe\n", ("top-level",)),
        ("  grant: []\n", ("'grant'", "max_delegation_depth, grants, break_glass")),
    ],
)
def test_section_refusals(top: str, needles: tuple[str, ...]) -> None:
    refused(doc(top=top), "authority", *needles)


def test_grants_must_be_a_list() -> None:
    base = "schema: ctrlrun.policy/v3\nauthority: {0}\nactions: {{}}\n"
    refused(base.format("{}"), "grants")
    refused(base.format("{grants: null}"), "grants")
    refused(base.format("{grants: {a: 1}}"), "grants")
    refused(base.format("[]"), "mapping")
    refused(base.format("{grants: []}").replace("v3", "v2"), "authority", "v3")


@pytest.mark.parametrize(
    ("replace", "by", "needles"),
    [
        ("id: g1", "id: -g1", ("id", "letter or digit")),
        ("id: g1", "id: 'g 1'", ("id",)),
        ("id: g1", "id: ''", ("id",)),
        ("id: g1", "id: 5", ("id",)),
        ("id: g1", "id: dlg_g1", ("dlg_",)),
        ("- id: g1\n      subject", "- subject", ("needs 'id'",)),
        ("subject: {agent: support}", "subject: {}", ("g1", "neither agent nor user")),
        ("subject: {agent: support}", "subject: support", ("subject", "mapping")),
        (
            "subject: {agent: support}",
            "subject: {agent: support, role: x}",
            ("role", "agent, user"),
        ),
        ("subject: {agent: support}", "subject: {agent: null}", ("subject agent",)),
        ("subject: {agent: support}", "subject: {agent: '**'}", ("subject agent", "'**'")),
        ("subject: {agent: support}", "subject: {agent: '*bot'}", ("subject agent",)),
        ("subject: {agent: support}", "subject: {user: 'a*b'}", ("subject user",)),
        ("subject: {agent: support}", "subject: {agent: a, mode: observe}", ("top-level",)),
        ("      subject: {agent: support}\n", "", ("needs 'subject'",)),
        ("actions: [stripe.refund]", "actions: []", ("g1", "actions", "empty")),
        ("actions: [stripe.refund]", "actions: stripe.refund", ("g1", "actions", "list")),
        ("actions: [stripe.refund]", "actions: [1]", ("actions",)),
        ("actions: [stripe.refund]", "actions: ['stripe..refund']", ("actions", "empty segment")),
        ("actions: [stripe.refund]", "actions: ['*.**']", ("actions", "'*.**'")),
        ("actions: [stripe.refund]", "actions: ['stripe.?']", ("actions", "'?'")),
        ("actions: [stripe.refund]", "actions: ['stripe.a**']", ("actions",)),
        ("      actions: [stripe.refund]\n", "", ("needs 'actions'",)),
    ],
)
def test_grant_refusals(replace: str, by: str, needles: tuple[str, ...]) -> None:
    text = doc()
    assert replace in text
    refused(text.replace(replace, by), *needles)


@pytest.mark.parametrize(
    ("extra", "needles"),
    [
        ("colour: red", ("'colour'", "id, subject, actions, resources, constraints")),
        ("mode: observe", ("top-level",)),
        ("decision: allow", ("'decision'",)),
        ("resources: []", ("resources", "empty")),
        ("resources: null", ("resources", "omit")),
        ("resources: ['payment:']", ("resources", "empty segment")),
        ("resources: ['payment:*x']", ("resources",)),
        ("constraints: {}", ("constraints", "non-empty")),
        ("constraints: null", ("constraints",)),
        ("constraints: {amount: 5}", ("constraints", "amount")),
        ("constraints: {amount_lte: 1.5}", ("constraints", "float")),
        ("constraints: {amount_lte: '5'}", ("constraints", "minor units")),
        ("constraints: {user_eq: dana}", ("constraints", "arguments only")),
        ("constraints: {data_scope_in: [phi]}", ("constraints", "data_scope")),
        ("constraints: {mode: observe}", ("top-level",)),
        ("environments: []", ("environments", "empty")),
        ("environments: ['']", ("environments",)),
        ("environments: production", ("environments", "list")),
        ("expires_at: '2027-01-01'", ("expires_at", "offset")),
        ("expires_at: 2027-01-01", ("expires_at", "no time")),
        ("expires_at: '2027-01-01T00:00:00'", ("expires_at", "offset")),
        ("expires_at: 2027-01-01T00:00:00", ("expires_at", "no offset")),
        ("expires_at: soon", ("expires_at",)),
        ("expires_at: 5", ("expires_at",)),
        ("expires_at: null", ("expires_at",)),
        ("delegable: 'yes'", ("delegable", "true or false")),
        ("delegable: 1", ("delegable",)),
        ("delegable: true", ("g1", "delegable", "expires_at")),
        ("tasks: []", ("tasks", "empty")),
        ("tasks: ['run:']", ("tasks",)),
        ("budgets: []", ("budgets", "empty")),
        ("budgets: {metric: amount}", ("budgets", "list")),
        ("budgets: [amount]", ("budget", "mapping")),
        ("budgets: [{metric: amount, limit: 5}]", ("budget", "'window'")),
        (
            "budgets: [{metric: amount, limit: 5, window: P1D, per: x}]",
            ("'per'", "metric, limit, window"),
        ),
        ("budgets: [{metric: amount, limit: 5, window: P1D, mode: x}]", ("top-level",)),
        ("budgets: [{metric: '', limit: 5, window: P1D}]", ("metric",)),
        ("budgets: [{metric: amount, limit: true, window: P1D}]", ("limit",)),
        ("budgets: [{metric: amount, limit: 1.5, window: P1D}]", ("limit",)),
        ("budgets: [{metric: amount, limit: '5', window: P1D}]", ("limit",)),
        ("budgets: [{metric: amount, limit: -1, window: P1D}]", ("limit", "at least 0")),
        ("budgets: [{metric: amount, limit: 5, window: 86400}]", ("window", "numbers are refused")),
        ("budgets: [{metric: amount, limit: 5, window: P1M}]", ("window", "P1M")),
        ("budgets: [{metric: amount, limit: 5, window: P1W}]", ("window",)),
        ("budgets: [{metric: amount, limit: 5, window: PT1.5H}]", ("window",)),
        ("budgets: [{metric: amount, limit: 5, window: p1d}]", ("window",)),
        ("budgets: [{metric: amount, limit: 5, window: P0D}]", ("window", "zero")),
        ("budgets: [{metric: amount, limit: 5, window: P36526D}]", ("window", "100 years")),
    ],
)
def test_grant_key_refusals(extra: str, needles: tuple[str, ...]) -> None:
    message = refused(with_keys(extra), *needles)
    assert "<string>" in message


def test_refusals_name_the_grant_and_its_line() -> None:
    message = refused(with_keys("resources: []"))
    assert "authority grant 'g1'" in message and "line" in message


def test_duplicate_ids_refused() -> None:
    refused(doc(GRANT + GRANT), "'g1'", "used twice")


def test_tasks_and_budgets_need_v7() -> None:
    for extra in ("tasks: [run]", "budgets: [{metric: count, limit: 1, window: P1D}]"):
        refused(with_keys(extra).replace("v7", "v6"), "ctrlrun.policy/v7")
    Policy.from_yaml(with_keys("resources: ['payment:*']").replace("v7", "v3"))


def test_accepted_forms() -> None:
    policy = Policy.from_yaml(
        with_keys(
            "expires_at: 2027-01-01T00:00:00.5-05:30\n"
            "delegable: true\n"
            "budgets: [{metric: count, limit: 0, window: P1DT2H}, {metric: count, limit: 3, window: PT90S}]\n"
            "tasks: ['refund-run:*']\n"
            "environments: [production, staging]\n"
            "constraints: {currency_in: [EUR, USD], meta_eq: {mode: x}}"
        ).replace("top: 0", "")
    )
    grant = Authority.from_section(policy.authority or {}).grants[0]
    assert grant.expires_at is not None
    assert grant.expires_at.utcoffset() == -timedelta(hours=5, minutes=30)
    assert grant.expires_at.isoformat() == "2027-01-01T00:00:00.500000-05:30"
    assert grant.budgets == (Budget("count", 0, 93600), Budget("count", 3, 90))
    Policy.from_yaml(doc(top="  max_delegation_depth: 0\n"))


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("PT24H", 86400),
        ("P1D", 86400),
        ("PT90S", 90),
        ("P1DT2H", 93600),
        ("PT1M", 60),
        ("P1DT1H1M1S", 90061),
        ("P36525D", 36525 * 86400),
    ],
)
def test_parse_window(text: str, seconds: int) -> None:
    assert parse_window(text) == seconds


@pytest.mark.parametrize(
    "text",
    [
        "P",
        "PT",
        "P1DT",
        "P1M",
        "P1Y",
        "P1W",
        "PT1.5S",
        "P1.5D",
        "1D",
        "p1d",
        "P-1D",
        "PT0S",
        "P0D",
        "P36526D",
        " P1D",
        "P1D ",
        "P١D",
        86400,
        None,
        True,
    ],
)
def test_parse_window_refuses(text: object) -> None:
    with pytest.raises(PolicyError):
        parse_window(text)


# -- single grants ----------------------------------------------------------------------------


def test_grant_from_yaml_refuses_an_id_and_gives_a_child() -> None:
    with pytest.raises(PolicyError, match="id"):
        grant_from_yaml("id: x\nsubject: {agent: a}\nactions: [x]\n")
    child = grant_from_yaml(
        "subject: {agent: a}\nactions: [x]\nbudgets: [{metric: count, limit: 1, window: P1D}]\n"
    )
    assert child.id == "" and child.agent == "a" and child.budgets == (Budget("count", 1, 86400),)
    for bad in (
        "",
        "- a\n",
        "subject: {agent: a}\n",
        "subject: {agent: a}\nactions: [x]\ncolour: red\n",
    ):
        with pytest.raises(PolicyError):
            grant_from_yaml(bad)


def test_grant_from_mapping() -> None:
    grant = grant_from_mapping(
        {"id": "g", "subject": {"user": "u"}, "actions": ("a.*",)}, root=True
    )
    assert grant.id == "g" and grant.user == "u" and grant.actions == ("a.*",)
    with pytest.raises(PolicyError, match="<here>.*'id'"):
        grant_from_mapping({"subject": {"user": "u"}, "actions": ["a"]}, root=True, where="<here>")
    with pytest.raises(PolicyError, match="id"):
        grant_from_mapping({"id": "g", "subject": {"user": "u"}, "actions": ["a"]}, root=False)


def test_grant_json_round_trip_keeps_the_written_offset() -> None:
    grant = grant_from_yaml(
        "subject: {agent: a, user: u}\nactions: [x.*]\nexpires_at: '2027-01-01T09:00:00+02:00'\n"
        "delegable: true\nbudgets: [{metric: amount, limit: 5, window: PT1H}]\n"
        "constraints: {amount_lte: 5, tags_in: [[a]]}\n"
    )
    text = grant.to_json()
    assert '"expires_at":"2027-01-01T09:00:00+02:00"' in text
    assert '"window":3600' in text and '"id"' not in text
    assert text == grant.to_json() and " " not in text
    from ctrlrun.policy.authority import grant_from_json

    again = grant_from_json(text, "dlg_" + "0" * 32)
    assert again.to_json() == text and again.id == "dlg_" + "0" * 32


def test_grants_built_in_python_are_validated() -> None:
    Grant(id="", agent="a", user=None, actions=["x"])
    for kwargs in (
        {"agent": None},
        {"actions": ()},
        {"actions": ("x..y",)},
        {"resources": ("a:**:b",)},
        {"constraints": {}},
        {"constraints": {"amount": 5}},
        {"environments": ()},
        {"delegable": True},
        {"delegable": 1},
        {"expires_at": datetime(2027, 1, 1)},
        {"budgets": ()},
        {"budgets": ({"metric": "count"},)},
        {"id": "dlg_x"},
        {"id": "a b"},
    ):
        fields = {"id": "", "agent": "a", "user": None, "actions": ("x",)} | kwargs
        with pytest.raises(PolicyError):
            Grant(**fields)  # type: ignore[arg-type]
    for budget in (("", 1, 1), ("count", True, 1), ("count", 1, 0), ("count", 1, True)):
        with pytest.raises(PolicyError):
            Budget(*budget)  # type: ignore[arg-type]


def test_authority_built_in_python_is_validated() -> None:
    grant = Grant(id="g", agent="a", user=None, actions=("x",))
    assert Authority(grants=[grant]).grants == (grant,)  # type: ignore[arg-type]
    for kwargs in (
        {"max_delegation_depth": -1},
        {"max_delegation_depth": True},
        {"grants": (grant, grant)},
        {"grants": (Grant(id="", agent="a", user=None, actions=("x",)),)},
        {"grants": ("g",)},
    ):
        with pytest.raises(PolicyError):
            Authority(**kwargs)  # type: ignore[arg-type]


def test_grants_pickle_and_copy() -> None:
    import copy
    import pickle

    grant = Authority.from_section(Policy.from_yaml(WORKED).authority or {}).grants[0]
    for clone in (pickle.loads(pickle.dumps(grant)), copy.deepcopy(grant), copy.copy(grant)):
        assert clone == grant and clone.to_json() == grant.to_json()
        assert clone.holds({"amount": 5}, "stripe.refund")
        assert not clone.holds({"amount": -5}, "stripe.refund")
