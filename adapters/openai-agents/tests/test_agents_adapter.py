"""ctrlrun_openai_agents against the real Agents SDK with an offline model and ctrlrun's stores."""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from types import SimpleNamespace
from typing import Any

import pytest
from agents import Agent, RunState, function_tool
from agents.exceptions import AgentsException, UserError
from agents_support import ScriptedModel
from ctrlrun_openai_agents import (
    CHANNEL,
    AgentsInterrupt,
    ApprovalNotAsked,
    approval_gate,
    exact_decision,
    protected_tool,
    run,
    run_sync,
    unwrap,
)

from ctrlrun import (
    ActionDenied,
    Control,
    CTRLRunError,
    DuplicateEffect,
    InMemoryStateStore,
    InvalidArgument,
    Policy,
    SQLiteStateStore,
    protect,
)
from ctrlrun.adapter import FrameworkInterrupt, InterruptApprovalProvider
from ctrlrun.identity import StaticIdentityProvider

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  billing.credit:
    effect: "credit:{invoice}"
    rules:
      - when: { cents_gte: 0, cents_lte: 1000 }
        decision: allow
      - when: { cents_gte: 0, cents_lte: 100000 }
        decision: approve
      - decision: deny
  billing.flag:
    decision: approve
  billing.tag:
    rules:
      - when: { urgent_eq: true }
        decision: approve
      - decision: allow
"""


@pytest.fixture(params=["memory", "sqlite"])
def store(request, tmp_path):
    store = InMemoryStateStore() if request.param == "memory" else SQLiteStateStore(tmp_path / "s.db")
    yield store
    store.close()


@pytest.fixture
def app(store):
    control = Control(Policy.from_yaml(POLICY), store,
                      InterruptApprovalProvider(store, AgentsInterrupt()),
                      identity=StaticIdentityProvider("billing-bot"), environment="dev")  # fmt: skip
    ran: list[tuple[str, Any]] = []

    @protect("billing.credit", effect="credit:{invoice}", wait=True, control=control)
    def credit(invoice: str, cents: int) -> str:
        ran.append((invoice, cents))
        return f"credited {cents} on {invoice}"

    @protect("billing.credit", effect="credit:{invoice}", wait=True, control=control)
    async def acredit(invoice: str, cents: int) -> str:
        await asyncio.sleep(0)
        ran.append((invoice, cents))
        return f"credited {cents} on {invoice}"

    @protect("billing.tag", wait=True, control=control)
    def tag(invoice: str, urgent: bool = True) -> str:
        ran.append((invoice, "tag"))
        return f"tagged {invoice}"

    def credit_tool(invoice: str, cents: int) -> str:
        """Credit an invoice, in integer cents."""
        return credit(invoice=invoice, cents=cents)

    async def credit_tool_async(invoice: str, cents: int) -> str:
        """Credit an invoice, in integer cents."""
        return credit(invoice=invoice, cents=cents)

    async def credit_tool_awaiting(invoice: str, cents: int) -> str:
        """Credit an invoice, in integer cents (an async tool awaiting an async protected call)."""
        return await acredit(invoice=invoice, cents=cents)

    def agent(*tools: Any, calls: list[tuple[str, dict[str, Any]]]) -> Agent:
        return Agent(name="billing", instructions="Handle credits.", tools=list(tools),
                     model=ScriptedModel(*calls))  # fmt: skip

    def credit_tool_for(body=credit_tool) -> Any:
        return protected_tool(control, "billing.credit", body, name_override="credit")

    return SimpleNamespace(control=control, store=store, ran=ran, credit=credit, tag=tag,
                           credit_tool=credit_tool, credit_tool_async=credit_tool_async,
                           credit_tool_awaiting=credit_tool_awaiting,
                           agent=agent, credit_tool_for=credit_tool_for)  # fmt: skip


def types_of(store) -> list[str]:
    return [str(e.type) for e in store.events()]


def assert_request_left_pending(app) -> None:
    """An ApprovalNotAsked: the request is pending; nothing reserved, run or receipted."""
    assert types_of(app.store)[-3:] == ["ACTION_PROPOSED", "POLICY_EVALUATED", "APPROVAL_REQUESTED"]
    (pending,) = app.store.pending_approvals()
    assert str(pending.status) == "pending"
    assert app.store.receipts() == ()
    assert app.store.list_effects() == ()
    assert app.ran == []


CREDIT = ("credit", {"invoice": "inv-42", "cents": 5000})


# --------------------------------------------------------------------------- the example of the spec


@pytest.mark.parametrize("body", ["sync", "async", "awaiting"])
def test_pause_approve_commits_once(app, body):
    bodies = {"sync": app.credit_tool, "async": app.credit_tool_async, "awaiting": app.credit_tool_awaiting}
    tool = app.credit_tool_for(bodies[body])
    agent = app.agent(tool, calls=[CREDIT])
    paused = run_sync(agent, "credit inv-42")
    assert [i.tool_name for i in paused.interruptions] == ["credit"]
    assert app.store.receipts() == () and app.store.events() == ()  # ctrlrun not reached yet
    assert app.ran == []

    state = paused.to_state()
    saved = state.to_json()
    for item in paused.interruptions:
        state.approve(item)  # the SDK's own approval
    assert run_sync(agent, state).final_output == "finished"
    assert app.ran == [("inv-42", 5000)]
    (receipt,) = app.store.receipts()
    assert (receipt.decision, receipt.result, receipt.approver) == ("approve", "committed", CHANNEL)
    assert types_of(app.store) == [
        "ACTION_PROPOSED", "POLICY_EVALUATED", "APPROVAL_REQUESTED",
        "APPROVAL_GRANTED",  # the answer's own event, written with the grant
        "ACTION_PROPOSED", "POLICY_EVALUATED", "APPROVAL_CONSUMED", "EFFECT_RESERVED",
        "EXECUTION_STARTED", "EXECUTION_COMMITTED",
    ]  # fmt: skip
    consumed = [e for e in app.store.events() if str(e.type) == "APPROVAL_CONSUMED"]
    assert consumed[0].data["approver"] == CHANNEL

    # the paused state replayed (saved before the answer, approved again): still once
    replay = RunState.from_json(agent, saved)
    replay = asyncio.run(replay) if asyncio.iscoroutine(replay) else replay
    replay.approve(replay.get_interruptions()[0])
    agent.model.turn = 1
    with pytest.raises(DuplicateEffect):
        run_sync(agent, replay)
    assert app.ran == [("inv-42", 5000)]


def test_reject_runs_nothing_and_records_nothing(app):
    agent = app.agent(app.credit_tool_for(), calls=[CREDIT])
    paused = run_sync(agent, "credit inv-42")
    state = paused.to_state()
    state.reject(paused.interruptions[0])
    result = run_sync(agent, state)
    assert result.final_output == "finished"
    assert app.ran == []
    assert app.store.events() == () and app.store.receipts() == ()
    assert app.store.pending_approvals() == ()


def test_left_unanswered_nothing_is_granted(app):
    agent = app.agent(app.credit_tool_for(), calls=[CREDIT])
    paused = run_sync(agent, "credit inv-42")
    assert paused.interruptions and app.ran == []
    assert app.store.events() == () and app.store.pending_approvals() == ()


def test_policy_deny_reaches_the_caller_with_a_denied_receipt(app):
    agent = app.agent(app.credit_tool_for(), calls=[("credit", {"invoice": "inv-1", "cents": 10**7})])
    with pytest.raises(ActionDenied) as denied:
        run_sync(agent, "credit a lot")
    assert denied.value.reason.startswith("rule")
    (receipt,) = app.store.receipts()
    assert receipt.result == "denied"
    assert types_of(app.store) == ["ACTION_PROPOSED", "POLICY_EVALUATED", "ACTION_DENIED"]
    assert app.ran == []


def test_policy_allow_runs_once_without_asking(app):
    agent = app.agent(app.credit_tool_for(), calls=[("credit", {"invoice": "inv-1", "cents": 500})])
    result = run_sync(agent, "credit a little")
    assert result.final_output == "finished" and not result.interruptions
    assert app.ran == [("inv-1", 500)]
    assert app.store.pending_approvals() == () and "APPROVAL_REQUESTED" not in types_of(app.store)


def test_async_run_reraises_the_tool_exception(app):
    agent = app.agent(app.credit_tool_for(), calls=[("credit", {"invoice": "inv-1", "cents": 10**7})])
    with pytest.raises(ActionDenied) as denied:
        asyncio.run(run(agent, "credit a lot"))
    assert not isinstance(denied.value.__cause__, AgentsException)
    seen, stack = set(), [denied.value]
    while stack:  # the chain terminates: no cycle was created
        error = stack.pop()
        assert id(error) not in seen
        seen.add(id(error))
        stack += [e for e in (error.__cause__, error.__context__) if e is not None]


# --------------------------------------------------------------------------- ApprovalNotAsked


def approve_all(app, agent, prompt: str = "go", *, always: bool = False):
    paused = run_sync(agent, prompt)
    assert paused.interruptions, "the gate should have asked"
    state = paused.to_state()
    for item in paused.interruptions:
        state.approve(item, always_approve=always)
    return run_sync(agent, state)


def test_not_asked_from_a_plain_function_tool(app):
    plain = function_tool(app.credit_tool, name_override="credit", failure_error_function=None)
    agent = app.agent(plain, calls=[CREDIT])
    with pytest.raises(ApprovalNotAsked) as not_asked:
        run_sync(agent, "credit inv-42")
    assert isinstance(not_asked.value, CTRLRunError) and isinstance(not_asked.value, RuntimeError)
    assert_request_left_pending(app)


def test_not_asked_outside_any_tool(app):
    with pytest.raises(ApprovalNotAsked):
        app.credit(invoice="inv-42", cents=5000)
    assert_request_left_pending(app)


def test_not_asked_from_a_background_thread_of_a_protected_tool(app):
    errors: list[BaseException] = []

    def spawning_tool(invoice: str, cents: int) -> str:
        """Credit in the background."""

        def job():
            try:
                app.credit(invoice=invoice, cents=cents)
            except BaseException as exc:  # noqa: BLE001 - captured for the assertion
                errors.append(exc)

        worker = threading.Thread(target=job)
        worker.start()
        worker.join()
        return "queued"

    tool = protected_tool(app.control, "billing.credit", spawning_tool, name_override="credit")
    assert approve_all(app, app.agent(tool, calls=[CREDIT])).final_output == "finished"
    assert [type(e) for e in errors] == [ApprovalNotAsked]
    assert_request_left_pending(app)


def test_not_asked_for_another_action_than_the_gated_one(app):
    def flag_tool(invoice: str, cents: int) -> str:
        """Flag an invoice (but credits it)."""
        return app.credit(invoice=invoice, cents=cents)

    tool = protected_tool(app.control, "billing.flag", flag_tool, name_override="flag")
    with pytest.raises(ApprovalNotAsked) as not_asked:
        approve_all(app, app.agent(tool, calls=[("flag", {"invoice": "inv-42", "cents": 5000})]))
    assert "'billing.flag'" in str(not_asked.value)
    assert_request_left_pending(app)


def test_not_asked_for_a_second_request_under_one_tool_call(app):
    def twice(invoice: str, cents: int) -> str:
        """Credit two invoices."""
        first = app.credit(invoice=invoice, cents=cents)
        return first + app.credit(invoice=invoice + "-b", cents=cents)

    tool = protected_tool(app.control, "billing.credit", twice, name_override="credit")
    with pytest.raises(ApprovalNotAsked):
        approve_all(app, app.agent(tool, calls=[CREDIT]))
    assert app.ran == [("inv-42", 5000)]  # the one answer answered the first request only
    (pending,) = app.store.pending_approvals()
    assert pending.request.action.arguments["invoice"] == "inv-42-b"
    assert [r.result for r in app.store.receipts()] == ["committed"]


def test_not_asked_when_the_gate_saw_other_arguments(app):
    def credit_euros(invoice: str, euros: int) -> str:
        """Credit an invoice, in euros."""
        return app.credit(invoice=invoice, cents=euros * 100)

    tool = protected_tool(app.control, "billing.credit", credit_euros, name_override="credit")
    agent = app.agent(tool, calls=[("credit", {"invoice": "inv-42", "euros": 50})])
    with pytest.raises(ApprovalNotAsked):
        run_sync(agent, "go")  # the gate said False (no such argument): nobody was asked
    assert_request_left_pending(app)


def test_not_asked_when_the_protected_function_has_defaults(app):
    def tag_tool(invoice: str) -> str:
        """Tag an invoice."""
        return app.tag(invoice=invoice)  # urgent=True by default: the kernel says approve

    tool = protected_tool(app.control, "billing.tag", tag_tool, name_override="tag")
    with pytest.raises(ApprovalNotAsked):
        run_sync(app.agent(tool, calls=[("tag", {"invoice": "inv-42"})]), "go")
    assert_request_left_pending(app)


def test_not_asked_after_always_approve(app):
    with pytest.raises(ApprovalNotAsked):
        approve_all(app, app.agent(app.credit_tool_for(), calls=[CREDIT]), always=True)
    assert_request_left_pending(app)


# --------------------------------------------------------------------------- the exact-call lookup


class OwnerKey(str):
    """Shaped like the SDK's owner-bound key: a str subclass with ``tool_key``."""

    def __new__(cls, tool_key: str) -> OwnerKey:
        key = super().__new__(cls, f"__owner__:{tool_key}")
        key.tool_key = tool_key
        return key


def record(approved: Any = None, rejected: Any = None) -> Any:
    return SimpleNamespace(approved=[] if approved is None else approved,
                           rejected=[] if rejected is None else rejected)  # fmt: skip


def ctx(table: Any, tool: str = "credit", call: str = "call_1") -> Any:
    return SimpleNamespace(_approvals=table, tool_name=tool, tool_call_id=call)


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        ({"credit": record(["call_1"])}, True),
        ({OwnerKey("credit"): record(["call_1"])}, True),
        ({OwnerKey("credit"): record(rejected=["call_1"])}, False),
        ({"credit": record(["call_1"]), OwnerKey("credit"): record(rejected=["call_1"])}, False),
        ({OwnerKey("credit"): record(["call_2"])}, None),  # another call
        ({OwnerKey("refund"): record(["call_1"])}, None),  # another tool
        ({"refund": record(["call_1"])}, None),
        ({OwnerKey("credit"): record(approved=True)}, None),  # sticky: never an answer
        ({"credit": record(approved=True, rejected=False)}, None),
        ({"credit": record(rejected=True)}, None),
        ({("hosted_mcp", "x", "credit"): record(["call_1"])}, None),
        ({}, None),
        (None, None),
    ],
)
def test_exact_decision(table, expected):
    assert exact_decision(ctx(table)) is expected


def test_exact_decision_on_the_installed_sdk_uses_owner_bound_keys(app):
    seen: list[Any] = []

    def spy_tool(invoice: str, cents: int) -> str:
        """Credit."""
        return app.credit(invoice=invoice, cents=cents)

    tool = app.credit_tool_for(spy_tool)
    agent = app.agent(tool, calls=[CREDIT])
    paused = run_sync(agent, "go")
    state = paused.to_state()
    state.approve(paused.interruptions[0])
    seen.extend(state._context._approvals)
    assert run_sync(agent, state).final_output == "finished"
    # a lookup of _approvals[tool_name] alone finds nothing on this SDK (0.23+ keys by agent)
    if all(hasattr(key, "tool_key") for key in seen):
        assert "credit" not in state._context._approvals
    assert app.ran == [("inv-42", 5000)]


# --------------------------------------------------------------------------- wiring


def test_agents_interrupt_shape(store):
    interrupt = AgentsInterrupt()
    assert interrupt.framework == "openai-agents"
    assert AgentsInterrupt.carries_approved_arguments is False
    assert isinstance(interrupt, FrameworkInterrupt)
    with pytest.raises(TypeError):
        AgentsInterrupt(True)  # type: ignore[call-arg]
    provider = InterruptApprovalProvider(store, interrupt)
    assert (provider.framework, provider.carries_approved_arguments) == ("openai-agents", False)


def test_protected_tool_refuses_needs_approval_and_empty_actions(app):
    with pytest.raises(InvalidArgument):
        protected_tool(app.control, "billing.credit", app.credit_tool, needs_approval=True)
    with pytest.raises(InvalidArgument):
        protected_tool(app.control, "", app.credit_tool)
    with pytest.raises(InvalidArgument):
        approval_gate(app.control, "  ")
    with pytest.raises(InvalidArgument):
        approval_gate(object(), "billing.credit")  # type: ignore[arg-type]


def test_approval_gate_decides_without_writing(app):
    gate = approval_gate(app.control, "billing.credit")
    ask = lambda params: asyncio.run(gate(None, params, "call_1"))
    assert ask({"invoice": "i", "cents": 5000}) is True
    assert ask({"invoice": "i", "cents": 500}) is False  # allow
    assert ask({"invoice": "i", "cents": 10**7}) is False  # deny: runs into Control
    assert app.store.events() == () and app.store.pending_approvals() == ()


def test_observe_mode_gate_asks_nobody_and_logs_the_banner_once(store, caplog):
    class ObservingControl(Control):
        mode = "observe"  # Control refuses `mode: observe` until it is built; a stand-in

    control = ObservingControl(Policy.from_yaml(POLICY), store,
                               InterruptApprovalProvider(store, AgentsInterrupt()),
                               identity=StaticIdentityProvider("bot"), environment="dev")  # fmt: skip
    caplog.set_level(logging.WARNING, logger="ctrlrun")
    gate = approval_gate(control, "billing.credit")
    protected_tool(control, "billing.credit", lambda invoice: invoice, name_override="x")
    assert asyncio.run(gate(None, {"invoice": "i", "cents": 5000}, "call_1")) is False
    hits = [r for r in caplog.records if "OBSERVE MODE - nothing is enforced" in r.getMessage()]
    assert len(hits) == 1


def test_failure_error_function_defaults_to_none(app):
    agent = app.agent(app.credit_tool_for(), calls=[("credit", {"invoice": "inv-1", "cents": 10**7})])
    with pytest.raises(UserError) as wrapped:
        from agents import Runner

        Runner.run_sync(agent, "credit a lot")
    assert isinstance(wrapped.value.__cause__, ActionDenied)
    assert isinstance(unwrap(wrapped.value), ActionDenied)


# --------------------------------------------------------------------------- unwrap


def chain(*errors: BaseException) -> BaseException:
    for outer, inner in itertools.pairwise(errors):
        outer.__cause__ = inner
    return errors[0]


def test_unwrap_follows_causes_through_sdk_wrappers_only():
    denied = ActionDenied(reason="rule[1]")
    assert unwrap(chain(UserError("tool failed"), denied)) is denied
    value_error = ValueError("x")
    assert unwrap(chain(UserError("a"), AgentsException("b"), value_error, KeyError("k"))) is value_error
    plain = RuntimeError("not a wrapper")
    assert unwrap(plain) is plain
    lone = UserError("no cause")
    lone.__context__ = ValueError("context is never followed")
    assert unwrap(lone) is lone


def test_unwrap_terminates_on_cycles():
    a, b = UserError("a"), AgentsException("b")
    a.__cause__, b.__cause__ = b, a
    assert unwrap(a) in (a, b)


def test_wrapping_keeps_the_sdks_own_invoker_and_argument_inspection(app):
    async def credit_default(invoice: str, cents: int = 5000) -> str:
        """Credit an invoice (5000 cents unless told otherwise)."""
        return app.credit(invoice=invoice, cents=cents)

    plain = function_tool(credit_default, name_override="credit")
    tool = protected_tool(app.control, "billing.credit", credit_default, name_override="credit")
    assert type(tool.on_invoke_tool) is type(plain.on_invoke_tool)
    if not hasattr(tool.on_invoke_tool, "prepare_arguments"):
        pytest.skip("this SDK does not inspect arguments before approval")
    # The SDK asks a human itself when defaults change the arguments (the gate alone would have
    # said no: it sees no `cents`); the answer then reaches ctrlrun for exactly this call.
    agent = app.agent(tool, calls=[("credit", {"invoice": "inv-7"})])
    assert approve_all(app, agent).final_output == "finished"
    assert app.ran == [("inv-7", 5000)]
    assert app.store.receipts()[-1].approver == CHANNEL
