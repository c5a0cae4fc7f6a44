"""``ctrlrun approve``, ``deny`` and ``pending``."""

from __future__ import annotations

import json

import pytest

import ctrlrun
from ctrlrun import ActionDenied, ApprovalStatus
from ctrlrun._time import format_ts
from ctrlrun.evidence.receipt import EventType

from ._cli_helpers import invoke, later
from .vectors import ROOT

SPEC_HASH = "sha256:22ec1c398e4b93d080b6cba61e5e11b0e21879552ac5dbf63c192d2b2e6af752"


def _events(project):
    return project.store.events()


def test_approve_grants_and_records_the_event(project):
    request_id = project.request(payment_id="txn_2", amount=500_000)
    record = project.store.get_approval(request_id)
    events_before = len(_events(project))
    result = invoke(["approve", request_id], clock=project.clock)
    assert result.code == 0, result.err
    assert result.lines == [
        f"granted {request_id} for {SPEC_HASH}",
        f"expires {format_ts(record.expires_at)}",
    ]
    assert result.lines[1] == "expires 2026-11-30T09:15:00.000Z"
    granted = project.store.get_approval(request_id)
    assert granted.status is ApprovalStatus.GRANTED and granted.approver == "cli:local"
    events = _events(project)
    assert len(events) == events_before + 1
    event = events[-1]
    assert event.type is EventType.APPROVAL_GRANTED
    assert event.action_id == record.request.action.action_id
    assert event.approval_id == request_id
    assert dict(event.data) == {"approver": "cli:local", "action_hash": SPEC_HASH}
    assert list(event.data) == ["approver", "action_hash"]
    # the agent can now run the exact action, once
    assert project.call(payment_id="txn_2", amount=500_000, approval=request_id) == {"ok": "txn_2"}
    assert project.store.receipts()[-1].approver == "cli:local"


def test_deny_refuses_and_records_the_event(project):
    request_id = project.request(payment_id="txn_2", amount=500_000)
    result = invoke(["deny", request_id], clock=project.clock)
    assert result.code == 0, result.err
    assert result.out == f"denied {request_id}\n"
    record = project.store.get_approval(request_id)
    assert record.status is ApprovalStatus.DENIED and record.approver == "cli:local"
    event = _events(project)[-1]
    assert event.type is EventType.APPROVAL_DENIED
    assert event.action_id == record.request.action.action_id and event.approval_id == request_id
    assert dict(event.data) == {"approver": "cli:local"}
    with pytest.raises(ActionDenied):
        project.call(payment_id="txn_2", amount=500_000, approval=request_id)
    assert project.remote == []


@pytest.mark.parametrize("command", ["approve", "deny"])
def test_unknown_request(project, command):
    before = len(_events(project))
    result = invoke([command, "apr_ffffffffffffffffffffffffffffffff"], clock=project.clock)
    assert result.code == 1
    assert result.err.startswith("Error: no approval request apr_ffffffffffffffffffffffffffffffff")
    assert len(_events(project)) == before


@pytest.mark.parametrize("first", ["approve", "deny"])
@pytest.mark.parametrize("second", ["approve", "deny"])
def test_a_request_is_answered_once(project, first, second):
    request_id = project.request(payment_id="txn_2", amount=500_000)
    assert invoke([first, request_id], clock=project.clock).code == 0
    before = len(_events(project))
    result = invoke([second, request_id], clock=project.clock)
    status = "granted" if first == "approve" else "denied"
    assert result.code == 1
    assert result.err.startswith(f"Error: approval request {request_id} is already {status}")
    assert project.store.get_approval(request_id).status == status
    assert len(_events(project)) == before


def test_a_consumed_request_cannot_be_answered(project):
    request_id = project.request(payment_id="txn_2", amount=500_000)
    invoke(["approve", request_id], clock=project.clock)
    project.call(payment_id="txn_2", amount=500_000, approval=request_id)
    result = invoke(["deny", request_id], clock=project.clock)
    assert result.code == 1 and f"{request_id} is already consumed" in result.err


@pytest.mark.parametrize("edit", [["--set", "amount=10000000"], ["--set", "amount=400000"]])
def test_an_edit_of_a_consumed_request_says_it_is_consumed(project, edit):
    """Whether or not the policy would allow the edited action, an answered request is not
    "pending": the refusal names what it is."""
    (project.directory / "ctrlrun.yaml").write_bytes((ROOT / "ctrlrun.yaml").read_bytes())
    request_id = project.request(payment_id="txn_2", amount=500_000)
    invoke(["approve", request_id], clock=project.clock)
    project.call(payment_id="txn_2", amount=500_000, approval=request_id)
    before = len(_events(project))
    result = invoke(["approve", request_id, *edit], clock=project.clock)
    assert result.code == 1 and f"{request_id} is already consumed" in result.err, result.err
    assert "pending" not in result.err and len(_events(project)) == before
    assert project.store.get_approval(request_id).status is ApprovalStatus.CONSUMED


@pytest.mark.parametrize("command", ["approve", "deny"])
def test_past_its_expiry_it_is_marked_expired_and_nothing_is_granted(project, command):
    request_id = project.request(payment_id="txn_2", amount=500_000)
    before = len(_events(project))
    result = invoke([command, request_id], clock=later(project.clock, minutes=15, milliseconds=1))
    assert result.code == 1
    assert result.err.startswith(f"Error: approval request {request_id} expired at ")
    assert "nothing was granted" in result.err
    record = project.store.get_approval(request_id)
    assert record.status is ApprovalStatus.EXPIRED and record.approver is None
    assert len(_events(project)) == before
    again = invoke([command, request_id], clock=project.clock)
    assert again.code == 1 and f"{request_id} is already expired" in again.err


def test_at_exactly_its_expiry_it_can_still_be_granted(project):
    request_id = project.request(payment_id="txn_2", amount=500_000)
    result = invoke(["approve", request_id], clock=later(project.clock, minutes=15))
    assert result.code == 0, result.err


# ------------------------------------------------------------------- pending


@pytest.fixture
def policy_file(project):
    """The starter policy beside the store, where the CLI looks for it (./ctrlrun.yaml)."""
    path = project.directory / "ctrlrun.yaml"
    path.write_bytes((ROOT / "ctrlrun.yaml").read_bytes())
    return path


def test_pending_lists_open_requests_oldest_first(project, policy_file):
    first = project.request(payment_id="txn_2", amount=500_000)
    project.clock.advance(seconds=1)
    second = project.request(agent="ops-agent", payment_id="txn_3", amount=60_000)
    project.clock.advance(seconds=1)
    with ctrlrun.context(agent="support-agent", user="alice"):
        with pytest.raises(ctrlrun.ApprovalRequired) as third:
            project.refund(payment_id="txn_5", amount=70_000)
    third_id = third.value.request_id
    records = {r: project.store.get_approval(r) for r in (first, second, third_id)}
    result = invoke(["pending"], clock=project.clock)
    assert result.code == 0, result.err
    assert result.lines == [
        f"{first}  stripe.refund  support-agent  {SPEC_HASH}  expires 2026-11-30T09:15:00.000Z  "
        'refund:txn_2  new  {"amount":500000,"payment_id":"txn_2"}',
        f"{second}  stripe.refund  ops-agent  {records[second].action_hash}  "
        'expires 2026-11-30T09:15:01.000Z  refund:txn_3  new  {"amount":60000,"payment_id":"txn_3"}',
        f"{third_id}  stripe.refund  support-agent/alice  {records[third_id].action_hash}  "
        'expires 2026-11-30T09:15:02.000Z  refund:txn_5  new  {"amount":70000,"payment_id":"txn_5"}',
    ]
    assert result.err == ""


def test_pending_shows_when_the_effect_already_happened(project, policy_file):
    request_id = project.request(payment_id="txn_2", amount=500_000)
    project.call(payment_id="txn_2", amount=1_000)  # another call took refund:txn_2 meanwhile
    project.clock.advance(seconds=1)
    ambiguous_id = project.request(payment_id="txn_4", amount=500_000)
    project.ambiguous("txn_4")  # after it was asked: now no request would be created
    result = invoke(["pending"], clock=project.clock)
    assert result.code == 0, result.err
    assert [line.split("  ")[5:7] for line in result.lines] == [
        ["refund:txn_2", "committed"],
        ["refund:txn_4", "ambiguous"],
    ]
    documents = [json.loads(line) for line in invoke(["pending", "--json"], clock=project.clock).lines]
    assert [(d["request_id"], d["effect_key"], d["effect_state"]) for d in documents] == [
        (request_id, "refund:txn_2", "committed"),
        (ambiguous_id, "refund:txn_4", "ambiguous"),
    ]


def test_pending_without_a_policy_says_why_keys_are_missing(project):
    project.request(payment_id="txn_2", amount=500_000)
    result = invoke(["pending"], clock=project.clock)
    assert result.code == 0
    assert result.lines[0].endswith('expires 2026-11-30T09:15:00.000Z  -  -  {"amount":500000,"payment_id":"txn_2"}')
    assert "effect keys are not shown" in result.err and "ctrlrun.yaml" in result.err
    assert "CTRLRUN_CONFIG" in result.err
    document = json.loads(invoke(["pending", "--json"], clock=project.clock).lines[0])
    assert (document["effect_key"], document["effect_state"]) == (None, None)


def test_pending_json(project, policy_file):
    request_id = project.request(payment_id="txn_2", amount=500_000)
    record = project.store.get_approval(request_id)
    result = invoke(["pending", "--json"], clock=project.clock)
    assert result.code == 0
    (line,) = result.lines
    document = json.loads(line)
    assert list(document) == [
        "request_id", "action_id", "action", "action_hash", "arguments", "resource",
        "environment", "principal", "created_at", "expires_at", "effect_key", "effect_state",
    ]  # fmt: skip
    assert document == {
        "request_id": request_id,
        "action_id": record.request.action.action_id,
        "action": "stripe.refund",
        "action_hash": SPEC_HASH,
        "arguments": {"amount": 500_000, "payment_id": "txn_2"},
        "resource": None,
        "environment": "production",
        "principal": {"agent": "support-agent", "user": None},
        "created_at": "2026-11-30T09:00:00.000Z",
        "expires_at": "2026-11-30T09:15:00.000Z",
        "effect_key": "refund:txn_2",
        "effect_state": "new",
    }
    assert line == json.dumps(document, separators=(",", ":"), ensure_ascii=False)


def test_pending_hides_answered_and_lapsed_requests_and_writes_nothing(project):
    granted = project.request(payment_id="txn_2", amount=500_000)
    invoke(["approve", granted], clock=project.clock)
    project.clock.advance(minutes=10)
    fresh = project.request(payment_id="txn_3", amount=60_000)
    lapsed_view = later(project.clock, minutes=6)  # the first request's window has passed
    events = len(_events(project))
    result = invoke(["pending"], clock=project.clock)
    assert [line.split()[0] for line in result.lines] == [fresh]
    result = invoke(["pending"], clock=later(lapsed_view, minutes=10))
    assert result.out == "no pending requests\n"
    assert project.store.get_approval(fresh).status is ApprovalStatus.PENDING  # nothing marked
    assert len(_events(project)) == events


def test_pending_empty(project):
    result = invoke(["pending"], clock=project.clock)
    assert result.code == 0 and result.out == "no pending requests\n"
    result = invoke(["pending", "--json"], clock=project.clock)  # stdout is for programs only
    assert (result.code, result.out, result.err) == (0, "", "no pending requests\n")
