"""Approve with edits: the fix is re-checked by the policy, bound to its hash, and recorded."""

from __future__ import annotations

import json

import pytest

from ctrlrun import (
    ActionDenied,
    ApprovalMismatch,
    ApprovalRequired,
    Control,
    InvalidArgument,
    Policy,
    ScriptedApprovalProvider,
    SQLiteStateStore,
    context,
    protect,
    with_approval,
)
from ctrlrun.approvals.edits import grant_with_edits, parse_assignments
from ctrlrun.receipt import verify_chain

from ._cli_helpers import invoke
from .policies import REFUND_POLICY

POLICY = REFUND_POLICY


@pytest.fixture
def clock():
    from ctrlrun.testing import Clock as TestingClock  # what tests/clock.py's Clock is

    return TestingClock()


@pytest.fixture
def world(tmp_path, monkeypatch, clock):
    monkeypatch.chdir(tmp_path)
    for name in ("CTRLRUN_CONFIG", "CTRLRUN_STATE", "CTRLRUN_STORE_URL", "CTRLRUN_ENVIRONMENT"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "ctrlrun.yaml").write_text(POLICY)
    store = SQLiteStateStore(tmp_path / ".ctrlrun" / "state.db", clock=clock)
    policy = Policy.from_yaml(POLICY)
    control = Control(policy, store, clock=clock)
    calls: list[tuple[str, int]] = []

    @protect("stripe.refund", effect="refund:{payment_id}", control=control)
    def refund(payment_id: str, amount: int) -> str:
        calls.append((payment_id, amount))
        return f"re_{payment_id}_{amount}"

    yield store, policy, control, refund, calls
    store.close()


def ask(refund, amount=400_000, payment_id="txn_9"):
    with context(agent="support-agent"), pytest.raises(ApprovalRequired) as info:
        refund(payment_id, amount)
    return info.value.request_id


def test_parse_assignments():
    assert parse_assignments(["amount=40000", "note=late", "flag=true", "tags=[\"a\"]"]) == {
        "amount": 40000, "note": "late", "flag": True, "tags": ["a"],
    }  # fmt: skip
    with pytest.raises(InvalidArgument):
        parse_assignments(["amount"])
    with pytest.raises(InvalidArgument, match="float"):
        parse_assignments(["amount=1.5"])


def test_edit_to_a_denied_amount_is_refused(world):
    store, policy, _, refund, calls = world
    request_id = ask(refund)
    with pytest.raises(ActionDenied) as info:
        grant_with_edits(store, request_id, "ada@example.com", {"payment_id": "txn_9", "amount": 900_000}, policy=policy)
    assert info.value.reason == "rule[2]" and "denied by the policy" in str(info.value)
    assert store.get_approval(request_id).status == "pending"


def test_edit_within_the_band_runs_once_with_the_edited_amount(world):
    store, policy, _, refund, calls = world
    request_id = ask(refund)
    original_hash = store.get_approval(request_id).request.action_hash
    approval, record = grant_with_edits(
        store, request_id, "ada@example.com", {"payment_id": "txn_9", "amount": 300_000}, policy=policy
    )
    assert approval.edited_from == original_hash and approval.action_hash != original_hash
    assert approval.edit_diff == {"amount": {"from": 400_000, "to": 300_000}}
    assert record.status == "granted" and record.approved_arguments == {"amount": 300_000, "payment_id": "txn_9"}

    with context(agent="support-agent"), with_approval(request_id):
        with pytest.raises(ApprovalMismatch) as original:
            refund("txn_9", 400_000)  # the original arguments never run on this approval
        assert original.value.reason == "edited"
        assert original.value.approved_arguments == {"amount": 300_000, "payment_id": "txn_9"}
        assert refund(**original.value.approved_arguments) == "re_txn_9_300000"
        with pytest.raises(ApprovalMismatch) as again:
            refund("txn_9", 300_000)
        assert again.value.reason == "consumed"
        with pytest.raises(ApprovalMismatch) as original_again:
            refund("txn_9", 400_000)  # the binding is checked first: still not the approved action
        assert original_again.value.reason == "edited"
    assert calls == [("txn_9", 300_000)]

    receipts = store.receipts()
    assert [f"{r.decision}/{r.result}" for r in receipts] == ["approve/blocked", "approve/committed", "approve/blocked", "approve/blocked"]
    committed = json.loads(receipts[1].to_json())
    assert committed["schema"] == "ctrlrun.receipt/v8"
    assert list(committed)[-2:] == ["edited_from", "edit_diff"]
    assert committed["edited_from"] == original_hash
    assert committed["action_hash"] == approval.action_hash
    assert committed["edit_diff"] == {"amount": {"from": 400_000, "to": 300_000}}
    assert committed["arguments"] == {"amount": 300_000, "payment_id": "txn_9"}
    invalidated = [e.data["reason"] for e in store.events() if e.type == "APPROVAL_INVALIDATED"]
    assert invalidated == ["edited", "consumed", "edited"]
    assert verify_chain(store).ok


def test_receipts_without_edits_carry_null_edit_fields(world):
    store, _, _, refund, _ = world
    with context(agent="a"):
        refund("txn_1", 100)
    document = json.loads(store.receipts()[0].to_json())
    assert len(document) == 36 and document["edited_from"] is None and document["edit_diff"] is None


def test_wait_true_executes_the_edited_call(world):
    store, policy, _, _, _ = world

    class EditingProvider(ScriptedApprovalProvider):
        def wait(self, request_id, timeout=None):
            approval, _ = grant_with_edits(store, request_id, "ada@example.com",
                                           {"payment_id": "txn_7", "amount": 40_000 + 200_000}, policy=policy)  # fmt: skip
            return approval

    control = Control(policy, store, EditingProvider(store, []))
    calls = []

    @protect("stripe.refund", effect="refund:{payment_id}", control=control, wait=True)
    def refund(payment_id: str, amount: int) -> str:
        calls.append((payment_id, amount))
        return "ok"

    with context(agent="a"):
        assert refund("txn_7", 400_000) == "ok"
    assert calls == [("txn_7", 240_000)]
    (receipt,) = store.receipts()
    assert receipt.result == "committed" and receipt.edit_diff == {"amount": {"from": 400_000, "to": 240_000}}


def test_cli_approve_with_edits(world, clock):
    store, _, _, refund, calls = world
    request_id = ask(refund)
    refused = invoke(["approve", request_id, "--set", "amount=900000"], clock=clock)
    assert refused.code == 1 and "denied by the policy" in refused.err
    assert store.get_approval(request_id).status == "pending"

    done = invoke(["approve", request_id, "--set", "amount=40000"], clock=clock)
    assert done.code == 0, done.err
    lines = done.lines
    assert lines[0].startswith(f"granted {request_id} with edits for sha256:")
    assert lines[1].startswith("was sha256:")
    assert lines[2] == "changed amount: 400000 → 40000"
    edited = [e for e in store.events() if e.type == "APPROVAL_EDITED"]
    assert edited[0].data["edit_diff"] == {"amount": {"from": 400_000, "to": 40_000}}

    with context(agent="support-agent"), with_approval(request_id):
        assert refund("txn_9", 40_000) == "re_txn_9_40000"  # an allow-band amount closes the grant
    assert calls == [("txn_9", 40_000)]
    assert store.get_approval(request_id).status == "consumed"
    assert store.receipts()[-1].edited_from == store.get_approval(request_id).request.action_hash


def test_cli_approve_with_arguments_json(world, clock):
    store, _, _, refund, _ = world
    request_id = ask(refund)
    done = invoke(
        ["approve", request_id, "--arguments", '{"payment_id": "txn_9", "amount": 123456}'],
        clock=clock,
    )
    assert done.code == 0, done.err
    assert store.get_approval(request_id).approved_arguments == {"amount": 123456, "payment_id": "txn_9"}
    bad = invoke(["approve", ask(refund, payment_id="txn_8"), "--arguments", "{nope"], clock=clock)
    assert bad.code == 2


def test_cli_edit_naming_an_argument_the_request_lacks_is_refused_before_granting(world, clock):
    store, _, _, refund, calls = world
    request_id = ask(refund)
    events = len(store.events())
    refused = invoke(["approve", request_id, "--set", "amout=40000"], clock=clock)
    assert refused.code == 1
    assert "has no argument 'amout'" in refused.err
    assert "its arguments are amount, payment_id" in refused.err and "--allow-new-arguments" in refused.err
    as_object = invoke(["approve", request_id, "--arguments", '{"payment_id": "txn_9", "amout": 1}'],
                       clock=clock)  # fmt: skip
    assert as_object.code == 1 and "has no argument 'amout'" in as_object.err
    assert store.get_approval(request_id).status == "pending"
    assert len(store.events()) == events  # nothing granted, nothing recorded

    done = invoke(["approve", request_id, "--set", "amount=40000"], clock=clock)
    assert done.code == 0, done.err
    with context(agent="support-agent"), with_approval(request_id):
        assert refund("txn_9", 40_000) == "re_txn_9_40000"
    assert calls == [("txn_9", 40_000)]


def test_cli_allow_new_arguments_adds_a_name_on_purpose(world, clock):
    store, _, _, refund, _ = world
    request_id = ask(refund)
    done = invoke(["approve", request_id, "--set", "note=late", "--allow-new-arguments"], clock=clock)
    assert done.code == 0, done.err
    assert "changed note: (absent) → \"late\"" in done.lines
    assert store.get_approval(request_id).approved_arguments["note"] == "late"


@pytest.mark.parametrize(
    "edit",
    [
        ["--set", "amount"],  # no '='
        ["--set", "=5"],  # no name
        ["--set", "amount=1.5"],  # a float
        ["--arguments", "{nope"],  # not JSON
        ["--arguments", "[1, 2]"],  # not an object
        ["--arguments", '"amount"'],
    ],
)
def test_cli_malformed_edits_are_usage_errors(world, clock, edit):
    store, _, _, refund, _ = world
    request_id = ask(refund)
    refused = invoke(["approve", request_id, *edit], clock=clock)
    assert refused.code == 2, refused.err
    assert "Usage:" in refused.err and edit[0] in refused.err
    assert store.get_approval(request_id).status == "pending"
