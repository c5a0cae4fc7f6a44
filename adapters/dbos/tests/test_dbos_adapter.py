"""ctrlrun-dbos against the real DBOS, in this process: the answers, the retries, the replay.

Each test launches the test application (``refund_app.py``) on a fresh DBOS system database and
ctrlrun store, SQLite and Postgres, and drives it with the public DBOS API.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from dbos import DBOS, SetWorkflowID

import ctrlrun_dbos
from ctrlrun import ActionDenied, AmbiguousEffect, ApprovalTimeout, Control, DuplicateEffect, Policy
from ctrlrun.adapter import ApprovalNotAsked, InterruptApprovalProvider
from ctrlrun.approvals import ApprovalStatus
from ctrlrun.errors import InvalidArgument
from ctrlrun.store import InMemoryStateStore
from ctrlrun_dbos import (
    CHANNEL,
    PENDING_EVENT,
    REFUSED_EVENT,
    DBOSInterrupt,
    answer,
    protected_step,
    topic,
)
from refund_app import POLICY, remote_lines


def start(app, workflow_id: str, payment_id: str, amount: int):
    with SetWorkflowID(workflow_id):
        return DBOS.start_workflow(app.workflow, payment_id, amount)


def pending_of(workflow_id: str) -> dict:
    pending = DBOS.get_event(workflow_id, PENDING_EVENT, timeout_seconds=30)
    assert pending is not None, "the workflow published no pending request"
    return pending


def refused_of(workflow_id: str) -> dict:
    refused = DBOS.get_event(workflow_id, REFUSED_EVENT, timeout_seconds=30)
    assert refused is not None, "the workflow published no refusal"
    return refused


def types(store) -> list[str]:
    return [e.type.value for e in store.events()]


def receipts(store) -> list[str]:
    return [f"{r.decision}/{r.result}/{r.approver}" for r in store.receipts()]


def step_names(workflow_id: str) -> list[str]:
    return [s["function_name"] for s in DBOS.list_workflow_steps(workflow_id)]


# --------------------------------------------------------------------------- allow


def test_an_allowed_call_is_one_step_and_one_effect(launched):
    app = launched()
    assert start(app, "wf-allow", "txn_1", 50).get_result() == {"refund": "re_txn_1", "amount": 50}
    assert remote_lines(app.settings.remote) == ["txn_1 50"]
    assert receipts(app.store) == ["allow/committed/None"]
    assert step_names("wf-allow") == ["refund"]


def test_not_executed_is_retried_and_the_next_try_renews_the_key(launched):
    app = launched(not_executed_first=True)
    assert start(app, "wf-ne", "txn_1", 50).get_result()["refund"] == "re_txn_1"
    assert remote_lines(app.settings.remote) == ["txn_1 50"]
    assert receipts(app.store) == ["allow/failed/None", "allow/committed/None"]
    assert app.store.get_effect("refund:txn_1").attempt == 2


def test_a_recorded_outcome_replays_in_another_workflow(launched):
    app = launched()
    first = start(app, "wf-1", "txn_1", 50).get_result()
    again = start(app, "wf-2", "txn_1", 50).get_result()  # same action: same name, args, agent
    assert again == first
    assert remote_lines(app.settings.remote) == ["txn_1 50"]
    assert receipts(app.store) == ["allow/committed/None", "allow/blocked/None"]


def test_another_action_on_a_committed_key_fails_the_workflow_as_itself(launched):
    app = launched()
    start(app, "wf-1", "txn_1", 50).get_result()
    with pytest.raises(DuplicateEffect) as refused:
        start(app, "wf-2", "txn_1", 60).get_result()
    assert (refused.value.state, refused.value.replayable) == ("committed", False)
    assert remote_lines(app.settings.remote) == ["txn_1 50"]


def test_replay_false_raises_the_duplicate(settings, launched):
    app = launched()
    store = app.store
    control = app.control

    @protected_step(control, "stripe.refund", replay=False, name="refund_no_replay")
    def refund(payment_id: str, amount: int) -> dict:
        return {"refund": "re_" + payment_id}

    from ctrlrun import context

    @DBOS.workflow()
    def no_replay(payment_id: str, amount: int) -> dict:
        with context(agent="refund-agent"):
            return refund(payment_id, amount)

    # registered after launch: DBOS runs it all the same in this process
    assert DBOS.start_workflow(no_replay, "txn_9", 10).get_result() == {"refund": "re_txn_9"}
    with pytest.raises(DuplicateEffect) as refused:
        DBOS.start_workflow(no_replay, "txn_9", 10).get_result()
    assert refused.value.replayable is True  # it could have been replayed; replay=False raises
    assert receipts(store)[-1] == "allow/blocked/None"


def test_a_policy_deny_fails_the_workflow(launched):
    app = launched()
    with pytest.raises(ActionDenied):
        start(app, "wf-deny", "txn_1", 5000).get_result()
    assert receipts(app.store) == ["deny/denied/None"]


# --------------------------------------------------------------------------- approve


def test_a_grant_lands_on_the_one_request_and_runs_once(launched):
    app = launched()
    handle = start(app, "wf-grant", "txn_2", 500)
    pending = pending_of("wf-grant")
    assert pending["arguments"] == {"payment_id": "txn_2", "amount": 500}
    assert answer(DBOS, "wf-grant", approved=True, approver="alice@example.com",
                  arguments=pending["arguments"]) == pending["request_id"]  # fmt: skip
    assert handle.get_result() == {"refund": "re_txn_2", "amount": 500}
    assert remote_lines(app.settings.remote) == ["txn_2 500"]
    assert types(app.store).count("APPROVAL_REQUESTED") == 1  # no orphan
    record = app.store.get_approval(pending["request_id"])
    assert record.status is ApprovalStatus.CONSUMED and record.approver == "alice@example.com"
    assert receipts(app.store) == ["approve/committed/alice@example.com"]
    assert step_names("wf-grant") == [
        "refund", "DBOS.setEvent", "DBOS.recv", "DBOS.sleep", "refund.answer", "refund",
    ]


def test_a_grant_naming_nobody_is_recorded_as_the_channel(launched):
    app = launched()
    handle = start(app, "wf-channel", "txn_2", 500)
    pending = pending_of("wf-channel")
    answer(DBOS, "wf-channel", approved=True, arguments=pending["arguments"])
    handle.get_result()
    assert receipts(app.store) == [f"approve/committed/{CHANNEL}"]


def test_a_denial_is_recorded_and_fails_the_workflow(launched):
    app = launched()
    handle = start(app, "wf-no", "txn_2", 500)
    pending = pending_of("wf-no")
    answer(DBOS, "wf-no", approved=False, approver="bob@example.com")
    with pytest.raises(ActionDenied) as denied:
        handle.get_result()
    assert denied.value.reason == "approval_denied"
    assert "APPROVAL_DENIED" in types(app.store)
    assert app.store.get_approval(pending["request_id"]).status is ApprovalStatus.DENIED
    assert receipts(app.store) == ["approve/denied/bob@example.com"]
    assert remote_lines(app.settings.remote) == []


@pytest.mark.parametrize(
    "message, refusal",
    [
        ("yes", "InvalidArgument"),
        ({"approved": "yes"}, "InvalidArgument"),
        ({"approved": True, "color": "red"}, "InvalidArgument"),
        ({"approved": True, "approver": ""}, "InvalidArgument"),
        ({"approved": True}, "ApprovalMismatch"),  # a grant that echoes nothing cannot be bound
        ({"approved": True, "arguments": {"payment_id": "txn_2", "amount": 900}}, "ApprovalMismatch"),
        ({"recheck": True}, "ApprovalNotAsked"),  # nobody answered in ctrlrun yet
    ],
    ids=["text", "approved-text", "unknown-key", "blank-approver", "no-arguments", "other-arguments",
         "recheck-unanswered"],
)  # fmt: skip
def test_a_bad_or_mismatched_message_is_refused_and_the_wait_goes_on(launched, message, refusal):
    app = launched()
    handle = start(app, "wf-bad", "txn_2", 500)
    pending = pending_of("wf-bad")
    DBOS.send("wf-bad", message, topic(pending["request_id"]))
    refused = refused_of("wf-bad")
    assert refused["request_id"] == pending["request_id"]
    assert refused["refused"].startswith(refusal + ": ")
    record = app.store.get_approval(pending["request_id"])
    assert record.status is ApprovalStatus.PENDING
    assert "APPROVAL_GRANTED" not in types(app.store) and remote_lines(app.settings.remote) == []
    answer(DBOS, "wf-bad", approved=True, approver="alice@example.com", arguments=pending["arguments"])
    assert handle.get_result()["refund"] == "re_txn_2"
    assert types(app.store).count("APPROVAL_REQUESTED") == 1


def test_no_answer_by_the_expiry_is_a_timeout(launched):
    app = launched(ttl_seconds=1.0)
    handle = start(app, "wf-late", "txn_2", 500)
    pending = pending_of("wf-late")
    with pytest.raises(ApprovalTimeout) as late:
        handle.get_result()
    assert late.value.request_id == pending["request_id"]
    assert app.store.get_approval(pending["request_id"]).status is ApprovalStatus.PENDING
    assert remote_lines(app.settings.remote) == []


def test_an_approval_given_with_the_cli_is_taken_on_a_recheck(launched):
    app = launched()
    handle = start(app, "wf-cli", "txn_2", 500)
    pending = pending_of("wf-cli")
    from click.testing import CliRunner

    from ctrlrun.cli import cli

    done = CliRunner().invoke(cli, ["approve", pending["request_id"], "--store-url", app.settings.store_url])
    assert done.exit_code == 0, done.output
    DBOS.send("wf-cli", {"recheck": True}, topic(pending["request_id"]))
    assert handle.get_result()["refund"] == "re_txn_2"
    assert receipts(app.store) == ["approve/committed/cli:local"]
    assert types(app.store).count("APPROVAL_GRANTED") == 1


def test_the_same_answer_sent_twice_is_delivered_once(launched):
    app = launched()
    handle = start(app, "wf-twice", "txn_2", 500)
    pending = pending_of("wf-twice")
    for _ in range(2):
        answer(DBOS, "wf-twice", approved=True, approver="alice@example.com", arguments=pending["arguments"])
    handle.get_result()
    assert remote_lines(app.settings.remote) == ["txn_2 500"]
    assert [s for s in step_names("wf-twice") if s == "DBOS.recv"] == ["DBOS.recv"]


def test_a_corrected_answer_from_the_same_approver_goes_by_send(launched):
    """answer()'s idempotency key is the request and the approver: after a refused answer, the
    same approver's next answer() is the same message to DBOS and is dropped; send it directly."""
    app = launched()
    handle = start(app, "wf-fix", "txn_2", 500)
    pending = pending_of("wf-fix")
    wrong = {"payment_id": "txn_2", "amount": 9}
    answer(DBOS, "wf-fix", approved=True, approver="alice@example.com", arguments=wrong)
    assert refused_of("wf-fix")["refused"].startswith("ApprovalMismatch: ")
    DBOS.send("wf-fix", {"approved": True, "approver": "alice@example.com", "arguments": pending["arguments"]},
              topic(pending["request_id"]))  # fmt: skip
    assert handle.get_result()["refund"] == "re_txn_2"
    assert receipts(app.store) == ["approve/committed/alice@example.com"]


# --------------------------------------------------------------------------- misuse


def test_outside_a_workflow_it_refuses(launched):
    app = launched()
    with pytest.raises(InvalidArgument, match=r"inside a @DBOS.workflow\(\)"):
        app.refund("txn_1", 50)
    assert app.store.receipts() == ()


def test_it_needs_the_dbos_interrupt_provider():
    store = InMemoryStateStore()
    with pytest.raises(InvalidArgument, match="DBOSInterrupt"):
        protected_step(Control(Policy.from_yaml(POLICY), store), "stripe.refund")


def test_unknown_step_options_are_refused():
    store = InMemoryStateStore()
    control = Control(Policy.from_yaml(POLICY), store, approvals=InterruptApprovalProvider(
        store, DBOSInterrupt(carries_approved_arguments=True)))  # fmt: skip
    with pytest.raises(InvalidArgument, match="retries"):
        protected_step(control, "stripe.refund", retries=3)


def test_the_interrupt_constructor_and_answers():
    with pytest.raises(InvalidArgument):
        DBOSInterrupt(carries_approved_arguments="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        DBOSInterrupt()  # type: ignore[call-arg]
    carries, attributes = DBOSInterrupt(carries_approved_arguments=True), DBOSInterrupt(carries_approved_arguments=False)
    said = carries.answer({"approved": True, "approver": "a", "arguments": {"x": 1}})
    assert (said.granted, said.approver, dict(said.approved_arguments)) == (True, "a", {"x": 1})
    assert attributes.answer({"approved": True, "arguments": {"x": 1}}).approved_arguments is None
    assert carries.answer({"approved": False}).approver == CHANNEL
    with pytest.raises(ApprovalNotAsked):
        carries.answer({"recheck": True})
    for bad in (None, [], {"approved": 1}, {"approved": True, "arguments": [1]}, {"recheck": "yes"}):
        with pytest.raises(InvalidArgument):
            carries.answer(bad)
    assert DBOSInterrupt.framework == "dbos" and ctrlrun_dbos.topic("apr_1") == "ctrlrun:apr_1"


def test_answer_refuses_a_workflow_without_a_pending_request(launched):
    app = launched()
    start(app, "wf-none", "txn_1", 50).get_result()
    with pytest.raises(InvalidArgument, match="no pending ctrlrun request"):
        answer(DBOS, "wf-none", approved=True)
    with pytest.raises(InvalidArgument):
        answer(DBOS, "wf-none", approved="yes")  # type: ignore[arg-type]


def test_the_refusal_types_pickle_through_dbos(launched):
    """DBOS stores a step's exception with pickle: an AmbiguousEffect comes back as itself."""
    app = launched(lease_seconds=0.3)
    app.store.reserve_effect("refund:txn_5", "act_elsewhere", timedelta(seconds=0.3))
    app.store.begin_execution("refund:txn_5", "act_elsewhere")
    with pytest.raises(AmbiguousEffect) as unknown:
        start(app, "wf-amb", "txn_5", 50).get_result()
    assert unknown.value.effect_key == "refund:txn_5"
    assert remote_lines(app.settings.remote) == []


def test_importing_the_adapter_does_not_import_dbos():
    import subprocess
    import sys

    code = "import sys, ctrlrun_dbos; assert 'dbos' not in sys.modules, sorted(sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
