"""A call whose effect key cannot be reserved is refused without an SDK approval pause (03 §8.3).

``Control`` refuses such a call before asking anyone; the gate must not make the SDK ask either.
The tool then runs into ``Control``, which records the refusal (events, a ``blocked`` receipt)
and creates no approval request.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from agents import Agent
from agents_support import ScriptedModel
from ctrlrun_openai_agents import CHANNEL, AgentsInterrupt, approval_gate, protected_tool, run_sync

from ctrlrun import (
    ActionDenied,
    AmbiguousEffect,
    Control,
    DuplicateEffect,
    InMemoryStateStore,
    InvalidArgument,
    Policy,
    SQLiteStateStore,
    protect,
)
from ctrlrun.adapter import InterruptApprovalProvider
from ctrlrun.identity import StaticIdentityProvider

POLICY = """\
schema: ctrlrun.policy/v5
actions:
  billing.credit:
    effect: "credit:{invoice}"
    max_attempts: 2
    rules:
      - when: { cents_gte: 0, cents_lte: 1000 }
        decision: allow
      - when: { cents_gte: 0, cents_lte: 100000 }
        decision: approve
      - decision: deny
  billing.note:
    decision: approve
"""

OTHER = "act_" + "0" * 32  # another attempt's action id, for records written by hand
LEASE = timedelta(minutes=5)


class Clock:
    """A clock the test moves by hand (shared by the store and the Control)."""

    def __init__(self) -> None:
        self.now = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture(params=["memory", "sqlite"])
def app(request, tmp_path):
    clock = Clock()
    if request.param == "memory":
        store: Any = InMemoryStateStore(clock=clock)
    else:
        store = SQLiteStateStore(tmp_path / "s.db", clock=clock)
    control = Control(Policy.from_yaml(POLICY), store,
                      InterruptApprovalProvider(store, AgentsInterrupt()), clock=clock,
                      lease=LEASE, identity=StaticIdentityProvider("billing-bot"),
                      environment="dev")  # fmt: skip
    ran: list[tuple[str, Any]] = []

    @protect("billing.credit", wait=True, control=control)  # the key is the policy's
    def credit(invoice: str, cents: int) -> str:
        ran.append((invoice, cents))
        return f"credited {cents} on {invoice}"

    @protect("billing.note", effect="note:{invoice}", wait=True, control=control)  # the decorator's
    def note(invoice: str, text: str) -> str:
        ran.append((invoice, text))
        return f"noted {invoice}"

    def credit_tool(invoice: str, cents: int) -> str:
        """Credit an invoice, in integer cents."""
        return credit(invoice=invoice, cents=cents)

    def note_tool(invoice: str, text: str) -> str:
        """Note something on an invoice."""
        return note(invoice=invoice, text=text)

    def agent(tool: Any, *calls: tuple[str, dict[str, Any]]) -> Agent:
        return Agent(name="billing", instructions="Handle credits.", tools=[tool],
                     model=ScriptedModel(*calls))  # fmt: skip

    def credit_for() -> Any:
        return protected_tool(control, "billing.credit", credit_tool, name_override="credit")

    def note_for(**options: Any) -> Any:
        return protected_tool(control, "billing.note", note_tool, name_override="note", **options)

    tools = SimpleNamespace(credit=credit_for, note=note_for)
    yield SimpleNamespace(control=control, store=store, clock=clock, ran=ran, agent=agent,
                          tools=tools)  # fmt: skip
    store.close()


CREDIT = ("credit", {"invoice": "inv-42", "cents": 5000})  # approve


def types_of(store: Any) -> list[str]:
    return [str(e.type) for e in store.events()]


def approve_and_run(agent: Agent) -> Any:
    """Run until the SDK pauses, approve every item with the SDK's own approval, run again."""
    paused = run_sync(agent, "go")
    assert paused.interruptions, "the gate should have asked"
    state = paused.to_state()
    for item in paused.interruptions:
        state.approve(item)
    return run_sync(agent, state)


def refused_without_asking(app: Any, agent: Agent, error: type[Exception]) -> Exception:
    """The run fails with ``error`` without pausing; the refusal is recorded, nobody was asked."""
    before, asked = len(app.store.receipts()), types_of(app.store).count("APPROVAL_REQUESTED")
    with pytest.raises(error) as refused:
        run_sync(agent, "go")  # a pause would return a result with interruptions instead
    assert app.store.pending_approvals() == ()
    assert types_of(app.store).count("APPROVAL_REQUESTED") == asked  # no request created
    receipts = app.store.receipts()
    assert len(receipts) == before + 1
    assert (receipts[-1].decision, receipts[-1].result, receipts[-1].approver) == (
        "approve", "blocked", None)  # fmt: skip
    return refused.value


def fail_once(app: Any) -> None:
    """Another attempt runs on the key and fails (the store's writers, as Control would)."""
    app.store.reserve_effect("credit:inv-42", OTHER, LEASE)
    app.store.begin_execution("credit:inv-42", OTHER)
    app.store.fail_effect("credit:inv-42", OTHER, "declined")


# --------------------------------------------------------------------------- a second run


def test_a_committed_key_is_refused_without_an_approval_pause(app):
    done = approve_and_run(app.agent(app.tools.credit(), CREDIT))
    assert done.final_output == "finished"
    assert app.store.receipts()[-1].approver == CHANNEL

    refusal = refused_without_asking(app, app.agent(app.tools.credit(), CREDIT), DuplicateEffect)
    assert refusal.state == "committed"
    assert app.ran == [("inv-42", 5000)]  # once
    assert types_of(app.store)[-3:] == [
        "ACTION_PROPOSED", "POLICY_EVALUATED", "EFFECT_RESERVATION_REFUSED"]  # fmt: skip


def test_a_key_committed_by_an_allowed_call_is_refused_without_asking(app):
    small = ("credit", {"invoice": "inv-42", "cents": 500})  # allow: runs and commits the key
    assert run_sync(app.agent(app.tools.credit(), small), "go").final_output == "finished"
    refused_without_asking(app, app.agent(app.tools.credit(), CREDIT), DuplicateEffect)
    assert app.ran == [("inv-42", 500)]


# --------------------------------------------------------------------------- the other refusals


def test_an_ambiguous_key_is_refused_without_asking(app):
    app.store.reserve_effect("credit:inv-42", OTHER, LEASE)
    app.store.begin_execution("credit:inv-42", OTHER)
    app.store.mark_ambiguous("credit:inv-42", OTHER, "timeout")
    refused_without_asking(app, app.agent(app.tools.credit(), CREDIT), AmbiguousEffect)
    assert app.ran == []


def test_a_key_held_under_a_live_lease_is_refused_without_asking(app):
    app.store.reserve_effect("credit:inv-42", OTHER, LEASE)
    refusal = refused_without_asking(app, app.agent(app.tools.credit(), CREDIT), DuplicateEffect)
    assert refusal.state == "in_progress"
    assert app.ran == []


def test_an_execution_whose_lease_lapsed_becomes_ambiguous_without_asking(app):
    app.store.reserve_effect("credit:inv-42", OTHER, LEASE)
    app.store.begin_execution("credit:inv-42", OTHER)
    app.clock.now += LEASE + timedelta(seconds=1)  # the worker never finished
    gate = approval_gate(app.control, "billing.credit")
    assert asyncio.run(gate(None, CREDIT[1], "call_1")) is False
    assert str(app.store.get_effect("credit:inv-42").state) == "executing"  # the gate wrote nothing

    refused_without_asking(app, app.agent(app.tools.credit(), CREDIT), AmbiguousEffect)
    assert str(app.store.get_effect("credit:inv-42").state) == "ambiguous"  # as reserving makes it
    assert app.ran == []


def test_a_failed_key_over_its_attempt_ceiling_is_refused_without_asking(app):
    for _ in range(2):  # two failed attempts: max_attempts is 2
        fail_once(app)
    refusal = refused_without_asking(app, app.agent(app.tools.credit(), CREDIT), ActionDenied)
    assert refusal.reason == "attempt_ceiling"
    assert app.ran == []


def test_a_failed_key_under_its_ceiling_is_asked_about_and_runs(app):
    fail_once(app)  # the next attempt may run
    assert approve_and_run(app.agent(app.tools.credit(), CREDIT)).final_output == "finished"
    assert app.ran == [("inv-42", 5000)]
    receipt = app.store.receipts()[-1]
    assert (receipt.result, receipt.approver, receipt.attempt) == ("committed", CHANNEL, 2)


def test_a_decorator_only_key_is_judged_when_given_to_protected_tool(app):
    noted = ("note", {"invoice": "inv-42", "text": "refunded"})
    assert approve_and_run(app.agent(app.tools.note(effect="note:{invoice}"), noted)).final_output
    again = app.agent(app.tools.note(effect="note:{invoice}"), noted)
    refused_without_asking(app, again, DuplicateEffect)
    assert app.ran == [("inv-42", "refunded")]
    # without effect= the gate knows no key: the SDK asks, then Control refuses the call anyway
    with pytest.raises(DuplicateEffect):
        approve_and_run(app.agent(app.tools.note(), noted))
    assert app.ran == [("inv-42", "refunded")]


# --------------------------------------------------------------------------- the gate itself


def test_the_gate_judges_the_key_without_writing(app):
    gate = approval_gate(app.control, "billing.credit")
    ask = lambda params: asyncio.run(gate(None, params, "call_1"))  # noqa: E731
    assert ask(CREDIT[1]) is True  # no record yet
    app.store.reserve_effect("credit:inv-42", OTHER, LEASE)
    app.store.begin_execution("credit:inv-42", OTHER)
    app.store.commit_effect("credit:inv-42", OTHER, "done")
    def written() -> tuple[Any, ...]:
        return app.store.events(), app.store.receipts(), app.store.get_effect("credit:inv-42")

    before = written()
    for _ in range(3):
        assert ask(CREDIT[1]) is False  # committed: nobody is asked
    assert ask({"invoice": "inv-43", "cents": 5000}) is True  # another key
    assert written() == before
    assert app.store.pending_approvals() == ()


def test_a_key_the_gate_cannot_render_is_not_asked_about(app):
    gate = approval_gate(app.control, "billing.credit", effect="credit:{customer}")  # no argument
    assert asyncio.run(gate(None, CREDIT[1], "call_1")) is False
    assert app.store.events() == ()


def test_effect_must_be_a_non_empty_template(app):
    for bad in ("", 42):
        with pytest.raises(InvalidArgument):
            approval_gate(app.control, "billing.credit", effect=bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument):
            app.tools.note(effect=bad)
