"""Authority at run time: resolution, the delegation walk, creation checks, containment and
budget charges (08 §4–§7), all with an injected ``now``."""

from __future__ import annotations

import itertools
import logging
import re
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from ctrlrun.action import Action, Principal
from ctrlrun.authority.resolve import (
    DENIAL_REASONS,
    Authority,
    Budget,
    Charge,
    DelegationRecord,
    Grant,
    Resolution,
    UnreadableDelegation,
    charges_for,
    check_delegation,
    containment,
    grant_from_yaml,
    new_delegation_id,
    read_delegation,
    resolve,
)
from ctrlrun.errors import ActionDenied, AuthorityEscalation, InvalidArgument
from ctrlrun.policy import Policy

NOW = datetime(2026, 6, 1, tzinfo=timezone.utc)
END = datetime(2026, 12, 1, tzinfo=timezone.utc)
DANA = "dana@example.com"


def grant(
    grant_id: str = "",
    agent: str | None = "bot",
    user: str | None = None,
    actions: tuple[str, ...] = ("stripe.refund",),
    **kwargs: Any,
) -> Grant:
    return Grant(id=grant_id, agent=agent, user=user, actions=actions, **kwargs)


def bounded(low: int, high: int) -> dict[str, int]:
    return {"amount_gte": low, "amount_lte": high}


_ids = itertools.count(1)


def dlg(n: int | None = None) -> str:
    return f"dlg_{n if n is not None else next(_ids):032x}"


def record(
    child: Grant,
    parent_id: str,
    delegation_id: str | None = None,
    *,
    depth: int = 1,
    revoked: bool = False,
    via: str = "api",
    grant_json: str | None = None,
) -> DelegationRecord:
    return DelegationRecord(
        delegation_id=delegation_id or dlg(),
        parent_id=parent_id,
        depth=depth,
        grant_json=child.to_json() if grant_json is None else grant_json,
        created_by_agent="lead",
        created_by_user=DANA,
        created_via=via,
        created_at=NOW - timedelta(days=1),
        revoked_at=NOW - timedelta(hours=1) if revoked else None,
        revoked_by="ops" if revoked else None,
    )


def act(
    agent: str = "bot",
    user: str | None = DANA,
    name: str = "stripe.refund",
    resource: str | None = "payment:1",
    **arguments: Any,
) -> Action:
    if not arguments:
        arguments = {"amount": 10}
    return Action(name, arguments, Principal(agent, user), resource=resource)


def run(
    authority: Authority,
    records: list[DelegationRecord] | tuple[DelegationRecord, ...] = (),
    action: Action | None = None,
    *,
    environment: str = "production",
    task: str | None = None,
    now: datetime = NOW,
) -> Resolution:
    return resolve(
        authority,
        list(records),
        action=action or act(),
        environment=environment,
        task=task,
        now=now,
    )


ROOT = grant(
    "root",
    agent="lead",
    user=DANA,
    constraints=bounded(0, 1000),
    delegable=True,
    expires_at=END + timedelta(days=30),
)
MID = grant(agent="mid", user=DANA, constraints=bounded(0, 500), delegable=True, expires_at=END)
LEAF = grant(agent="bot", user=DANA, constraints=bounded(0, 100), expires_at=END)
MID_ID, LEAF_ID = dlg(0xA1), dlg(0xA2)


def chain(
    root: Grant = ROOT, *, mid_revoked: bool = False, leaf_revoked: bool = False
) -> tuple[Authority, list[DelegationRecord]]:
    authority = Authority(max_delegation_depth=3, grants=(root,))
    return authority, [
        record(MID, "root", MID_ID, revoked=mid_revoked),
        record(LEAF, MID_ID, LEAF_ID, depth=2, revoked=leaf_revoked),
    ]


# -- resolution -------------------------------------------------------------------------------


def test_a_root_grant_passes() -> None:
    authority = Authority(grants=(grant("g", agent="bot"),))
    resolution = run(authority)
    assert resolution.passed and resolution.reason == "authority_grant"
    assert resolution.event_data() == {"reason": "authority_grant", "grant_id": "g"}
    assert resolution.chain == authority.grants and resolution.delegation_id is None


def test_a_delegation_passes_with_its_walked_depth_and_chain() -> None:
    authority, records = chain()
    resolution = run(authority, records)
    assert resolution.passed
    assert resolution.event_data() == {
        "reason": "authority_grant",
        "grant_id": LEAF_ID,
        "delegation_id": LEAF_ID,
        "depth": 2,
    }
    assert [g.id for g in resolution.chain] == [LEAF_ID, MID_ID, "root"]


def test_depth_is_walked_never_the_stored_column() -> None:
    authority, records = chain()
    records = [replace(r, depth=9) for r in records]
    assert run(authority, records).depth == 2


@pytest.mark.parametrize(
    "action",
    [
        act(name="stripe.payout"),
        act(agent="other"),
        act(user=None),
        act(user="eve@example.com"),
        act(resource=None),
        act(resource="card:1"),
    ],
)
def test_no_grant_of_that_shape_is_no_authority(action: Action) -> None:
    authority = Authority(grants=(grant("g", agent="bot", user=DANA, resources=("payment:*",)),))
    resolution = run(authority, action=action)
    assert not resolution.passed
    assert resolution.event_data() == {"reason": "no_authority"}


def test_environments_are_exact() -> None:
    authority = Authority(grants=(grant("g", environments=("production",)),))
    assert run(authority, environment="production").passed
    assert run(authority, environment="Production").reason == "no_authority"


def test_empty_grants_deny_everything() -> None:
    assert run(Authority(grants=())).reason == "no_authority"


def test_subject_rules() -> None:
    any_agent = Authority(grants=(grant("g", agent=None, user=DANA),))
    assert run(any_agent, action=act(agent="anyone")).passed
    assert run(any_agent, action=act(user=None)).reason == "no_authority"
    any_user = Authority(grants=(grant("g", agent="bot*"),))
    assert run(any_user, action=act(agent="bot-7", user=None)).passed
    assert run(any_user, action=act(agent="bot-7", user="x")).passed
    assert run(any_user, action=act(agent="robot")).reason == "no_authority"


def test_constraints_must_all_hold_and_an_absent_argument_warns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    authority = Authority(grants=(grant("g", constraints=bounded(0, 100)),))
    assert run(authority, action=act(amount=100)).passed
    denied = run(authority, action=act(amount=101))
    assert denied.event_data() == {"reason": "authority_constraint", "grant_id": "g"}
    assert run(authority, action=act(amount=-1)).reason == "authority_constraint"
    with caplog.at_level(logging.WARNING, logger="ctrlrun.policy"):
        assert run(authority, action=act(total=5)).reason == "authority_constraint"
    assert "absent" in caplog.text and "'amount'" in caplog.text


def test_expiry_is_inclusive() -> None:
    authority = Authority(grants=(grant("g", expires_at=NOW),))
    assert run(authority, now=NOW).passed
    late = run(authority, now=NOW + timedelta(microseconds=1))
    assert late.event_data() == {"reason": "authority_expired", "grant_id": "g"}


def test_task_rule() -> None:
    authority = Authority(grants=(grant("g", tasks=("refund-run:*",)),))
    assert run(authority, task="refund-run:7").passed
    assert run(authority, task=None).reason == "authority_task"
    assert run(authority, task="refund-run:7:x").reason == "authority_task"
    assert run(authority, task="other:7").reason == "authority_task"
    untasked = Authority(grants=(grant("g"),))
    assert run(untasked, task="anything at all").passed and run(untasked).passed


def test_a_revoked_delegation_is_revoked() -> None:
    authority, records = chain(leaf_revoked=True)
    assert run(authority, records).event_data() == {
        "reason": "authority_revoked",
        "grant_id": LEAF_ID,
        "delegation_id": LEAF_ID,
        "depth": 2,
    }


def test_a_revoked_middle_link_denies_its_descendants() -> None:
    authority, records = chain(mid_revoked=True)
    resolution = run(authority, records)
    assert resolution.reason == "authority_revoked" and resolution.grant_id == LEAF_ID
    assert resolution.chain == ()


def test_a_missing_parent_is_an_escalation() -> None:
    authority, records = chain()
    resolution = run(authority, records[1:])
    assert resolution.reason == "authority_escalation"
    assert resolution.detail == {"missing_parent_id": MID_ID}
    gone = Authority(grants=(grant("other", agent="nobody"),))  # the root left the file
    assert run(gone, records).event_data()["missing_parent_id"] == "root"


def test_an_expired_ancestor_is_an_escalation_and_own_expiry_is_expired() -> None:
    authority, records = chain()
    later = END + timedelta(seconds=1)
    resolution = run(authority, records, now=later)
    assert resolution.reason == "authority_escalation"
    assert resolution.detail == {"expired_parent_id": MID_ID}
    mid = replace(MID, expires_at=END + timedelta(days=1))
    records[0] = record(mid, "root", MID_ID)
    assert run(authority, records, now=later).reason == "authority_expired"


def test_narrowing_the_root_denies_descendants_by_dimension() -> None:
    authority, records = chain(replace(ROOT, constraints=bounded(0, 400)))
    resolution = run(authority, records)
    assert resolution.reason == "authority_escalation"
    assert resolution.detail == {"dimension": "constraints"}
    assert resolution.event_data()["dimension"] == "constraints"


def test_an_undelegable_root_cuts_every_descendant() -> None:
    authority, records = chain(replace(ROOT, delegable=False))
    resolution = run(authority, records)
    assert resolution.reason == "authority_escalation" and resolution.detail == {}
    assert resolution.grant_id == LEAF_ID


def test_too_deep_is_an_escalation() -> None:
    _, records = chain()
    shallow = Authority(max_delegation_depth=1, grants=(ROOT,))
    resolution = run(shallow, records)
    assert resolution.reason == "authority_escalation"
    assert resolution.detail == {"depth_exceeded": 1}
    deeper = Authority(max_delegation_depth=0, grants=(ROOT,))
    assert run(deeper, records).detail == {"depth_exceeded": 0}


def test_walk_failures_come_in_order() -> None:
    """Missing beats revoked beats expired ancestor beats containment."""
    authority, records = chain(replace(ROOT, constraints=bounded(0, 400)), leaf_revoked=True)
    assert run(authority, records).reason == "authority_revoked"
    late = END + timedelta(seconds=1)
    assert run(authority, records, now=late).reason == "authority_revoked"
    authority2, records2 = chain(replace(ROOT, constraints=bounded(0, 400)))
    assert run(authority2, records2, now=late).detail == {"expired_parent_id": MID_ID}
    assert run(authority2, records2[1:]).detail == {"missing_parent_id": MID_ID}


@pytest.mark.parametrize(
    "row",
    [
        {"grant_json": "{not json"},
        {"grant_json": '{"subject": {"agent": "bot"}}'},
        {"grant_json": LEAF.to_json().replace('"actions"', '"id":"x","actions"')},
        {"grant_json": LEAF.to_json().replace('"actions"', '"actions":["y"],"actions"')},
        {"grant_json": LEAF.to_json().replace("100", "1.5")},
        {"delegation_id": "dlg_" + "A" * 32},
        {"delegation_id": "dlg_123"},
        {"delegation_id": "root"},
        {"parent_id": "dlg_xyz"},
        {"parent_id": ""},
        {"created_via": "console"},
        {"created_by_agent": ""},
        {"depth": 0},
        {"created_at": datetime(2026, 1, 1)},
    ],
)
def test_an_unreadable_row_denies_every_action(row: dict[str, Any]) -> None:
    authority, records = chain()
    unrelated = Authority(
        max_delegation_depth=3, grants=(ROOT, grant("open", agent=None, user=DANA))
    )
    bad = replace(record(LEAF, MID_ID), **row)
    with pytest.raises(UnreadableDelegation):
        read_delegation(bad)
    for auth in (authority, unrelated):
        resolution = run(auth, [*records, bad], act(name="stripe.refund"))
        assert resolution.reason == "authority_unreadable" and not resolution.passed
        assert resolution.grant_id is None
    assert run(unrelated, records).passed


def test_a_cycle_is_unreadable() -> None:
    a, b = dlg(0xC1), dlg(0xC2)
    authority, records = chain()
    cycle = [record(LEAF, b, a), record(LEAF, a, b)]
    resolution = run(authority, [*records, *cycle])
    assert resolution.event_data() == {"reason": "authority_unreadable", "cycle_at": a}
    self_loop = record(LEAF, dlg(0xC3), dlg(0xC3))
    assert run(authority, [*records, self_loop]).detail == {"cycle_at": dlg(0xC3)}


def test_reasons_follow_the_precedence_order() -> None:
    """One shape-matching candidate per reason; taking them away from the top, the reported
    reason steps down the list in order."""
    root = grant(
        "a-root", agent="lead", user=DANA, constraints=bounded(0, 5), delegable=True, expires_at=END
    )
    roots = {
        "authority_task": grant("t", tasks=("run:*",)),
        "authority_expired": grant("e", expires_at=NOW - timedelta(days=1)),
        "authority_constraint": grant("c", constraints=bounded(0, 1)),
    }
    child = grant(user=DANA, constraints=bounded(0, 5), expires_at=END)
    rows = {
        "authority_escalation": record(child, dlg(0xE0), dlg(0xE1)),
        "authority_revoked": record(child, "a-root", dlg(0xE2), revoked=True),
    }
    unreadable = record(child, "a-root", dlg(0xE3), grant_json="[]")
    order = [
        "authority_unreadable",
        "authority_escalation",
        "authority_revoked",
        "authority_expired",
        "authority_task",
        "authority_constraint",
        "no_authority",
    ]
    assert tuple(order) == DENIAL_REASONS
    for index, expected in enumerate(order):
        present = order[index:]
        grants = [root] + [g for reason, g in roots.items() if reason in present]
        records = [r for reason, r in rows.items() if reason in present]
        if "authority_unreadable" in present:
            records.append(unreadable)
        resolution = run(Authority(grants=tuple(grants)), records, act(amount=10))
        assert resolution.reason == expected, (present, resolution)


def test_ties_go_to_the_id_first_by_code_point() -> None:
    grants = (
        grant("beta", constraints=bounded(0, 1)),
        grant("Zulu", constraints=bounded(0, 1)),
        grant("alpha", constraints=bounded(0, 1)),
    )
    assert run(Authority(grants=grants)).grant_id == "Zulu"
    passing = (grant("beta"), grant("alpha"), grant("Zulu"))
    assert run(Authority(grants=passing)).grant_id == "Zulu"
    # a passing grant beats any failure, whatever its id
    mixed = (grant("a", constraints=bounded(0, 1)), grant("z"))
    assert run(Authority(grants=mixed)).grant_id == "z"


def test_reordering_the_document_or_the_rows_changes_nothing() -> None:
    grants = [
        grant("x", constraints=bounded(0, 1)),
        grant("y", expires_at=NOW - timedelta(1)),
        ROOT,
        grant("w", tasks=("t:*",)),
    ]
    _, records = chain()
    records.append(record(LEAF, "root", dlg(0xB1), revoked=True))
    results = set()
    for ordered in itertools.permutations(grants):
        for rows in (records, records[::-1]):
            resolution = run(Authority(grants=tuple(ordered)), rows)
            results.add((resolution.reason, resolution.grant_id, resolution.depth))
    assert results == {("authority_grant", LEAF_ID, 2)}
    failing = [g for g in grants if g is not ROOT]
    seen = {
        run(Authority(grants=tuple(p))).event_data()["grant_id"]
        for p in itertools.permutations(failing)
    }
    assert len(seen) == 1


def test_resolve_never_raises() -> None:
    class Broken:
        delegation_id = property(lambda self: 1 / 0)

    authority, _ = chain()
    assert run(authority, [Broken()]).reason == "authority_unreadable"  # type: ignore[list-item]


# -- reading rows -----------------------------------------------------------------------------


def test_read_delegation_round_trip() -> None:
    row = record(LEAF, MID_ID, LEAF_ID, depth=2, revoked=True, via="cli")
    delegation = read_delegation(row)
    assert delegation.delegation_id == LEAF_ID and delegation.parent_id == MID_ID
    assert delegation.grant.id == LEAF_ID and delegation.grant.to_json() == LEAF.to_json()
    assert delegation.created_by == Principal("lead", DANA)
    assert delegation.created_via == "cli" and delegation.revoked_by == "ops"
    with pytest.raises(AttributeError):
        delegation.depth = 3  # type: ignore[misc]


def test_new_delegation_ids() -> None:
    ids = {new_delegation_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(re.fullmatch(r"dlg_[0-9a-f]{32}", i) for i in ids)


# -- creation ---------------------------------------------------------------------------------

LEAD = Principal("lead", DANA)
MIDDLE = Principal("mid", DANA)


def test_check_delegation_returns_the_depth() -> None:
    authority, records = chain()
    assert check_delegation(authority, [], "root", MID, LEAD, NOW) == 1
    assert check_delegation(authority, records[:1], MID_ID, LEAF, MIDDLE, NOW) == 2


def refusal(
    authority: Authority,
    records: list[DelegationRecord],
    parent_id: str,
    child: Grant,
    by: Principal,
    now: datetime = NOW,
) -> AuthorityEscalation:
    with pytest.raises(AuthorityEscalation) as info:
        check_delegation(authority, records, parent_id, child, by, now)
    error = info.value
    assert error.parent_id == parent_id
    assert error.reason in str(error)
    return error


def test_unknown_parent() -> None:
    authority, records = chain(mid_revoked=True)
    assert refusal(authority, records, dlg(0xFF), LEAF, MIDDLE).reason == "unknown_parent"
    assert refusal(authority, records, MID_ID, LEAF, MIDDLE).reason == "unknown_parent"


def test_parent_not_delegable() -> None:
    authority, records = chain()
    closed = Authority(grants=(replace(ROOT, delegable=False),))
    assert refusal(closed, [], "root", MID, LEAD).reason == "parent_not_delegable"
    assert (
        refusal(authority, records, LEAF_ID, LEAF, Principal("bot", DANA)).reason
        == "parent_not_delegable"
    )


def test_parent_not_valid() -> None:
    authority, records = chain()
    late = END + timedelta(seconds=1)
    assert refusal(authority, records, MID_ID, LEAF, MIDDLE, late).reason == "parent_not_valid"
    expired_root = Authority(grants=(replace(ROOT, expires_at=NOW - timedelta(1)),))
    assert refusal(expired_root, [], "root", MID, LEAD).reason == "parent_not_valid"
    # a delegable grandchild whose grandparent was revoked
    deep = replace(LEAF, delegable=True)
    rows = [record(MID, "root", MID_ID, revoked=True), record(deep, MID_ID, LEAF_ID, depth=2)]
    child = replace(LEAF, agent="tiny")
    assert (
        refusal(authority, rows, LEAF_ID, child, Principal("bot", DANA)).reason
        == "parent_not_valid"
    )
    broken = [*records, record(LEAF, "root", dlg(0xEE), grant_json="{}")]
    assert refusal(authority, broken, "root", MID, LEAD).reason == "parent_not_valid"


def test_not_the_subject() -> None:
    authority, _ = chain()
    assert refusal(authority, [], "root", MID, Principal("mid", DANA)).reason == "not_the_subject"
    assert refusal(authority, [], "root", MID, Principal("lead")).reason == "not_the_subject"


def test_max_depth() -> None:
    _, records = chain()
    one = Authority(max_delegation_depth=1, grants=(ROOT,))
    assert refusal(one, records[:1], MID_ID, LEAF, MIDDLE).reason == "max_depth"
    none = Authority(max_delegation_depth=0, grants=(ROOT,))
    assert refusal(none, [], "root", MID, LEAD).reason == "max_depth"


def test_containment_refusal_names_the_dimension() -> None:
    authority, _ = chain()
    wide = replace(MID, constraints=bounded(0, 5000))
    error = refusal(authority, [], "root", wide, LEAD)
    assert error.reason == "containment" and error.dimension == "constraints"
    assert "constraints" in str(error)


def test_creation_checks_come_in_order() -> None:
    authority, _ = chain()
    wide = replace(MID, constraints=bounded(0, 5000))
    assert refusal(authority, [], "root", wide, MIDDLE).reason == "not_the_subject"
    closed = Authority(max_delegation_depth=0, grants=(replace(ROOT, delegable=False),))
    assert refusal(closed, [], "root", wide, MIDDLE).reason == "parent_not_delegable"
    zero = Authority(max_delegation_depth=0, grants=(ROOT,))
    assert refusal(zero, [], "root", wide, LEAD).reason == "max_depth"


def test_a_child_with_an_id_is_a_usage_error() -> None:
    authority, _ = chain()
    with pytest.raises(InvalidArgument):
        check_delegation(authority, [], "root", replace(MID, id="named"), LEAD, NOW)


# -- containment, one dimension at a time -----------------------------------------------------

PARENT = grant(
    "p",
    agent="lead",
    user="dana@*",
    actions=("stripe.*",),
    resources=("payment:EU-*",),
    tasks=("run:*",),
    constraints={
        "amount_lte": 100,
        "amount_gte": 0,
        "currency_in": ["EUR", "USD"],
        "live_eq": True,
    },
    environments=("production", "staging"),
    expires_at=END,
    delegable=True,
    budgets=(Budget("amount", 1000, 86400),),
)
CHILD = grant(
    agent="bot",
    user=DANA,
    actions=("stripe.refund",),
    resources=("payment:EU-1",),
    tasks=("run:7",),
    constraints={
        "amount_lte": 50,
        "amount_gte": 1,
        "currency_in": ["EUR"],
        "live_eq": True,
        "x_eq": 1,
    },
    environments=("production",),
    expires_at=END,
    budgets=(Budget("amount", 1000, 86400), Budget("count", 5, 60)),
)


def test_a_narrower_child_is_contained() -> None:
    assert containment(CHILD, PARENT) is None
    assert containment(PARENT, PARENT) is not None  # '*' in the subject is never delegable
    loose = grant("p", agent="lead", actions=("stripe.*",), delegable=True, expires_at=END)
    assert (
        containment(
            replace(CHILD, resources=None, tasks=None, environments=None, budgets=None), loose
        )
        is None
    )


@pytest.mark.parametrize(
    "change",
    [
        {"agent": None, "user": DANA},
        {"agent": "bot*"},
        {"user": None},
        {"user": "dana*"},
        {"user": "eve@example.com"},
    ],
)
def test_dimension_subject(change: dict[str, Any]) -> None:
    assert containment(replace(CHILD, **change), PARENT) == "subject"


def test_dimension_subject_child_user_without_a_parent_user() -> None:
    parent = replace(PARENT, user=None)
    assert containment(replace(CHILD, user=None), parent) is None
    assert containment(replace(CHILD, user="eve"), parent) is None
    assert containment(replace(CHILD, user="e*"), parent) == "subject"


@pytest.mark.parametrize("actions", [("stripe.**",), ("stripe.refund", "github.push"), ("*",)])
def test_dimension_actions(actions: tuple[str, ...]) -> None:
    assert containment(replace(CHILD, actions=actions), PARENT) == "actions"


@pytest.mark.parametrize("resources", [None, ("payment:*",), ("payment:EU-1:leg",)])
def test_dimension_resources(resources: tuple[str, ...] | None) -> None:
    assert containment(replace(CHILD, resources=resources), PARENT) == "resources"


@pytest.mark.parametrize("tasks", [None, ("run:**",), ("walk:1",)])
def test_dimension_tasks(tasks: tuple[str, ...] | None) -> None:
    assert containment(replace(CHILD, tasks=tasks), PARENT) == "tasks"


@pytest.mark.parametrize(
    "constraints",
    [
        None,
        {"amount_lte": 50, "amount_gte": 1, "currency_in": ["EUR"]},
        {"amount_lte": 101, "amount_gte": 1, "currency_in": ["EUR"], "live_eq": True},
        {"amount_lte": 50, "amount_gte": -1, "currency_in": ["EUR"], "live_eq": True},
        {"amount_lte": 50, "amount_gte": 1, "currency_in": ["EUR", "GBP"], "live_eq": True},
        {"amount_lte": 50, "amount_gte": 1, "currency_in": ["EUR"], "live_eq": 1},
        {"amount_lt": 50, "amount_gte": 1, "currency_in": ["EUR"], "live_eq": True},
    ],
)
def test_dimension_constraints(constraints: dict[str, Any] | None) -> None:
    assert containment(replace(CHILD, constraints=constraints), PARENT) == "constraints"


def test_dimension_constraints_equal_operands_are_contained() -> None:
    same = replace(CHILD, constraints=dict(PARENT.constraints or {}))
    assert containment(same, PARENT) is None


@pytest.mark.parametrize("environments", [None, ("production", "dev")])
def test_dimension_environments(environments: tuple[str, ...] | None) -> None:
    assert containment(replace(CHILD, environments=environments), PARENT) == "environments"


@pytest.mark.parametrize("expires_at", [None, END + timedelta(seconds=1)])
def test_dimension_expires_at(expires_at: datetime | None) -> None:
    assert containment(replace(CHILD, expires_at=expires_at), PARENT) == "expires_at"


@pytest.mark.parametrize(
    "budgets",
    [
        None,
        (Budget("count", 5, 60),),
        (Budget("amount", 1001, 86400),),
        (Budget("amount", 1000, 3600),),
    ],
)
def test_dimension_budgets(budgets: tuple[Budget, ...] | None) -> None:
    assert containment(replace(CHILD, budgets=budgets), PARENT) == "budgets"


def test_the_first_dimension_in_table_order_is_reported() -> None:
    both = replace(CHILD, actions=("stripe.**",), budgets=None, agent="*")
    assert containment(both, PARENT) == "subject"
    assert containment(replace(both, agent="bot"), PARENT) == "actions"


# -- charges ----------------------------------------------------------------------------------


def budgeted_chain() -> tuple[Authority, list[DelegationRecord]]:
    root = replace(ROOT, budgets=(Budget("amount", 10_000, 86400),))
    mid = replace(MID, budgets=(Budget("amount", 5000, 86400), Budget("count", 10, 3600)))
    leaf = replace(LEAF, budgets=(Budget("count", 3, 3600), Budget("amount", 1000, 604800)))
    authority = Authority(grants=(root,))
    return authority, [record(mid, "root", MID_ID), record(leaf, MID_ID, LEAF_ID, depth=2)]


def test_charges_come_in_chain_order() -> None:
    authority, records = budgeted_chain()
    resolution = run(authority, records, act(amount=90, count=50))
    assert charges_for(resolution, {"amount": 90, "count": 50}, "refund:1") == (
        Charge(LEAF_ID, "count", 1, 3, 3600),
        Charge(LEAF_ID, "amount", 90, 1000, 604800),
        Charge(MID_ID, "amount", 90, 5000, 86400),
        Charge(MID_ID, "count", 1, 10, 3600),
        Charge("root", "amount", 90, 10_000, 86400),
    )


def test_ancestors_without_budgets_are_skipped_and_none_means_no_charges() -> None:
    authority, records = chain()
    resolution = run(authority, records)
    assert charges_for(resolution, {"amount": 10}, None) == ()
    leaf_only = [
        records[0],
        record(replace(LEAF, budgets=(Budget("amount", 5, 60),)), MID_ID, LEAF_ID),
    ]
    charged = charges_for(run(authority, leaf_only), {"amount": 3}, "k")
    assert charged == (Charge(LEAF_ID, "amount", 3, 5, 60),)
    denied = run(authority, records, act(amount=5000))
    assert charges_for(denied, {"amount": 5000}, "k") == ()


@pytest.mark.parametrize(
    "arguments",
    [{}, {"amount": "90"}, {"amount": True}, {"amount": -1}, {"amount": None}, {"amount": [1]}],
)
def test_budget_unmeasurable(arguments: dict[str, Any]) -> None:
    authority, records = budgeted_chain()
    resolution = run(authority, records)
    with pytest.raises(ActionDenied) as info:
        charges_for(resolution, arguments, "refund:1", action_id="act_1")
    assert info.value.reason == "budget_unmeasurable" and info.value.action_id == "act_1"
    assert LEAF_ID in str(info.value) and "'amount'" in str(info.value)


def test_budget_unkeyed() -> None:
    authority, records = budgeted_chain()
    resolution = run(authority, records)
    with pytest.raises(ActionDenied) as info:
        charges_for(resolution, {"amount": 5}, None)
    assert info.value.reason == "budget_unkeyed"
    assert LEAF_ID in str(info.value) and "effect" in str(info.value)


def test_count_beats_an_argument_named_count() -> None:
    authority = Authority(grants=(grant("g", budgets=(Budget("count", 2, 60),)),))
    resolution = run(authority, action=act(count="lots"))
    assert charges_for(resolution, {"count": "lots"}, "k") == (Charge("g", "count", 1, 2, 60),)


# -- 08 §11, the rules' part ------------------------------------------------------------------

WORKED = """\
schema: ctrlrun.policy/v7
authority:
  max_delegation_depth: 2
  grants:
    - id: head-of-support
      subject: { agent: "head-of-support", user: "dana@example.com" }
      actions: ["stripe.refund"]
      resources: ["payment:*"]
      constraints: { amount_gte: 0, amount_lte: 10000000 }
      environments: ["production"]
      delegable: true
      expires_at: "2027-01-01T00:00:00Z"
      budgets:
        - { metric: amount, limit: 50000000, window: P1D }
actions:
  stripe.refund: {decision: allow}
"""
CHILD_YAML = """\
subject: {{agent: {agent}, user: dana@example.com}}
actions: [stripe.refund]
resources: ["payment:*"]
environments: [production]
expires_at: "2026-12-01T00:00:00Z"
constraints: {{amount_gte: 0, amount_lte: {high}}}
{extra}budgets: [{{metric: amount, limit: {limit}, window: {window}}}]
"""


def test_worked_example() -> None:
    authority = Authority.from_section(Policy.from_yaml(WORKED).authority or {})
    finance = grant_from_yaml(
        CHILD_YAML.format(
            agent="finance-agent",
            high=2500000,
            extra="delegable: true\n",
            limit=5000000,
            window="P1D",
        )
    )
    support = grant_from_yaml(
        CHILD_YAML.format(agent="support-agent", high=200000, extra="", limit=250000, window="P7D")
    )
    head = Principal("head-of-support", DANA)
    fin = Principal("finance-agent", DANA)
    assert check_delegation(authority, [], "head-of-support", finance, head, NOW) == 1
    finance_id, support_id = new_delegation_id(), new_delegation_id()
    rows = [record(finance, "head-of-support", finance_id)]
    assert check_delegation(authority, rows, finance_id, support, fin, NOW) == 2
    rows.append(record(support, finance_id, support_id, depth=2))

    def refund(amount: int) -> Resolution:
        action = Action(
            "stripe.refund",
            {"payment_id": "txn_1", "amount": amount},
            Principal("support-agent", DANA),
            resource="payment:txn_1",
        )
        return resolve(authority, rows, action=action, environment="production", task=None, now=NOW)

    ok = refund(90000)
    assert ok.passed and ok.grant_id == support_id and ok.depth == 2
    assert [c.amount for c in charges_for(ok, {"amount": 90000}, "refund:txn_1")] == [90000] * 3
    assert refund(5000000).reason == "authority_constraint"
    wider = grant_from_yaml(
        CHILD_YAML.format(agent="x", high=5000000, extra="", limit=5000000, window="P1D")
    )
    faster = grant_from_yaml(
        CHILD_YAML.format(agent="x", high=2500000, extra="", limit=5000000, window="PT1H")
    )
    for child, dimension in ((wider, "constraints"), (faster, "budgets")):
        with pytest.raises(AuthorityEscalation) as info:
            check_delegation(authority, rows, finance_id, child, fin, NOW)
        assert (info.value.reason, info.value.dimension) == ("containment", dimension)
    with pytest.raises(AuthorityEscalation) as info:
        check_delegation(authority, rows, support_id, wider, Principal("support-agent", DANA), NOW)
    assert info.value.reason == "parent_not_delegable"
    rows[0] = replace(rows[0], revoked_at=NOW, revoked_by="cli:local")
    assert refund(1000).reason == "authority_revoked"
