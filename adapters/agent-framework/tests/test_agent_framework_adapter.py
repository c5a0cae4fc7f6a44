"""ctrlrun approvals through Agent Framework's function approval, offline.

The model is a fake chat client (``af_support.Fake``); the framework's function-invocation loop,
approval binding, session snapshot and middleware pipeline are real.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from af_support import POLICY, App, answer, build, call
from agent_framework import (
    AgentSession,
    Content,
    FunctionInvocationContext,
    FunctionMiddleware,
    Message,
    MiddlewareFailure,
)
from ctrlrun_agent_framework import (
    APPROVER_KEY,
    CHANNEL,
    AgentFrameworkInterrupt,
    ApprovalMiddleware,
    unwrap,
)

import ctrlrun
from ctrlrun import (
    ActionDenied,
    ApprovalMismatch,
    DuplicateEffect,
    FrameworkInterrupt,
    InterruptApprovalProvider,
    InvalidArgument,
    SQLiteStateStore,
)
from ctrlrun.adapter import ApprovalNotAsked, PendingApproval

HERE = Path(__file__).resolve().parent
APPROVE_ALL = 'schema: ctrlrun.policy/v2\nactions:\n  stripe.refund: {decision: approve, effect: "refund:{payment_id}"}\n'


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def statuses(store: Any, *request_ids: str) -> list[str]:
    return [str(store.get_approval(request_id).status) for request_id in request_ids]


def kinds(store: Any) -> list[str]:
    return [event.type.value for event in store.events()]


def requests(store: Any) -> list[Any]:
    return [e for e in store.events() if e.type.value == "APPROVAL_REQUESTED"]


def pause(app: App, text: str = "refund txn_2") -> tuple[AgentSession, Any, dict[str, Any]]:
    """First pass: the run returns one function_approval_request and nothing ran."""
    session = app.session()
    paused = run(app.agent.run(text, session=session))
    (request,) = paused.user_input_requests
    assert request.type == "function_approval_request"
    shown = request.additional_properties["ctrlrun"]
    assert app.stripe == [] and app.store.receipts() == ()
    assert statuses(app.store, shown["request_id"]) == ["pending"]
    return session, request, shown


def failure(excinfo: pytest.ExceptionInfo[BaseException]) -> BaseException:
    assert isinstance(excinfo.value, MiddlewareFailure)
    return unwrap(excinfo.value)


# --------------------------------------------------------------------------- approve


def test_pause_shows_the_tool_call_and_ctrlrun_payload(store):
    app = build(store, [call("call_1", "txn_2", 250_000)])
    session, request, shown = pause(app)
    function_call = request.function_call
    assert (function_call.type, function_call.name, function_call.call_id) == ("function_call", "refund", "call_1")
    assert request.id == function_call.id and request.id.startswith("af-call-")  # occurrence id
    assert function_call.parse_arguments() == {"payment_id": "txn_2", "amount": 250_000}
    assert sorted(shown) == ["action", "action_hash", "action_id", "agent", "arguments", "created_at",
                             "environment", "expires_at", "request_id", "resource", "user"]  # fmt: skip
    assert (shown["action"], shown["arguments"], shown["agent"]) == (
        "stripe.refund", {"amount": 250_000, "payment_id": "txn_2"}, "refund-agent")
    record = store.get_approval(shown["request_id"])
    assert record.request.action_hash == shown["action_hash"]
    assert json.loads(json.dumps(shown)) == shown
    assert store.get_effect("refund:txn_2") is None  # nothing reserved
    assert kinds(store) == ["ACTION_PROPOSED", "POLICY_EVALUATED", "APPROVAL_REQUESTED"]
    snapshot = session.to_dict()["state"]["tool_approval"]["pending_approval_requests"]
    assert [item["id"] for item in snapshot] == [request.id]  # the framework's own record


def test_approve_in_the_same_session_commits_once(store):
    app = build(store, [call("call_1", "txn_2", 250_000)])
    session, request, shown = pause(app)
    done = run(app.agent.run(answer(request, True, "ada@example.com"), session=session))
    assert done.text == "model was told: re_txn_2"
    assert app.stripe == [("txn_2", 250_000)]
    (receipt,) = store.receipts()
    assert (receipt.decision, receipt.result, receipt.approver) == ("approve", "committed", "ada@example.com")
    assert receipt.action_hash == shown["action_hash"]  # continuous across the replay
    assert receipt.action_id != shown["action_id"]  # not continuous
    r1, r2 = (event.approval_id for event in requests(store))
    assert r1 == shown["request_id"] and receipt.approval_id == r2
    assert statuses(store, r1, r2) == ["pending", "consumed"]  # R1 orphaned
    after = kinds(store)[6:]
    assert after == ["APPROVAL_GRANTED", "ACTION_PROPOSED", "POLICY_EVALUATED", "APPROVAL_CONSUMED",
                     "EFFECT_RESERVED", "EXECUTION_STARTED", "EXECUTION_COMMITTED"]  # fmt: skip
    granted = [e for e in store.events() if e.type.value in ("APPROVAL_GRANTED", "APPROVAL_CONSUMED")]
    assert [e.data["approver"] for e in granted] == ["ada@example.com", "ada@example.com"]
    assert str(store.get_effect("refund:txn_2").state) == "committed"


def test_an_answer_naming_nobody_records_the_channel(store):
    app = build(store, [call("call_1", "txn_2", 250_000)])
    session, request, _ = pause(app)
    run(app.agent.run(answer(request, True), session=session))
    (receipt,) = store.receipts()
    assert (receipt.result, receipt.approver) == ("committed", CHANNEL)


@pytest.mark.parametrize("approver", [42, "", "   ", ["ada"]], ids=repr)
def test_a_malformed_approver_is_refused(store, approver):
    app = build(store, [call("call_1", "txn_2", 250_000)])
    session, request, shown = pause(app)
    with pytest.raises(MiddlewareFailure) as excinfo:
        run(app.agent.run(answer(request, True, approver), session=session))
    refused = failure(excinfo)
    assert isinstance(refused, InvalidArgument) and APPROVER_KEY in str(refused)
    assert app.stripe == [] and store.receipts() == ()
    assert all(status == "pending" for status in statuses(store, *(e.approval_id for e in requests(store))))
    assert "APPROVAL_GRANTED" not in kinds(store)


def test_an_altered_function_call_in_the_answer_runs_the_snapshot(store):
    app = build(store, [call("call_1", "txn_2", 250_000)])
    session, request, shown = pause(app)
    altered = Content.from_function_call(call_id="call_1", name="refund", id=request.function_call.id,
                                         arguments={"payment_id": "txn_2", "amount": 400_000})  # fmt: skip
    response = Content.from_function_approval_response(
        True, request.id, altered, additional_properties={**request.additional_properties, APPROVER_KEY: "ada"})
    run(app.agent.run(Message(role="user", contents=[response]), session=session))
    assert app.stripe == [("txn_2", 250_000)]  # the framework ran what it recorded
    (receipt,) = store.receipts()
    assert (receipt.result, receipt.approver, receipt.arguments["amount"]) == ("committed", "ada", 250_000)
    assert receipt.action_hash == shown["action_hash"]


def test_coerced_arguments_are_shown_and_run_as_validated(store):
    app = build(store, [call("call_1", "txn_2", "1200")], policy=APPROVE_ALL)  # the model sends "1200"
    session, request, shown = pause(app)
    assert request.function_call.parse_arguments() == {"payment_id": "txn_2", "amount": 1200}
    assert shown["arguments"] == {"amount": 1200, "payment_id": "txn_2"}
    run(app.agent.run(answer(request, True, "ada"), session=session))
    assert app.stripe == [("txn_2", 1200)] and type(app.stripe[0][1]) is int
    (receipt,) = store.receipts()
    assert receipt.arguments == {"amount": 1200, "payment_id": "txn_2"} and receipt.result == "committed"


# --------------------------------------------------------------------------- the other rows


def test_reject_records_nothing_and_the_model_is_told(store):
    app = build(store, [call("call_1", "txn_2", 250_000)])
    session, request, shown = pause(app)
    before = kinds(store)
    done = run(app.agent.run(answer(request, False, "ada"), session=session))
    assert "rejected" in done.text  # the framework's own rejection result, for the model
    assert app.stripe == [] and store.receipts() == ()
    assert kinds(store) == before  # the tool was not invoked: nothing more recorded
    assert statuses(store, shown["request_id"]) == ["pending"]  # until its TTL (or `ctrlrun deny`)


def test_a_resent_answer_is_dropped_by_the_framework(store):
    app = build(store, [call("call_1", "txn_2", 250_000)])
    session, request, _ = pause(app)
    run(app.agent.run(answer(request, True, "ada"), session=session))
    before = kinds(store)
    again = run(app.agent.run(answer(request, True, "ada"), session=session))
    assert again.user_input_requests == [] and again.text == "model: nothing to do"
    assert app.stripe == [("txn_2", 250_000)] and len(store.receipts()) == 1
    assert kinds(store) == before


def test_a_sessionless_answer_is_dropped_by_the_framework(store):
    app = build(store, [call("call_1", "txn_2", 250_000)])
    _, request, shown = pause(app)
    before = kinds(store)
    dropped = run(app.agent.run(answer(request, True, "ada")))  # no session
    assert dropped.user_input_requests == [] and dropped.text == "model: nothing to do"
    assert app.stripe == [] and store.receipts() == () and kinds(store) == before
    assert statuses(store, shown["request_id"]) == ["pending"]


def test_an_answer_from_another_session_is_dropped(store):
    app = build(store, [call("call_1", "txn_2", 250_000)])
    _, request, _ = pause(app)
    dropped = run(app.agent.run(answer(request, True, "ada"), session=app.session()))
    assert dropped.user_input_requests == [] and app.stripe == [] and store.receipts() == ()


def test_a_client_with_binding_disabled_is_refused_at_construction():
    from af_support import Fake

    client = Fake([], function_invocation_configuration={"disable_approval_response_binding": True})
    with pytest.raises(InvalidArgument, match="disable_approval_response_binding"):
        AgentFrameworkInterrupt(client)
    with pytest.raises(InvalidArgument, match="function_invocation_configuration"):
        AgentFrameworkInterrupt(object())


def test_binding_disabled_later_is_rechecked_on_the_answer(store):
    app = build(store, [call("call_1", "txn_2", 250_000)])
    session, request, shown = pause(app)
    app.client.function_invocation_configuration["disable_approval_response_binding"] = True
    with pytest.raises(MiddlewareFailure) as excinfo:
        run(app.agent.run(answer(request, True, "ada"), session=session))
    refused = failure(excinfo)
    assert isinstance(refused, ApprovalNotAsked) and "binding disabled" in str(refused)
    assert app.stripe == [] and store.receipts() == ()
    assert "APPROVAL_GRANTED" not in kinds(store)
    assert set(statuses(store, *(e.approval_id for e in requests(store)))) == {"pending"}


def test_policy_deny_fails_the_run_with_a_denied_receipt(store):
    app = build(store, [call("call_1", "txn_9", 9_000_000)])
    with pytest.raises(MiddlewareFailure) as excinfo:
        run(app.agent.run("refund txn_9", session=app.session()))
    refused = failure(excinfo)
    assert isinstance(refused, ActionDenied) and excinfo.value.__cause__ is refused
    (receipt,) = store.receipts()
    assert (receipt.decision, receipt.result) == ("deny", "denied") and app.stripe == []
    assert requests(store) == []


def test_a_duplicate_fails_the_run_with_a_blocked_receipt(store):
    app = build(store, [call("call_1", "txn_2", 250_000)])
    session, request, _ = pause(app)
    run(app.agent.run(answer(request, True, "ada"), session=session))
    asked = len(requests(store))
    with pytest.raises(MiddlewareFailure) as excinfo:  # the agent tries the same refund again
        run(app.agent.run("refund txn_2 again", session=app.session()))
    refused = failure(excinfo)
    assert isinstance(refused, DuplicateEffect) and refused.state == "committed"
    assert [r.result for r in store.receipts()] == ["committed", "blocked"]
    assert len(requests(store)) == asked  # refused before anyone is asked
    assert app.stripe == [("txn_2", 250_000)]


def test_policy_allow_runs_without_a_request(store):
    app = build(store, [call("call_1", "txn_1", 100)])
    done = run(app.agent.run("refund txn_1", session=app.session()))
    assert done.user_input_requests == [] and done.text == "model was told: re_txn_1"
    assert app.stripe == [("txn_1", 100)] and requests(store) == []


# --------------------------------------------------------------------------- two calls, one answer


@pytest.mark.parametrize("concurrent", [True, False])
def test_two_gated_calls_in_one_response(store, concurrent):
    app = build(store, [call("call_1", "txn_2", 250_000), call("call_2", "txn_3", 260_000)],
                concurrent=concurrent)  # fmt: skip
    session = app.session()
    paused = run(app.agent.run("refund both", session=session))
    first, second = paused.user_input_requests
    assert [r.function_call.call_id for r in (first, second)] == ["call_1", "call_2"]
    assert first.id != second.id
    shown = [r.additional_properties["ctrlrun"] for r in (first, second)]
    assert [s["arguments"]["payment_id"] for s in shown] == ["txn_2", "txn_3"]
    assert shown[0]["request_id"] != shown[1]["request_id"] and app.stripe == []
    both = Message(role="user", contents=[first.to_function_approval_response(True),
                                          second.to_function_approval_response(False)])  # fmt: skip
    done = run(app.agent.run(both, session=session))
    assert "re_txn_2" in done.text and "rejected" in done.text
    assert app.stripe == [("txn_2", 250_000)]
    (receipt,) = store.receipts()
    assert receipt.arguments["payment_id"] == "txn_2" and receipt.result == "committed"
    assert statuses(store, shown[1]["request_id"]) == ["pending"]


def test_a_second_request_in_one_tool_call_is_not_asked(store):
    app = build(store, [call("call_1", "txn_2", 250_000, name="refund_pair")])
    session, request, _ = pause(app)
    with pytest.raises(MiddlewareFailure) as excinfo:
        run(app.agent.run(answer(request, True, "ada"), session=session))
    refused = failure(excinfo)
    assert isinstance(refused, ApprovalNotAsked) and "one approval-gated protected call per tool" in str(refused)
    assert app.stripe == [("txn_2", 250_000)]  # the first call was answered and ran
    twin = [e.approval_id for e in requests(store)][-1]
    assert store.get_approval(twin).request.action.arguments["payment_id"] == "txn_2_twin"
    assert statuses(store, twin) == ["pending"]  # nothing granted for the second


# --------------------------------------------------------------------------- ApprovalNotAsked


def test_without_the_middleware_nobody_is_asked(store):
    app = build(store, [call("call_1", "txn_2", 250_000)], middleware=False)
    done = run(app.agent.run("refund txn_2", session=app.session()))
    assert done.user_input_requests == []  # the framework turned the refusal into an error result
    assert app.stripe == [] and store.receipts() == ()
    (asked,) = requests(store)
    assert statuses(store, asked.approval_id) == ["pending"]


def test_interrupt_outside_any_invocation_is_not_asked(store):
    app = build(store, [])
    with pytest.raises(ApprovalNotAsked, match="ApprovalMiddleware"):
        app.control.approvals.interrupt.interrupt(sample_pending())


class Tamper(FunctionMiddleware):
    """Runs before ApprovalMiddleware and changes what it will see."""

    def __init__(self, change: Any) -> None:
        self.change = change

    async def process(self, context: FunctionInvocationContext, call_next: Any) -> None:
        if "approval_response" in context.metadata:
            self.change(context)
        await call_next()


def refuse_answer(context: FunctionInvocationContext) -> None:
    bound = context.metadata["approval_response"]
    context.metadata["approval_response"] = Content.from_function_approval_response(
        False, bound.id, bound.function_call, additional_properties=bound.additional_properties)


def drop_session(context: FunctionInvocationContext) -> None:
    context.session = None


def test_the_bound_records_arguments_are_what_ctrlrun_checks(store):
    """approved_arguments come from the framework's bound record, never from the payload."""

    def alter_record(context: FunctionInvocationContext) -> None:
        bound = context.metadata["approval_response"]
        other = Content.from_function_call(call_id="call_1", name="refund", id=bound.function_call.id,
                                           arguments={"payment_id": "txn_2", "amount": 260_000})  # fmt: skip
        context.metadata["approval_response"] = Content.from_function_approval_response(
            True, bound.id, other, additional_properties=bound.additional_properties)

    app = build(store, [call("call_1", "txn_2", 250_000)])
    app.agent.middleware = [Tamper(alter_record), ApprovalMiddleware()]
    session, request, _ = pause(app)
    with pytest.raises(MiddlewareFailure) as excinfo:
        run(app.agent.run(answer(request, True, "ada"), session=session))
    refused = failure(excinfo)
    assert isinstance(refused, ApprovalMismatch) and refused.reason == "mismatch"
    assert app.stripe == [] and store.receipts() == () and "APPROVAL_GRANTED" not in kinds(store)


@pytest.mark.parametrize(("change", "why"), [(refuse_answer, "not an approval"), (drop_session, "AgentSession")])
def test_an_answer_that_is_not_a_bound_approval_is_not_taken(store, change, why):
    app = build(store, [call("call_1", "txn_2", 250_000)])
    app.agent.middleware = [Tamper(change), ApprovalMiddleware()]  # outermost first
    session, request, _ = pause(app)
    with pytest.raises(MiddlewareFailure) as excinfo:
        run(app.agent.run(answer(request, True, "ada"), session=session))
    refused = failure(excinfo)
    assert isinstance(refused, ApprovalNotAsked) and why in str(refused)
    assert app.stripe == [] and "APPROVAL_GRANTED" not in kinds(store)


def test_always_require_takes_the_frameworks_own_approval(store):
    """Observed: the framework asks with the model's raw call; its approval is the answer."""
    exact = build(store, [call("call_1", "txn_2", 250_000)], approval_mode="always_require")
    session = exact.session()
    paused = run(exact.agent.run("refund txn_2", session=session))
    (request,) = paused.user_input_requests
    assert "ctrlrun" not in (request.additional_properties or {}) and requests(store) == []
    run(exact.agent.run(answer(request, True, "ada"), session=session))
    assert exact.stripe == [("txn_2", 250_000)] and store.receipts()[-1].approver == "ada"

    coerced = build(store, [call("call_1", "txn_3", "260000")], approval_mode="always_require")
    session = coerced.session()
    (request,) = run(coerced.agent.run("refund txn_3", session=session)).user_input_requests
    with pytest.raises(MiddlewareFailure) as excinfo:  # the raw "260000" does not hash to 260000
        run(coerced.agent.run(answer(request, True, "ada"), session=session))
    assert isinstance(failure(excinfo), ApprovalMismatch) and coerced.stripe == []


def test_other_exceptions_pass_untouched(store):
    app = build(store, [("call_1", "explode", json.dumps({"payment_id": "txn_2"}))])
    done = run(app.agent.run("look", session=app.session()))  # no MiddlewareFailure
    assert done.text.startswith("model was told: Error")  # the framework's own error result
    assert store.receipts() == () and store.events() == ()


# --------------------------------------------------------------------------- replay, defaults

NO_KEY = "schema: ctrlrun.policy/v2\nactions:\n  stripe.refund: {decision: approve}\n"


@pytest.mark.parametrize("effect", ["refund:{payment_id}", None])
def test_a_saved_copy_of_the_paused_session_replays_the_answer(store, effect):
    """Why approval-gated functions declare effect=: only the key stops the rerun."""
    app = build(store, [call("call_1", "txn_2", 250_000)], policy=POLICY if effect else NO_KEY, effect=effect)
    session, request, _ = pause(app)
    saved = json.dumps(session.to_dict())  # e.g. a checkpoint taken while paused
    run(app.agent.run(answer(request, True, "ada"), session=session))
    copy = AgentSession.from_dict(json.loads(saved))  # still holds the pending request
    if effect is None:
        run(app.agent.run(answer(request, True, "ada"), session=copy))
        assert app.stripe == [("txn_2", 250_000)] * 2  # a second execution
        assert [r.result for r in store.receipts()] == ["committed", "committed"]
    else:
        with pytest.raises(MiddlewareFailure) as excinfo:
            run(app.agent.run(answer(request, True, "ada"), session=copy))
        refused = failure(excinfo)
        assert isinstance(refused, DuplicateEffect) and refused.state == "committed"
        assert app.stripe == [("txn_2", 250_000)]
        assert [r.result for r in store.receipts()] == ["committed", "blocked"]


def test_a_protected_tool_with_a_defaulted_parameter_cannot_be_approved(store):
    app = build(store, [("call_1", "refund_default", json.dumps({"payment_id": "txn_2"}))], policy=NO_KEY)
    session, request, shown = pause(app)
    assert request.function_call.parse_arguments() == {"payment_id": "txn_2"}  # the default is unset
    assert shown["arguments"] == {"amount": 250_000, "payment_id": "txn_2"}
    with pytest.raises(MiddlewareFailure) as excinfo:
        run(app.agent.run(answer(request, True, "ada"), session=session))
    assert isinstance(failure(excinfo), ApprovalMismatch) and app.stripe == []


# --------------------------------------------------------------------------- the interrupt


def sample_pending() -> PendingApproval:
    from datetime import UTC, datetime, timedelta

    now = datetime.now(UTC)
    return PendingApproval(request_id="apr_" + "0" * 32, action_id="act_" + "0" * 32,
                           action="stripe.refund", action_hash="sha256:" + "0" * 64,
                           arguments={"payment_id": "txn_2", "amount": 1}, resource=None,
                           environment="dev", agent="refund-agent", user=None, created_at=now,
                           expires_at=now + timedelta(minutes=15))  # fmt: skip


def test_the_interrupt_declares_prevention(store):
    interrupt = build(store, []).control.approvals.interrupt
    assert isinstance(interrupt, AgentFrameworkInterrupt) and isinstance(interrupt, FrameworkInterrupt)
    assert (interrupt.framework, interrupt.carries_approved_arguments) == ("agent-framework", True)
    assert AgentFrameworkInterrupt.carries_approved_arguments is True
    provider = InterruptApprovalProvider(store, interrupt)
    assert (provider.framework, provider.carries_approved_arguments) == ("agent-framework", True)
    assert CHANNEL == "agent-framework:function-approval" and APPROVER_KEY == "ctrlrun_approver"
    assert isinstance(ApprovalMiddleware(), FunctionMiddleware)


# --------------------------------------------------------------------------- a fresh process


CHILD = textwrap.dedent(
    """
    import asyncio, json, sys
    sys.path.insert(0, sys.argv[1])
    from af_support import answer, build
    from agent_framework import AgentSession, Content
    from ctrlrun import SQLiteStateStore

    saved = json.load(open(sys.argv[2]))
    store = SQLiteStateStore(sys.argv[3])
    app = build(store, [])  # a new process: a new client, agent and Control; the same store
    session = AgentSession.from_dict(saved["session"])
    request = Content.from_dict(saved["request"])
    done = asyncio.run(app.agent.run(answer(request, True, "ada@example.com"), session=session))
    print(json.dumps({"text": done.text, "stripe": app.stripe}))
    store.close()
    """
)


def test_the_session_resumes_in_a_fresh_process(store, tmp_path):
    app = build(store, [call("call_1", "txn_2", 250_000)])
    session, request, shown = pause(app)
    saved = tmp_path / "session.json"
    saved.write_text(json.dumps({"session": session.to_dict(), "request": request.to_dict()}))
    paths = [str(HERE), str(Path(ctrlrun.__file__).resolve().parents[1])]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    done = subprocess.run([sys.executable, "-c", CHILD, str(HERE), str(saved), str(tmp_path / "state.db")],
                          env=env, capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out == {"text": "model was told: re_txn_2", "stripe": [["txn_2", 250_000]]}
    reopened = SQLiteStateStore(tmp_path / "state.db")
    (receipt,) = reopened.receipts()
    assert (receipt.result, receipt.approver, receipt.action_hash) == ("committed", "ada@example.com",
                                                                       shown["action_hash"])  # fmt: skip
    reopened.close()


# --------------------------------------------------------------------------- unwrap


def test_unwrap_follows_the_cause_out_of_middleware_failure():
    inner = ActionDenied("denied", reason="policy")
    try:
        try:
            raise inner
        except ActionDenied as error:
            raise MiddlewareFailure("outer") from error
    except MiddlewareFailure as outer:
        assert unwrap(outer) is inner
    twice = MiddlewareFailure("twice")
    once = MiddlewareFailure("once")
    once.__cause__ = inner
    twice.__cause__ = once
    assert unwrap(twice) is inner


def test_unwrap_follows_nothing_else():
    plain = RuntimeError("not a wrapper")
    plain.__cause__ = ValueError("hidden")
    assert unwrap(plain) is plain  # only MiddlewareFailure is unwrapped
    alone = MiddlewareFailure("no cause")
    assert unwrap(alone) is alone
    contextual = MiddlewareFailure("context only")
    contextual.__context__ = ValueError("context")
    assert unwrap(contextual) is contextual  # never __context__
    through = MiddlewareFailure("through")
    middle = RuntimeError("middle")
    middle.__cause__ = ValueError("deeper")
    through.__cause__ = middle
    assert unwrap(through) is middle  # stops at the first non-wrapper


def test_unwrap_terminates_on_cycles():
    a, b = MiddlewareFailure("a"), MiddlewareFailure("b")
    a.__cause__, b.__cause__ = b, a
    assert unwrap(a) in (a, b)
    selfish = MiddlewareFailure("self")
    selfish.__cause__ = selfish
    assert unwrap(selfish) is selfish

