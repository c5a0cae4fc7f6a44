"""ctrlrun_pydantic_ai against real Pydantic AI (FunctionModel, TestModel) and ctrlrun's stores, offline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import ctrlrun_pydantic_ai
import pytest
from ctrlrun_pydantic_ai import ANSWER_SHAPE, CHANNEL, ApprovalScope, PydanticAIInterrupt
from pai_support import ALWAYS_APPROVE, ALWAYS_DENY, Clock, build_app
from pydantic_ai import Agent
from pydantic_ai.capabilities import AbstractCapability, HandleDeferredToolCalls
from pydantic_ai.exceptions import UserError
from pydantic_ai.messages import ModelMessagesTypeAdapter
from pydantic_ai.models.test import TestModel
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults, ToolApproved, ToolDenied

import ctrlrun
from ctrlrun import (
    ActionDenied,
    ApprovalMismatch,
    ApprovalNotAsked,
    Control,
    DuplicateEffect,
    InMemoryStateStore,
    InvalidArgument,
    Policy,
    SQLiteStateStore,
    protect,
)
from ctrlrun.adapter import ApprovalAnswer, FrameworkInterrupt, InterruptApprovalProvider
from ctrlrun.identity import StaticIdentityProvider

TESTS = Path(__file__).resolve().parent
SHOWN_ARGS = {"payment_id": "txn_2", "amount": 250_000}
PAYLOAD_KEYS = {
    "request_id", "action_id", "action", "action_hash", "arguments", "resource",
    "environment", "agent", "user", "created_at", "expires_at",
}  # fmt: skip
GRANT_ROW = [  # what a grant records, after the resumed pass's APPROVAL_REQUESTED
    "APPROVAL_GRANTED", "ACTION_PROPOSED", "POLICY_EVALUATED", "APPROVAL_CONSUMED",
    "EFFECT_RESERVED", "EXECUTION_STARTED", "EXECUTION_COMMITTED",
]  # fmt: skip
PASS = ["ACTION_PROPOSED", "POLICY_EVALUATED", "APPROVAL_REQUESTED"]


# --------------------------------------------------------------------------- helpers


@pytest.fixture
def make():
    """``make(**options)``: the refund agent over a fresh in-memory store sharing its clock."""

    def build(**options: Any):
        clock = options.pop("clock", None) or Clock()
        store = options.pop("store", None) or InMemoryStateStore(clock=clock)
        return build_app(store, clock=clock, **options)

    return build


def kinds(store) -> list[str]:
    return [str(e.type) for e in store.events()]


def requests(store) -> list[str]:
    return [e.approval_id for e in store.events() if str(e.type) == "APPROVAL_REQUESTED"]


def status(store, request_id: str) -> str:
    return str(store.get_approval(request_id).status)


def pause(app, prompt: str = "refund txn_2"):
    paused = app.agent.run_sync(prompt)
    assert isinstance(paused.output, DeferredToolRequests), paused.output
    return paused


def shown_of(paused, call_id: str = "call_1") -> dict[str, Any]:
    return paused.output.metadata[call_id]["ctrlrun"]


def said(approver: str | None = None, arguments: Any = None) -> dict[str, Any]:
    entry: dict[str, Any] = {}
    if approver is not None:
        entry["approver"] = approver
    if arguments is not None:
        entry["arguments"] = arguments
    return {"ctrlrun": entry}


def resume(app, paused, approvals: dict[str, Any], metadata: dict[str, Any] | None = None):
    results = DeferredToolResults(approvals=approvals, metadata=metadata or {})
    return app.agent.run_sync(message_history=paused.all_messages(), deferred_tool_results=results)


def grant(app, paused, approver: str = "alice", call_id: str = "call_1"):
    shown = shown_of(paused, call_id)
    return resume(app, paused, {call_id: True}, {call_id: said(approver, shown["arguments"])})


def assert_nothing_more(app, before: list[str]) -> None:
    """The "none" rows: no write beyond what was there, nothing ran, no receipt."""
    assert kinds(app.store) == before
    assert app.stripe == [] and app.store.receipts() == ()
    assert app.store.get_effect("refund:txn_2") is None


# --------------------------------------------------------------------------- the first pass


def test_an_approval_defers_the_tool_call_with_the_payload_in_its_metadata(make):
    app = make()
    paused = pause(app)
    (call,) = paused.output.approvals
    assert (call.tool_name, call.args, call.tool_call_id) == ("refund", SHOWN_ARGS, "call_1")
    assert list(paused.output.metadata) == ["call_1"]
    assert list(paused.output.metadata["call_1"]) == ["ctrlrun"]
    shown = shown_of(paused)
    assert set(shown) == PAYLOAD_KEYS
    assert (shown["action"], shown["arguments"]) == ("stripe.refund", SHOWN_ARGS)
    assert (shown["agent"], shown["user"], shown["environment"]) == ("refund-agent", None, "dev")
    assert json.loads(json.dumps(shown)) == shown
    # left unanswered: nothing ran, nothing granted or reserved, no receipt, R1 pending
    assert_nothing_more(app, PASS)
    assert requests(app.store) == [shown["request_id"]]
    assert status(app.store, shown["request_id"]) == "pending"


def test_without_deferred_tool_requests_among_the_output_types_pydantic_ai_refuses(make):
    app = make(output_type=(str,))
    with pytest.raises(UserError):
        app.agent.run_sync("refund txn_2")
    (request_id,) = requests(app.store)
    assert status(app.store, request_id) == "pending"
    assert_nothing_more(app, PASS)


def test_small_refunds_run_without_a_human(make):
    app = make(calls=[("refund", {"payment_id": "txn_1", "amount": 40_000}, "call_1")])
    assert app.agent.run_sync("refund txn_1").output == "call_1=re_txn_1"
    assert app.stripe == [("txn_1", 40_000)] and requests(app.store) == []


# --------------------------------------------------------------------------- answers


def test_a_grant_with_the_shown_arguments_executes_once_and_names_the_approver(make):
    app = make()
    paused = pause(app)
    shown = shown_of(paused)
    done = grant(app, paused, "alice")
    assert done.output == "call_1=re_txn_2"
    assert app.stripe == [("txn_2", 250_000)]
    r1, r2 = requests(app.store)
    assert r1 == shown["request_id"]
    assert kinds(app.store) == PASS + PASS + GRANT_ROW
    granted = [e for e in app.store.events() if str(e.type) == "APPROVAL_GRANTED"]
    assert [(e.approval_id, e.data["approver"]) for e in granted] == [(r2, "alice")]
    (receipt,) = app.store.receipts()
    assert (str(receipt.decision), str(receipt.result)) == ("approve", "committed")
    assert (receipt.approver, receipt.approval_id, receipt.edited_from) == ("alice", r2, None)
    assert receipt.action_hash == shown["action_hash"]  # continuous across the re-run
    assert receipt.action_id != shown["action_id"]  # not continuous
    assert (status(app.store, r1), status(app.store, r2)) == ("pending", "consumed")  # R1 orphan
    assert str(app.store.get_effect("refund:txn_2").state) == "committed"


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(lambda paused: ({"call_1": True}, None), id="bare-true"),
        pytest.param(lambda paused: ({"call_1": True}, {"call_1": said("alice")}), id="approver-only"),
        pytest.param(lambda paused: ({"call_1": True}, {"call_1": {"other": 1}}), id="other-keys"),
        pytest.param(
            lambda paused: (paused.output.build_results(approve_all=True).approvals, None),
            id="approve-all",
        ),
    ],
)
def test_a_grant_without_arguments_under_prevention_is_a_mismatch(make, answer):
    app = make()
    paused = pause(app)
    approvals, metadata = answer(paused)
    with pytest.raises(ApprovalMismatch) as refused:
        resume(app, paused, approvals, metadata)
    assert type(refused.value) is ApprovalMismatch and refused.value.reason == "mismatch"
    r1, r2 = requests(app.store)
    assert (status(app.store, r1), status(app.store, r2)) == ("pending", "pending")
    assert_nothing_more(app, PASS + PASS)


def test_a_grant_without_arguments_under_attribution_is_granted_by_the_channel(make):
    app = make(carries=False)
    assert resume(app, pause(app), {"call_1": True}).output == "call_1=re_txn_2"
    assert app.store.receipts()[-1].approver == CHANNEL
    other = make(carries=False)
    wrong = {"payment_id": "txn_2", "amount": 1}  # ignored: attribution compares nothing
    done = resume(other, pause(other), {"call_1": True}, {"call_1": said("alice", wrong)})
    assert done.output == "call_1=re_txn_2"
    (receipt,) = other.store.receipts()
    assert (receipt.approver, str(receipt.result)) == ("alice", "committed")
    assert other.stripe == [("txn_2", 250_000)]


@pytest.mark.parametrize(
    "arguments",
    [
        {"payment_id": "txn_2", "amount": 500_000},  # another amount
        {"payment_id": "txn_2", "amount": "250000"},  # a string for the int
        {"payment_id": "txn_2"},  # a missing key
        {**SHOWN_ARGS, "note": "x"},  # an extra key
    ],
)
def test_arguments_that_do_not_hash_to_the_action_are_a_mismatch(make, arguments):
    app = make()
    paused = pause(app)
    with pytest.raises(ApprovalMismatch) as refused:
        resume(app, paused, {"call_1": True}, {"call_1": said("alice", arguments)})
    assert refused.value.reason == "mismatch"
    r1, r2 = requests(app.store)
    assert (status(app.store, r1), status(app.store, r2)) == ("pending", "pending")
    assert_nothing_more(app, PASS + PASS)


@pytest.mark.parametrize("refusal", [False, ToolDenied("not this one")], ids=["false", "tool-denied"])
def test_a_refusal_never_runs_the_body_and_records_nothing(make, refusal):
    app = make()
    paused = pause(app)
    done = resume(app, paused, {"call_1": refusal})
    message = "not this one" if isinstance(refusal, ToolDenied) else "The tool call was denied."
    assert done.output == f"call_1={message}"  # the model hears it; ctrlrun does not
    (r1,) = requests(app.store)
    assert status(app.store, r1) == "pending"  # until its TTL
    assert_nothing_more(app, PASS)


def test_an_edit_is_a_new_action_decided_in_full_and_bound_to_the_edit(make):
    app = make()
    paused = pause(app)
    shown = shown_of(paused)
    edit = {"payment_id": "txn_2", "amount": 240_000}
    done = resume(app, paused, {"call_1": ToolApproved(override_args=edit)},
                  {"call_1": said("alice", edit)})  # fmt: skip
    assert done.output == "call_1=re_txn_2"
    assert app.stripe == [("txn_2", 240_000)]
    r1, r2 = requests(app.store)
    (receipt,) = app.store.receipts()
    assert dict(receipt.arguments) == edit and receipt.approver == "alice"
    assert kinds(app.store) == PASS + PASS + GRANT_ROW  # the grant row, on the edit
    assert receipt.edited_from is None  # the adapter never sets edited_arguments
    assert receipt.action_hash != shown["action_hash"]
    assert app.store.get_approval(r2).action_hash == receipt.action_hash
    assert app.store.get_approval(r1).action_hash == shown["action_hash"]  # R1 keeps the original
    assert (status(app.store, r1), status(app.store, r2)) == ("pending", "consumed")


def test_an_edit_answered_with_the_original_arguments_is_a_mismatch(make):
    app = make()
    paused = pause(app)
    edit = {"payment_id": "txn_2", "amount": 240_000}
    with pytest.raises(ApprovalMismatch):
        resume(app, paused, {"call_1": ToolApproved(override_args=edit)},
               {"call_1": said("alice", shown_of(paused)["arguments"])})  # fmt: skip
    assert_nothing_more(app, PASS + PASS)


def test_an_edit_the_policy_denies_is_denied_with_a_receipt(make):
    app = make()
    paused = pause(app)
    edit = {"payment_id": "txn_2", "amount": 900_000}  # above 5,000.00: deny
    with pytest.raises(ActionDenied):
        resume(app, paused, {"call_1": ToolApproved(override_args=edit)},
               {"call_1": said("alice", edit)})  # fmt: skip
    (receipt,) = app.store.receipts()
    assert (str(receipt.decision), str(receipt.result)) == ("deny", "denied")
    assert app.stripe == [] and len(requests(app.store)) == 1


@pytest.mark.parametrize("truthy", ["yes", 1])
def test_truthy_non_bools_are_refused_by_pydantic_ai_and_the_body_never_reruns(make, truthy):
    app = make()
    paused = pause(app)
    with pytest.raises(UserError):
        resume(app, paused, {"call_1": truthy}, {"call_1": said("alice", SHOWN_ARGS)})
    assert_nothing_more(app, PASS)


@pytest.mark.parametrize(
    "metadata",
    [
        {"ctrlrun": "yes"},
        {"ctrlrun": ["alice"]},
        {"ctrlrun": {"approver": "", "arguments": SHOWN_ARGS}},
        {"ctrlrun": {"approver": "  ", "arguments": SHOWN_ARGS}},
        {"ctrlrun": {"approver": 42, "arguments": SHOWN_ARGS}},
        {"ctrlrun": {"approver": "alice", "arguments": [250_000]}},
        {"ctrlrun": {"approved": True, "arguments": SHOWN_ARGS}},  # an unknown key
    ],
)
def test_malformed_metadata_is_refused_naming_the_shape(make, metadata):
    app = make()
    paused = pause(app)
    with pytest.raises(InvalidArgument) as refused:
        resume(app, paused, {"call_1": True}, {"call_1": metadata})
    assert ANSWER_SHAPE in str(refused.value) and "call_1" in str(refused.value)
    r1, r2 = requests(app.store)
    assert (status(app.store, r1), status(app.store, r2)) == ("pending", "pending")
    assert_nothing_more(app, PASS + PASS)


def test_other_metadata_keys_beside_ctrlrun_are_left_alone(make):
    app = make()
    paused = pause(app)
    metadata = {"call_1": {**said("alice", SHOWN_ARGS), "ticket": "SUP-1"}}
    assert resume(app, paused, {"call_1": True}, metadata).output == "call_1=re_txn_2"
    assert app.store.receipts()[-1].approver == "alice"


# --------------------------------------------------------------------------- replay


def test_replayed_results_with_an_effect_key_are_refused_before_any_request(make):
    app = make()
    paused = pause(app)
    grant(app, paused)
    before = requests(app.store)
    with pytest.raises(DuplicateEffect) as refused:
        grant(app, paused)  # the same results, the same history
    assert refused.value.state == "committed"
    assert requests(app.store) == before  # no human is asked again
    assert [str(r.result) for r in app.store.receipts()] == ["committed", "blocked"]
    assert app.stripe == [("txn_2", 250_000)]


def test_replayed_results_without_an_effect_key_execute_a_second_time(make):
    app = make(effect=False)
    paused = pause(app)
    grant(app, paused)
    grant(app, paused)  # the documented hazard: nothing is single-use in Pydantic AI
    assert app.stripe == [("txn_2", 250_000), ("txn_2", 250_000)]
    assert [str(r.result) for r in app.store.receipts()] == ["committed", "committed"]
    assert len(requests(app.store)) == 3  # R1 and one request per re-run


def test_the_request_ttl_does_not_bound_the_humans_answer(make):
    app = make()
    paused = pause(app)
    r1 = shown_of(paused)["request_id"]
    app.clock.now += timedelta(hours=3)  # R1 expired long ago
    assert grant(app, paused).output == "call_1=re_txn_2"
    receipt = app.store.receipts()[-1]
    assert receipt.approval_id != r1 and status(app.store, receipt.approval_id) == "consumed"


def test_two_parallel_calls_pause_and_resume_separately(make):
    calls = [("refund", {"payment_id": "txn_2", "amount": 250_000}, "c1"),
             ("refund", {"payment_id": "txn_3", "amount": 260_000}, "c2")]  # fmt: skip
    app = make(calls=calls)
    paused = pause(app)
    assert [c.tool_call_id for c in paused.output.approvals] == ["c1", "c2"]
    first, second = shown_of(paused, "c1"), shown_of(paused, "c2")
    assert first["request_id"] != second["request_id"]
    assert (first["arguments"]["payment_id"], second["arguments"]["payment_id"]) == ("txn_2", "txn_3")
    with pytest.raises(UserError):  # Pydantic AI wants an answer for every deferred call
        resume(app, paused, {"c1": True}, {"c1": said("alice", first["arguments"])})
    assert app.stripe == []
    done = resume(app, paused, {"c1": True, "c2": True},
                  {"c1": said("alice", first["arguments"]),
                   "c2": said("bob", second["arguments"])})  # fmt: skip
    assert done.output == "c1=re_txn_2; c2=re_txn_3"
    assert sorted(app.stripe) == [("txn_2", 250_000), ("txn_3", 260_000)]
    by_payment = {r.arguments["payment_id"]: r for r in app.store.receipts()}
    assert {p: (r.approver, str(r.result)) for p, r in by_payment.items()} == {
        "txn_2": ("alice", "committed"), "txn_3": ("bob", "committed")}  # fmt: skip
    assert by_payment["txn_2"].action_hash == first["action_hash"]
    assert by_payment["txn_3"].action_hash == second["action_hash"]
    for orphan in (first["request_id"], second["request_id"]):
        assert status(app.store, orphan) == "pending"


def test_two_parallel_calls_one_granted_one_denied(make):
    calls = [("refund", {"payment_id": "txn_2", "amount": 250_000}, "c1"),
             ("refund", {"payment_id": "txn_3", "amount": 260_000}, "c2")]  # fmt: skip
    app = make(calls=calls)
    paused = pause(app)
    done = resume(app, paused, {"c1": True, "c2": ToolDenied("no")},
                  {"c1": said("alice", shown_of(paused, "c1")["arguments"])})  # fmt: skip
    assert done.output == "c1=re_txn_2; c2=no"
    assert app.stripe == [("txn_2", 250_000)]
    assert [r.arguments["payment_id"] for r in app.store.receipts()] == ["txn_2"]
    assert len(requests(app.store)) == 3  # the denied call was never re-run


def test_an_inline_handler_takes_the_same_path_in_one_run(make):
    seen: list[dict[str, Any]] = []

    def console(ctx, pending: DeferredToolRequests) -> DeferredToolResults:
        metadata = {}
        for call in pending.approvals:
            shown = pending.metadata[call.tool_call_id]["ctrlrun"]
            seen.append(shown)
            metadata[call.tool_call_id] = said("ops-console:ada", shown["arguments"])
        return pending.build_results(approvals={c.tool_call_id: True for c in pending.approvals},
                                     metadata=metadata)  # fmt: skip

    app = make(capabilities=[HandleDeferredToolCalls(handler=console)], output_type=(str,))
    assert app.agent.run_sync("refund txn_2").output == "call_1=re_txn_2"
    assert app.stripe == [("txn_2", 250_000)]
    (shown,) = seen
    r1, r2 = requests(app.store)
    assert r1 == shown["request_id"]
    assert kinds(app.store) == PASS + PASS + GRANT_ROW
    (receipt,) = app.store.receipts()
    assert (receipt.approver, receipt.action_hash) == ("ops-console:ada", shown["action_hash"])
    assert (status(app.store, r1), status(app.store, r2)) == ("pending", "consumed")


def test_an_inline_handler_approving_all_without_arguments_is_a_mismatch(make):
    handler = HandleDeferredToolCalls(handler=lambda ctx, pending: pending.build_results(approve_all=True))
    app = make(capabilities=[handler], output_type=(str,))
    with pytest.raises(ApprovalMismatch):
        app.agent.run_sync("refund txn_2")
    assert_nothing_more(app, PASS + PASS)


@pytest.mark.parametrize(
    "raw", [{"payment_id": "txn_9", "amount": "1200"}, '{"payment_id": "txn_9", "amount": "1200"}'],
    ids=["dict", "json"],
)
def test_a_coerced_argument_is_shown_and_bound_as_validated(make, raw):
    app = make(policy=ALWAYS_APPROVE, calls=[("refund", raw, "call_9")])
    paused = pause(app)
    (call,) = paused.output.approvals
    assert call.args == raw  # what the model sent: the string "1200"
    shown = shown_of(paused, "call_9")
    assert shown["arguments"] == {"payment_id": "txn_9", "amount": 1200}  # what the body got
    with pytest.raises(ApprovalMismatch):  # echoing the model's raw args does not match
        resume(app, paused, {"call_9": True}, {"call_9": said("alice", call.args_as_dict())})
    done = resume(app, paused, {"call_9": True}, {"call_9": said("alice", shown["arguments"])})
    assert done.output == "call_9=re_txn_9"
    assert app.stripe == [("txn_9", 1200)]
    assert dict(app.store.receipts()[-1].arguments) == {"payment_id": "txn_9", "amount": 1200}


def test_the_second_pass_runs_in_a_fresh_process_from_json(tmp_path):
    state = tmp_path / "state.db"
    clock = Clock()  # the store's and the Control's: never the wall clock, which moves on
    store = SQLiteStateStore(str(state), clock=clock)
    try:
        app = build_app(store, clock=clock)
        paused = pause(app)
        shown = shown_of(paused)
        history = tmp_path / "history.json"
        history.write_bytes(ModelMessagesTypeAdapter.dump_json(paused.all_messages()))
        answer = tmp_path / "answer.json"  # what the console sends back, as JSON
        answer.write_text(json.dumps({"call_1": said("alice", shown["arguments"])}))
    finally:
        store.close()
    paths = [str(Path(m.__file__).resolve().parents[1]) for m in (ctrlrun, ctrlrun_pydantic_ai)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), *paths]))
    done = subprocess.run(
        [sys.executable, str(TESTS / "pai_support.py"), "resume", str(state), str(history),
         str(answer)],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    child = json.loads(done.stdout.splitlines()[-1])
    assert child == {"output": "call_1=re_txn_2", "stripe": [["txn_2", 250_000]]}
    store = SQLiteStateStore(str(state))
    try:
        (receipt,) = store.receipts()
        assert (receipt.approver, str(receipt.result)) == ("alice", "committed")
        assert receipt.action_hash == shown["action_hash"]
        assert status(store, shown["request_id"]) == "pending"
        assert kinds(store) == PASS + PASS + GRANT_ROW
    finally:
        store.close()


# --------------------------------------------------------------------------- conformance, and the common rules


def test_without_approval_scope_nobody_is_asked(make):
    app = make(scope=False)
    with pytest.raises(ApprovalNotAsked) as refused:
        app.agent.run_sync("refund txn_2")
    assert "ApprovalScope" in str(refused.value)
    (r1,) = requests(app.store)
    assert status(app.store, r1) == "pending" and r1 in str(refused.value)
    assert_nothing_more(app, PASS)


def test_a_protected_call_outside_any_tool_is_not_asked(make):
    app = make()
    control = app.control

    @protect("stripe.refund", wait=True, control=control)
    def bare(payment_id: str, amount: int) -> str:
        return "ran"

    with pytest.raises(ApprovalNotAsked):
        bare(payment_id="txn_2", amount=250_000)
    assert app.store.receipts() == ()


def test_a_policy_deny_on_the_second_pass_is_denied_with_a_receipt(make):
    app = make()
    paused = pause(app)
    stricter = build_app(app.store, clock=app.clock, policy=ALWAYS_DENY)  # the policy changed
    with pytest.raises(ActionDenied):
        grant(stricter, paused)
    (receipt,) = app.store.receipts()
    assert (str(receipt.decision), str(receipt.result)) == ("deny", "denied")
    assert stricter.stripe == [] and app.stripe == []
    assert requests(app.store) == [shown_of(paused)["request_id"]]
    assert status(app.store, shown_of(paused)["request_id"]) == "pending"


def test_a_second_gated_call_under_one_tool_call_is_not_asked(make):
    app = make(calls=[("refund_twice", {"payment_id": "txn_2", "other": "txn_3", "amount": 250_000},
                       "call_1")])  # fmt: skip
    paused = pause(app)
    assert shown_of(paused)["arguments"]["payment_id"] == "txn_2"
    with pytest.raises(ApprovalNotAsked) as refused:
        grant(app, paused)
    assert "one tool call answers one request" in str(refused.value)
    assert app.stripe == [("txn_2", 250_000)]  # the first ran; the second was not granted
    r1, r2, r3 = requests(app.store)
    assert [status(app.store, r) for r in (r1, r2, r3)] == ["pending", "consumed", "pending"]
    assert app.store.get_approval(r3).request.action.arguments["payment_id"] == "txn_3"
    assert [str(r.result) for r in app.store.receipts()] == ["committed"]


def test_an_async_tool_takes_the_same_path(make):
    app = make(asynchronous=True)
    paused = pause(app)
    assert grant(app, paused).output == "call_1=re_txn_2"
    assert app.stripe == [("txn_2", 250_000)]
    assert app.store.receipts()[-1].approver == "alice"


def test_test_model_drives_the_same_pause_and_grant():
    store = InMemoryStateStore()
    control = Control(
        Policy.from_yaml(ALWAYS_APPROVE, source="inline"), store,
        InterruptApprovalProvider(store, PydanticAIInterrupt(carries_approved_arguments=True)),
        identity=StaticIdentityProvider("refund-agent"), environment="dev",
    )  # fmt: skip
    ran: list[str] = []

    @protect("stripe.refund", effect="refund:{payment_id}", wait=True, control=control)
    def issue_refund(payment_id: str, amount: int) -> str:
        ran.append(payment_id)
        return f"re_{payment_id}"

    agent = Agent(TestModel(call_tools=["refund"]), output_type=[str, DeferredToolRequests],
                  capabilities=[ApprovalScope()])  # fmt: skip

    @agent.tool_plain
    def refund(payment_id: str, amount: int) -> str:
        return issue_refund(payment_id=payment_id, amount=amount)

    paused = agent.run_sync("refund")
    assert isinstance(paused.output, DeferredToolRequests)
    (call,) = paused.output.approvals
    shown = paused.output.metadata[call.tool_call_id]["ctrlrun"]
    assert shown["arguments"] == call.args_as_dict()
    answer = {call.tool_call_id: said("alice", shown["arguments"])}
    agent.run_sync(message_history=paused.all_messages(),
                   deferred_tool_results=DeferredToolResults(approvals={call.tool_call_id: True},
                                                             metadata=answer))  # fmt: skip
    assert ran == [shown["arguments"]["payment_id"]]
    assert store.receipts()[-1].approver == "alice"


# --------------------------------------------------------------------------- the adapter itself


def test_constructor_requires_a_keyword_bool():
    with pytest.raises(TypeError):
        PydanticAIInterrupt()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        PydanticAIInterrupt(True)  # type: ignore[misc]
    for value in (1, "yes", None):
        with pytest.raises(InvalidArgument):
            PydanticAIInterrupt(carries_approved_arguments=value)  # type: ignore[arg-type]
    interrupt = PydanticAIInterrupt(carries_approved_arguments=True)
    assert interrupt.framework == "pydantic-ai" and interrupt.carries_approved_arguments is True
    assert isinstance(interrupt, FrameworkInterrupt)
    provider = InterruptApprovalProvider(InMemoryStateStore(), interrupt)
    assert (provider.framework, provider.carries_approved_arguments) == ("pydantic-ai", True)
    assert CHANNEL == "pydantic-ai:deferred-tools"


def test_approval_scope_is_a_capability():
    assert isinstance(ApprovalScope(), AbstractCapability)


@pytest.mark.parametrize("carries", [True, False])
def test_answer_maps_accepted_metadata(carries):
    interrupt = PydanticAIInterrupt(carries_approved_arguments=carries)
    kept = SHOWN_ARGS if carries else None
    assert interrupt.answer(None) == ApprovalAnswer(True, CHANNEL, None)
    assert interrupt.answer({}) == ApprovalAnswer(True, CHANNEL, None)
    assert interrupt.answer({"ticket": 1}) == ApprovalAnswer(True, CHANNEL, None)
    assert interrupt.answer({"ctrlrun": None}) == ApprovalAnswer(True, CHANNEL, None)
    assert interrupt.answer(said("ada", SHOWN_ARGS)) == ApprovalAnswer(True, "ada", kept)
    assert interrupt.answer(said(None, SHOWN_ARGS)) == ApprovalAnswer(True, CHANNEL, kept)


@pytest.mark.parametrize("metadata", ["yes", 1, ["ctrlrun"], {"ctrlrun": True}])
def test_answer_refuses_non_mappings(metadata):
    with pytest.raises(InvalidArgument) as refused:
        PydanticAIInterrupt(carries_approved_arguments=True).answer(metadata)
    assert ANSWER_SHAPE in str(refused.value)


def test_importing_the_adapter_does_not_import_pydantic_ai():
    code = ("import sys, ctrlrun_pydantic_ai; assert 'pydantic_ai' not in sys.modules; "
            "ctrlrun_pydantic_ai.ApprovalScope; assert 'pydantic_ai' in sys.modules")  # fmt: skip
    paths = [str(Path(m.__file__).resolve().parents[1]) for m in (ctrlrun, ctrlrun_pydantic_ai)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
