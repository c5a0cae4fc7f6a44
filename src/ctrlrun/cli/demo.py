"""``ctrlrun demo``: five failure scenarios run through the real library, in one process, offline."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from .. import context, with_approval
from ..errors import AmbiguousEffect, ApprovalMismatch, ApprovalRequired, CTRLRunError, DuplicateEffect
from ..store.verify import verify_chain
from .demo_authority import authority_escalation
from .demo_world import DEMO_APPROVER, DEMO_DIR, POLICY_SUMMARY, DemoWorld, build_world
from .stores import Settings
from .text import say

__all__ = ["demo"]

AGENT = "support-agent"
INDENT = "   "
#: What scenario 1 tells the human to run, runnable as printed where the demo ran: the API did
#: commit, so ``--committed``; ``--store-url`` names the demo's store, which no CTRLRUN_* variable
#: in the user's environment can then redirect to their own.
RESOLVE_HINT = f"ctrlrun resolve refund:txn_1 --committed --store-url sqlite://{DEMO_DIR.as_posix()}/state.db"


def _money(minor: int) -> str:
    return f"€{minor // 100:,}"


def _blocked(text: str) -> None:
    say(f"{INDENT}✗ BLOCKED — {text}")


def _not_refused(what: str) -> bool:
    say(f"{INDENT}! NOT REFUSED — {what}")
    return False


def _expect_refusal(attempt: Callable[[], object], matches: Callable[[CTRLRunError], bool],
                    refusal: str, ran: str) -> bool:  # fmt: skip
    """Run ``attempt``; the scenario holds only if the library refuses it for the expected reason."""
    try:
        attempt()
    except CTRLRunError as exc:
        if matches(exc):
            _blocked(refusal)
            return True
        return _not_refused(f"refused for another reason ({type(exc).__name__}: {exc})")
    return _not_refused(ran)


def _ask(world: DemoWorld, payment_id: str, amount: int) -> str:
    """Propose a refund that needs a human; return the pending request id."""
    with context(agent=AGENT):
        try:
            world.refund(payment_id=payment_id, amount=amount)
        except ApprovalRequired as required:
            return required.request_id
    raise CTRLRunError(f"the demo policy let a {_money(amount)} refund run without a human")


def lost_reply(world: DemoWorld) -> bool:
    """A refund commits remotely, its reply is lost: AMBIGUOUS, and the blind retry is refused."""
    world.api.lose_next_reply = True
    with context(agent=AGENT):
        try:
            world.refund(payment_id="txn_1", amount=50_000)
        except TimeoutError:
            pass
        say(f"{INDENT}{AGENT} refunds {_money(50_000)} on txn_1  →  the payment API commits  →  "
            "the reply is lost  →  AMBIGUOUS")  # fmt: skip
        say(f"{INDENT}the agent retries the same refund")
        refused = _expect_refusal(
            lambda: world.refund(payment_id="txn_1", amount=50_000),
            lambda exc: isinstance(exc, AmbiguousEffect),
            "effect may already have committed; blind retry refused",
            "the retry ran",
        )
    calls = world.api.count("txn_1")
    say(f"{INDENT}remote refund calls: {calls}")
    say(f"{INDENT}only a human moves it on:  {RESOLVE_HINT}")
    return refused and calls == 1


def approval_mutation(world: DemoWorld) -> bool:
    """A human approves one refund; the agent presents that approval for a larger one."""
    request_id = _ask(world, "txn_2", 200_000)
    say(f"{INDENT}{AGENT} asks to refund {_money(200_000)} on txn_2  →  policy: approve  →  {request_id}")
    approval = world.grant(request_id)
    say(f"{INDENT}{DEMO_APPROVER} grants {request_id}, bound to {approval.action_hash}")
    say(f"{INDENT}the agent presents {request_id} for {_money(500_000)} instead")
    with context(agent=AGENT), with_approval(request_id):
        refused = _expect_refusal(
            lambda: world.refund(payment_id="txn_2", amount=500_000),
            lambda exc: isinstance(exc, ApprovalMismatch) and exc.reason == "mismatch",
            "approved action ≠ requested action (mismatch)",
            "the changed refund ran",
        )
    calls = world.api.count("txn_2")
    say(f"{INDENT}remote refund calls: {calls}")
    return refused and calls == 0


def concurrent_agents(world: DemoWorld) -> bool:
    """While agent A executes a refund, agent B proposing the same effect key is refused."""
    seen: dict[str, Any] = {}

    def agent_b() -> None:
        with context(agent="agent-b"):
            try:
                world.refund(payment_id="txn_123", amount=30_000)
            except BaseException as exc:  # handed to agent-a's thread, judged there
                seen["b"] = exc

    def while_a_executes() -> None:
        say(f"{INDENT}agent-b proposes the same refund while agent-a is still executing")
        worker = threading.Thread(target=agent_b, name="ctrlrun-demo-agent-b")
        worker.start()
        worker.join()

        def outcome() -> None:
            if "b" in seen:
                raise seen["b"]

        seen["refused"] = _expect_refusal(
            outcome,
            lambda exc: isinstance(exc, DuplicateEffect) and exc.state == "in_progress",
            "already reserved (in_progress)",
            "agent-b ran the same refund",
        )

    world.api.during_next_call = while_a_executes
    say(f"{INDENT}agent-a reserves refund:txn_123 and calls the payment API")
    with context(agent="agent-a"):
        world.refund(payment_id="txn_123", amount=30_000)
    calls = world.api.count("txn_123")
    say(f"{INDENT}agent-a commits  →  remote refund calls: {calls}")
    return seen.get("refused") is True and calls == 1


def approval_replay(world: DemoWorld) -> bool:
    """An approved refund runs and consumes its approval; presenting it again is refused."""
    request_id = _ask(world, "txn_4", 200_000)
    world.grant(request_id)
    say(f"{INDENT}{AGENT} asks to refund {_money(200_000)} on txn_4  →  {DEMO_APPROVER} grants {request_id}")
    with context(agent=AGENT), with_approval(request_id):
        world.refund(payment_id="txn_4", amount=200_000)
        say(f"{INDENT}the refund runs with it  →  committed")
        say(f"{INDENT}approval {request_id} used once  →  consumed")
        say(f"{INDENT}the agent presents {request_id} again for the same refund")
        refused = _expect_refusal(
            lambda: world.refund(payment_id="txn_4", amount=200_000),
            lambda exc: isinstance(exc, ApprovalMismatch) and exc.reason == "consumed",
            "single-use approval already consumed",
            "the approval was spent twice",
        )
    calls = world.api.count("txn_4")
    say(f"{INDENT}remote refund calls: {calls}")
    return refused and calls == 1


SCENARIOS: tuple[tuple[str, Callable[[DemoWorld], bool]], ...] = (
    ("1. Duplicate effect after a lost response", lost_reply),
    ("2. Approval mutation", approval_mutation),
    ("3. Concurrent agents, same effect", concurrent_agents),
    ("4. Approval replay", approval_replay),
    ("5. Authority escalation", authority_escalation),
)


@click.command()
@click.pass_obj
def demo(settings: Settings) -> None:
    """Run five failure scenarios in process, offline, in ./.ctrlrun/demo/."""
    say("CTRLRun demo — five failure scenarios, in process, offline")
    say(POLICY_SUMMARY)
    world = build_world(Path.cwd(), clock=settings.clock)
    failed: list[str] = []
    try:
        for heading, scenario in SCENARIOS:
            say()
            say(heading)
            say()
            if not scenario(world):
                failed.append(heading.split(".", 1)[0])
        report = verify_chain(world.store)
        count = len(world.store.receipts())
    finally:
        world.close()
    say()
    say(f"Receipts ({count}): {DEMO_DIR.as_posix()}/receipts.jsonl")
    say(f"Events:       {DEMO_DIR.as_posix()}/events.jsonl")
    say()
    say(f"Read them:    CTRLRUN_STATE={DEMO_DIR.as_posix()}/state.db ctrlrun receipts")
    if failed:
        raise CTRLRunError(f"scenario {', '.join(failed)} was not refused: the demo found a broken guarantee")
    if not report.ok:
        raise CTRLRunError(f"the demo's receipt chain does not verify: {report.breaks[0].name}")
