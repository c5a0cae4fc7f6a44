"""Authority through a Control: the specification's worked example step by step, on every store,
with an injected clock; how the two axes combine; evidence; delegation and revocation."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

import ctrlrun
from ctrlrun import (
    ActionDenied,
    ApprovalRequired,
    AuthorityDenied,
    AuthorityEscalation,
    BudgetExhausted,
    Control,
    InvalidArgument,
    Policy,
)
from ctrlrun.authority.resolve import grant_from_yaml

from .conftest import FakeClock
from .policies import WORKED

DOCUMENT = WORKED
HUMAN = ctrlrun.Principal("head-of-support", "dana@example.com")
FINANCE = ctrlrun.Principal("finance-agent", "dana@example.com")
SUPPORT = ctrlrun.Principal("support-agent", "dana@example.com")


def child(agent: str, lte: int, *, limit: int, window: str, delegable: bool) -> Any:
    return grant_from_yaml(f"""\
subject: {{ agent: {agent}, user: "dana@example.com" }}
actions: [stripe.refund]
resources: ["payment:*"]
constraints: {{ amount_gte: 0, amount_lte: {lte} }}
environments: [production]
delegable: {str(delegable).lower()}
expires_at: "2026-12-01T00:00:00Z"
budgets:
  - {{ metric: amount, limit: {limit}, window: {window} }}
""")


class World:
    def __init__(self, store: Any, clock: FakeClock) -> None:
        self.store, self.clock = store, clock
        self.control = Control(Policy.from_yaml(DOCUMENT), store, clock=clock)
        self.ran: list[tuple[str, int]] = []

        @ctrlrun.protect("stripe.refund", effect="refund:{payment_id}", resource="payment:{payment_id}",
                         control=self.control)  # fmt: skip
        def refund(payment_id: str, amount: int) -> str:
            self.ran.append((payment_id, amount))
            return "re_" + payment_id

        self.refund = refund

    def as_support(self, payment_id: str, amount: int) -> Any:
        with ctrlrun.context(agent="support-agent", user="dana@example.com"):
            return self.refund(payment_id=payment_id, amount=amount)


@pytest.fixture
def world(store: Any, clock: FakeClock) -> World:
    clock.set(datetime(2026, 6, 1, tzinfo=timezone.utc))
    return World(store, clock)


def test_the_worked_example(world: World) -> None:
    control, store = world.control, world.store
    assert control.policy.policy_hash == (
        "sha256:4d977a1b8fb25b31314aa79703985c2e00c465769bfd2ee88362ca798748517c"
    )
    finance = control.delegate(
        "head-of-support", child("finance-agent", 2_500_000, limit=5_000_000, window="P1D", delegable=True),
        by=HUMAN,
    )  # fmt: skip
    support = control.delegate(
        finance.delegation_id, child("support-agent", 200_000, limit=250_000, window="P7D", delegable=False),
        by=FINANCE,
    )  # fmt: skip
    assert (finance.depth, support.depth) == (1, 2)

    # refund 90000: allowed, committed, charged on the support grant and both its ancestors
    assert world.as_support("p1", 90_000) == "re_p1"
    last = store.receipts()[-1]
    assert (last.decision, last.result) == ("allow", "committed")
    assert last.authority_grant_id == support.delegation_id
    assert [dict(c) for c in last.budget_charges] == [
        {"grant_id": support.delegation_id, "metric": "amount", "amount": 90_000},
        {"grant_id": finance.delegation_id, "metric": "amount", "amount": 90_000},
        {"grant_id": "head-of-support", "metric": "amount", "amount": 90_000},
    ]
    assert len(store.consumptions()) == 3

    # refund 5000000: outside the support grant's constraint; the policy is not asked
    with pytest.raises(AuthorityDenied) as denied:
        world.as_support("p2", 5_000_000)
    assert denied.value.reason == "authority_constraint"
    last = store.receipts()[-1]
    assert (last.decision, last.result, last.decision_reason) == ("deny", "denied", "authority_constraint")
    assert last.authority_grant_id is None
    types = [e.type for e in store.events() if e.action_id == last.action_id]
    assert types == ["ACTION_PROPOSED", "AUTHORITY_DENIED", "ACTION_DENIED"]

    # refund 150000: authority passes, the policy asks a human; nothing is charged
    with pytest.raises(ApprovalRequired):
        world.as_support("p3", 150_000)
    assert len(store.consumptions()) == 3

    # refund 90000 again (committed: 180000 of 250000), then once more: the weekly budget is spent
    world.as_support("p4", 90_000)
    with pytest.raises(BudgetExhausted) as exhausted:
        world.as_support("p5", 90_000)
    refusal = exhausted.value
    assert isinstance(refusal, ActionDenied) and not isinstance(refusal, AuthorityDenied)
    assert (refusal.reason, refusal.grant_id, refusal.metric, refusal.window) == (
        "budget_exhausted", support.delegation_id, "amount", 604800,
    )  # fmt: skip
    assert "70000" not in str(refusal) and "70,000" not in str(refusal)  # never the amount left
    assert store.get_effect("refund:p5") is None
    last = store.receipts()[-1]
    assert (last.decision, last.result, last.effect_key) == ("deny", "denied", "refund:p5")
    assert last.authority_grant_id == support.delegation_id and list(last.budget_charges) == []
    denial = [e for e in store.events() if e.action_id == last.action_id][-1]
    assert denial.type == "ACTION_DENIED"
    assert denial.data == {"reason": "budget_exhausted", "grant_id": support.delegation_id,
                           "metric": "amount", "window": 604800}  # fmt: skip
    assert world.ran == [("p1", 90_000), ("p4", 90_000)]

    # finance widening its constraint, or spending its budget faster: refused, dimension named
    with pytest.raises(AuthorityEscalation) as wider:
        control.delegate(finance.delegation_id,
                         child("support-agent", 5_000_000, limit=250_000, window="P7D", delegable=False),
                         by=FINANCE)  # fmt: skip
    assert (wider.value.reason, wider.value.dimension) == ("containment", "constraints")
    with pytest.raises(AuthorityEscalation) as faster:
        control.delegate(finance.delegation_id,
                         child("support-agent", 200_000, limit=250_000, window="PT1H", delegable=False),
                         by=FINANCE)  # fmt: skip
    assert (faster.value.reason, faster.value.dimension) == ("containment", "budgets")

    # support's grant is not delegable
    with pytest.raises(AuthorityEscalation) as undelegable:
        control.delegate(support.delegation_id,
                         child("support-agent", 1_000, limit=1_000, window="P7D", delegable=False),
                         by=SUPPORT)  # fmt: skip
    assert undelegable.value.reason == "parent_not_delegable"
    rejected = [e for e in store.events() if e.type == "DELEGATION_REJECTED"]
    assert [e.data.get("dimension") for e in rejected] == ["constraints", "budgets", None]
    assert all(e.action_id is None for e in rejected)
    assert len(store.delegations()) == 2  # refusals record nothing

    # revoking the middle link denies everything beneath it at the next call
    assert control.revoke(finance.delegation_id) is True
    assert control.revoke(finance.delegation_id) is False  # idempotent: no second event
    assert len([e for e in store.events() if e.type == "DELEGATION_REVOKED"]) == 1
    with pytest.raises(AuthorityDenied) as revoked:
        world.as_support("p6", 1_000)
    assert revoked.value.reason == "authority_revoked"
    assert world.ran == [("p1", 90_000), ("p4", 90_000)]


def test_authority_denies_before_the_policy_and_the_stricter_axis_wins(world: World) -> None:
    # no grant names the support agent without a delegation: no_authority, policy not evaluated
    with pytest.raises(AuthorityDenied) as denied:
        world.as_support("p1", 10)
    assert denied.value.reason == "no_authority"
    assert not [e for e in world.store.events() if e.type == "POLICY_EVALUATED"]
    # the human's own grant passes authority; the policy still denies above its bands
    with ctrlrun.context(agent="head-of-support", user="dana@example.com"):
        with pytest.raises(ActionDenied) as policy_denied:
            world.refund(payment_id="p2", amount=2_000_000)
        assert policy_denied.value.reason == "rule[2]"
        assert not isinstance(policy_denied.value, AuthorityDenied)
        last = world.store.receipts()[-1]
        assert last.authority_grant_id == "head-of-support"
        resolved = [e for e in world.store.events() if e.type == "AUTHORITY_RESOLVED"][-1]
        assert resolved.data == {"reason": "authority_grant", "grant_id": "head-of-support"}


def test_evaluate_combines_both_axes_and_writes_nothing(world: World) -> None:
    action = ctrlrun.Action("stripe.refund", {"payment_id": "p1", "amount": 10}, SUPPORT,
                            resource="payment:p1")  # fmt: skip
    before = (len(world.store.events()), len(world.store.receipts()))
    assert tuple(world.control.evaluate(action))[:2] == ("deny", "no_authority")
    own = ctrlrun.Action("stripe.refund", {"payment_id": "p1", "amount": 10}, HUMAN, resource="payment:p1")
    assert tuple(world.control.evaluate(own))[:2] == ("allow", "rule[0]")
    assert (len(world.store.events()), len(world.store.receipts())) == before


def test_an_ambiguous_effect_holds_its_charge_until_resolved_failed(world: World) -> None:
    control, store = world.control, world.store
    finance = control.delegate(
        "head-of-support", child("finance-agent", 2_500_000, limit=100_000, window="P1D", delegable=False),
        by=HUMAN,
    )  # fmt: skip

    @ctrlrun.protect("stripe.refund", effect="refund:{payment_id}", resource="payment:{payment_id}",
                     control=control)  # fmt: skip
    def lost(payment_id: str, amount: int) -> str:
        raise TimeoutError("the reply never came back")

    with ctrlrun.context(agent="finance-agent", user="dana@example.com"):
        with pytest.raises(TimeoutError):
            lost(payment_id="p1", amount=90_000)
        assert store.get_effect("refund:p1").state == "ambiguous"
        with pytest.raises(BudgetExhausted):  # held: 90000 of 100000
            lost(payment_id="p2", amount=20_000)
        store.resolve_effect("refund:p1", "failed", "cli:local")
        assert all(row.released_at is not None for row in store.consumptions(effect_key="refund:p1"))
        with pytest.raises(TimeoutError):  # released: the budget has room again
            lost(payment_id="p2", amount=20_000)
    assert finance.delegation_id in {row.grant_id for row in store.consumptions(effect_key="refund:p2")}


def test_a_budgeted_call_without_an_effect_key_is_denied(store: Any, clock: FakeClock) -> None:
    clock.set(datetime(2026, 6, 1, tzinfo=timezone.utc))
    control = Control(Policy.from_yaml(DOCUMENT), store, clock=clock)
    action = ctrlrun.Action("stripe.refund", {"payment_id": "p1", "amount": 10}, HUMAN, resource="payment:p1")
    with pytest.raises(ActionDenied) as denied:
        control.execute(action, lambda: None)
    assert denied.value.reason == "budget_unkeyed"
    last = store.receipts()[-1]
    assert (last.decision, last.result, last.decision_reason) == ("deny", "denied", "budget_unkeyed")


def test_delegate_needs_an_authority_section(store: Any, clock: FakeClock) -> None:
    plain = Policy.from_yaml("schema: ctrlrun.policy/v2\nactions:\n  a.b:\n    decision: allow\n")
    control = Control(plain, store, clock=clock)
    with pytest.raises(InvalidArgument, match="no authority: section"):
        control.delegate("root", child("x", 1, limit=1, window="P1D", delegable=False), by=HUMAN)
    assert control.authority is None


def test_an_expired_delegator_is_refused_and_recorded(world: World) -> None:
    expired = ctrlrun.Principal("head-of-support", "dana@example.com",
                                expires_at=datetime(2026, 5, 1, tzinfo=timezone.utc))  # fmt: skip
    with pytest.raises(ctrlrun.IdentityError):
        world.control.delegate(
            "head-of-support", child("finance-agent", 1, limit=1, window="P1D", delegable=False), by=expired
        )  # fmt: skip
    event = [e for e in world.store.events() if e.type == "DELEGATION_REJECTED"][-1]
    assert event.data == {"reason": "principal_expired", "parent_id": "head-of-support"}
    assert world.store.delegations() == ()


def test_an_authority_override_is_enforced_and_named_by_the_policy_hash(store: Any, clock: FakeClock) -> None:
    from ctrlrun.authority.resolve import Authority

    plain = Policy.from_yaml("schema: ctrlrun.policy/v3\nactions:\n  a.b:\n    decision: allow\n")
    section = {"grants": [{"id": "only-ops", "subject": {"agent": "ops"}, "actions": ["a.b"]}]}
    for override in (section, Authority.from_section(section)):
        control = Control(plain, store, clock=clock, authority=override)
        assert control.authority is not None and control.authority.root("only-ops") is not None
        assert control.policy_hash != plain.policy_hash
        action = ctrlrun.Action("a.b", {}, ctrlrun.Principal("someone"))
        assert tuple(control.evaluate(action))[:2] == ("deny", "no_authority")
        with pytest.raises(AuthorityDenied):
            control.execute(action, lambda: None)
        assert store.receipts()[-1].policy_hash == control.policy_hash
    assert Control(plain, store, clock=clock).policy_hash == plain.policy_hash
    with pytest.raises(InvalidArgument, match="authority"):
        Control(plain, store, clock=clock, authority=["not", "a", "section"])


@pytest.mark.parametrize("row", [
    ("dlg_" + "a" * 32, "head-of-support", 1, "{not json", "head-of-support", None, "api",
     "2026-05-01T00:00:00.000000+00:00"),
    ("dlg_" + "b" * 32, "head-of-support", 1, "{}", "head-of-support", None, "api", "yesterday"),
])  # fmt: skip
def test_an_unreadable_stored_delegation_denies_every_action(tmp_path: Any, clock: FakeClock, row: tuple) -> None:
    import sqlite3

    clock.set(datetime(2026, 6, 1, tzinfo=timezone.utc))
    store = ctrlrun.SQLiteStateStore(tmp_path / "state.db", clock=clock)
    world = World(store, clock)
    with sqlite3.connect(tmp_path / "state.db") as db:  # written by something else
        db.execute("INSERT INTO delegations (delegation_id, parent_id, depth, grant_json, "
                   "created_by_agent, created_by_user, created_via, created_at) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", row)  # fmt: skip
    with ctrlrun.context(agent="head-of-support", user="dana@example.com"):
        with pytest.raises(AuthorityDenied) as denied:
            world.refund(payment_id="p1", amount=10)
    assert denied.value.reason == "authority_unreadable"
    assert store.receipts()[-1].decision_reason == "authority_unreadable"
    own = ctrlrun.Action("stripe.refund", {"payment_id": "p1", "amount": 10}, HUMAN, resource="payment:p1")
    assert tuple(world.control.evaluate(own))[:2] == ("deny", "authority_unreadable")
    assert world.ran == []
    store.close()


def test_a_grant_with_tasks_covers_only_calls_of_a_matching_task(store: Any, clock: FakeClock) -> None:
    policy = Policy.from_yaml("""\
schema: ctrlrun.policy/v7
authority:
  grants:
    - { id: runs, subject: { agent: batch }, actions: [stripe.refund], tasks: ["refund-run:*"] }
actions:
  stripe.refund: { effect: "refund:{payment_id}", decision: allow }
""")
    control = Control(policy, store, clock=clock)

    def refunder(task: str | None) -> Any:
        @ctrlrun.protect("stripe.refund", effect="refund:{payment_id}", task=task, control=control)
        def refund(payment_id: str, batch: str) -> str:
            return "ok"

        return refund

    with ctrlrun.context(agent="batch"):
        assert refunder("refund-run:{batch}")(payment_id="p1", batch="b7") == "ok"
        for task in (None, "cleanup:{batch}"):
            with pytest.raises(AuthorityDenied) as denied:
                refunder(task)(payment_id="p2", batch="b7")
            assert denied.value.reason == "authority_task"
    committed = [r for r in store.receipts() if r.result == "committed"]
    assert [r.task for r in committed] == ["refund-run:b7"]
    started = [e for e in store.events() if e.type == "EXECUTION_STARTED"]
    assert started[0].data["task"] == "refund-run:b7"


def test_a_budget_refusal_leaves_a_presented_approval_granted(world: World) -> None:
    control, store = world.control, world.store
    support = control.delegate(
        "head-of-support", child("support-agent", 200_000, limit=150_000, window="P1D", delegable=False),
        by=HUMAN,
    )  # fmt: skip
    world.as_support("p1", 90_000)  # 90000 of 150000 spent
    with pytest.raises(ApprovalRequired) as required:
        world.as_support("p2", 120_000)  # the policy asks a human; nothing charged yet
    request_id = required.value.request_id
    store.grant_approval(request_id, "ops:ada")
    with ctrlrun.with_approval(request_id), pytest.raises(BudgetExhausted) as exhausted:
        world.as_support("p2", 120_000)
    assert exhausted.value.grant_id == support.delegation_id
    assert store.get_approval(request_id).status == "granted"
    assert store.get_effect("refund:p2") is None
    last = store.receipts()[-1]
    assert (last.decision, last.result, last.approval_id, last.approver) == ("deny", "denied", request_id, None)
    types = [e.type for e in store.events() if e.action_id == last.action_id]
    assert types == ["ACTION_PROPOSED", "AUTHORITY_RESOLVED", "POLICY_EVALUATED", "ACTION_DENIED"]
    assert world.ran == [("p1", 90_000)]
