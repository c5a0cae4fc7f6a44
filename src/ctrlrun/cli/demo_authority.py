"""The demo's fifth scenario: a delegation chain that narrows, and the two axes an action needs."""

from __future__ import annotations

from datetime import timedelta

from .._time import format_ts
from ..action import Action, Principal
from ..control.front import Control
from ..errors import ApprovalRequired, AuthorityDenied, AuthorityEscalation, CTRLRunError
from ..policy import Policy
from .demo_world import DemoWorld
from .text import say

__all__ = ["authority_escalation"]

INDENT = "   "
HUMAN = Principal("head-of-support", "dana@example.com")
FINANCE = Principal("finance-agent", "dana@example.com")
SUPPORT = Principal("support-agent", "dana@example.com")


def _policy(expires_at: str) -> str:
    """The scenario's policy: the demo's refund rules, and a human's delegable grant."""
    return f"""\
schema: ctrlrun.policy/v3
authority:
  max_delegation_depth: 3
  grants:
    - id: head-of-support
      subject: {{ agent: head-of-support, user: "dana@example.com" }}
      actions: [stripe.refund]
      constraints: {{ amount_lte: 10000000 }}
      delegable: true
      expires_at: "{expires_at}"
actions:
  stripe.refund:
    effect: "refund:{{payment_id}}"
    rules:
      - when: {{ amount_gte: 0, amount_lte: 100000 }}
        decision: allow
      - when: {{ amount_gte: 0, amount_lte: 1000000 }}
        decision: approve
      - decision: deny
"""


def _grant(agent: str, amount_lte: int, expires_at: str) -> str:
    return f"""\
subject: {{ agent: {agent}, user: "dana@example.com" }}
actions: [stripe.refund]
constraints: {{ amount_lte: {amount_lte} }}
delegable: true
expires_at: "{expires_at}"
"""


def _money(minor: int) -> str:
    return f"€{minor // 100:,}"


def _refund(control: Control, payment_id: str, amount: int) -> Action:
    return Action(
        "stripe.refund",
        {"payment_id": payment_id, "amount": amount, "currency": "EUR"},
        SUPPORT,
        resource=f"payment:{payment_id}",
        environment=control.environment,
    )


def authority_escalation(world: DemoWorld) -> bool:
    """A human's €100,000 grant, narrowed twice; asking beyond the narrowest one is refused."""
    from ..authority.resolve import grant_from_yaml

    now = world.control.clock()
    root_expiry = format_ts(now + timedelta(days=365))
    child_expiry = format_ts(now + timedelta(days=30))
    policy = Policy.from_yaml(_policy(root_expiry), source="<ctrlrun demo authority policy>")
    control = Control(
        policy, world.store, world.control.approvals, sinks=world.control.sinks,
        environment=world.control.environment, clock=world.control.clock,
    )  # fmt: skip
    finance = control.delegate("head-of-support", grant_from_yaml(_grant("finance-agent", 2_500_000, child_expiry)), by=HUMAN)
    support = control.delegate(finance.delegation_id, grant_from_yaml(_grant("support-agent", 200_000, child_expiry)), by=FINANCE)
    say(f"{INDENT}human {_money(10_000_000)} delegable  →  finance agent {_money(2_500_000)}  →  "
        f"support agent {_money(200_000)}")  # fmt: skip
    say(f"{INDENT}support agent's grant: {support.delegation_id}")
    say(f"{INDENT}support agent requests {_money(5_000_000)}  →")
    calls = 0

    def remote() -> None:
        nonlocal calls
        calls += 1

    held = True
    try:
        control.execute(_refund(control, "txn_5", 5_000_000), remote, "refund:txn_5")
        say(f"{INDENT}! NOT REFUSED — the refund outside the delegated grant ran")
        held = False
    except AuthorityDenied as exc:
        if exc.reason == "authority_constraint":
            say(f"{INDENT}✗ BLOCKED — outside the delegated grant (authority_constraint)")
        else:
            say(f"{INDENT}! NOT REFUSED — refused for another reason ({exc.reason})")
            held = False
    say(f"{INDENT}remote refund calls: {calls}")
    wider = grant_from_yaml(_grant("support-agent", 5_000_000, child_expiry))
    try:
        control.delegate(finance.delegation_id, wider, by=FINANCE)
        say(f"{INDENT}! NOT REFUSED — a delegation wider than its parent was recorded")
        held = False
    except AuthorityEscalation as exc:
        say(f"{INDENT}finance agent tries to delegate {_money(5_000_000)} under its own "
            f"{_money(2_500_000)}  →  refused ({exc.reason}: {exc.dimension})")  # fmt: skip
        held = held and exc.reason == "containment" and exc.dimension == "constraints"
    try:
        control.execute(_refund(control, "txn_6", 150_000), remote, "refund:txn_6")
        raise CTRLRunError("the demo policy let a €1,500 refund run without a human")
    except ApprovalRequired as required:
        say(f"{INDENT}support agent requests {_money(150_000)}  →  authority permits it, and the "
            f"policy asks a human ({required.request_id})")  # fmt: skip
    say(f"{INDENT}two axes, and an action needs both: the stricter of the pair wins")
    return held and calls == 0
