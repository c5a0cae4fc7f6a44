"""``ctrlrun.testing``: a user's protected function tested end to end through the shipped helpers
(allow, approve then answer, deny, an approval outliving its expiry), and the helpers' own rules."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import MappingProxyType

import pytest

import ctrlrun
from ctrlrun import (
    ActionDenied,
    ApprovalMismatch,
    ApprovalRecord,
    ApprovalRequired,
    ApprovalStatus,
    ApprovalTimeout,
    Control,
    Event,
    InMemoryStateStore,
    InvalidArgument,
    Policy,
    PolicyError,
    Receipt,
    protect,
    with_approval,
)
from ctrlrun import testing

from .clock import Clock as SuiteClock
from .conftest import FakeClock

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    rules:
      - when: { amount_gte: 0, amount_lte: 50000 }
        decision: allow
      - when: { amount_gte: 0, amount_lte: 500000 }
        decision: approve
      - decision: deny
"""

POLICY_DATA = {
    "schema": "ctrlrun.policy/v2",
    "actions": {
        "stripe.refund": {
            "effect": "refund:{payment_id}",
            "rules": [
                {"when": {"amount_gte": 0, "amount_lte": 50000}, "decision": "allow"},
                {"when": {"amount_gte": 0, "amount_lte": 500000}, "decision": "approve"},
                {"decision": "deny"},
            ],
        }
    },
}


class Refunds:
    """A user's tool under test: a protected refund on a ``ctrlrun.testing`` Control."""

    def __init__(self, control: Control) -> None:
        self.control = control
        self.calls: list[tuple[str, int]] = []

        @protect("stripe.refund", control=control)
        def refund(payment_id: str, amount: int) -> str:
            self.calls.append((payment_id, amount))
            return f"re_{payment_id}"

        self.refund = refund

    def ask(self, payment_id: str, amount: int = 90_000) -> ApprovalRequired:
        with pytest.raises(ApprovalRequired) as asked:
            self.refund(payment_id=payment_id, amount=amount)
        return asked.value


@pytest.fixture
def clock() -> testing.Clock:
    return testing.Clock()


@pytest.fixture
def refunds(clock: testing.Clock) -> Refunds:
    return Refunds(testing.control(POLICY, clock=clock, agent="support-agent"))


# --------------------------------------------------------------------------- end to end


def test_an_allowed_call_runs_once_and_leaves_a_committed_receipt(refunds: Refunds) -> None:
    assert refunds.refund(payment_id="txn_1", amount=100) == "re_txn_1"
    (receipt,) = testing.receipts(refunds.control)
    assert isinstance(receipt, Receipt)
    assert (receipt.decision, receipt.result, receipt.effect_key) == ("allow", "committed", "refund:txn_1")
    assert receipt.principal.agent == "support-agent"
    assert refunds.calls == [("txn_1", 100)]
    assert testing.pending(refunds.control) == ()


def test_an_approval_is_asked_answered_and_spent_once(refunds: Refunds, clock: testing.Clock) -> None:
    asked = refunds.ask("txn_2")
    (waiting,) = testing.pending(refunds.control)
    assert isinstance(waiting, ApprovalRecord) and waiting.approval_id == asked.request_id
    assert waiting.request.action.canonical_arguments == {"payment_id": "txn_2", "amount": 90_000}
    assert waiting.expires_at == clock() + timedelta(minutes=15)
    assert refunds.calls == []

    granted = testing.grant(refunds.control, asked, approver="lead@example.com")
    assert isinstance(granted, ApprovalRecord)
    assert (granted.status, granted.approver) == (ApprovalStatus.GRANTED, "lead@example.com")
    assert testing.pending(refunds.control) == ()
    with with_approval(asked.request_id):
        with pytest.raises(ApprovalMismatch) as changed:
            refunds.refund(payment_id="txn_2", amount=90_001)
        assert changed.value.reason == "mismatch"
        assert refunds.refund(payment_id="txn_2", amount=90_000) == "re_txn_2"
        with pytest.raises(ApprovalMismatch) as again:
            refunds.refund(payment_id="txn_2", amount=90_000)
        assert again.value.reason == "consumed"
    assert refunds.calls == [("txn_2", 90_000)]

    answer = [e for e in testing.events(refunds.control) if e.type == "APPROVAL_GRANTED"]
    assert len(answer) == 1 and isinstance(answer[0], Event)  # written as `ctrlrun approve` writes it
    assert answer[0].approval_id == asked.request_id
    assert answer[0].data == {"approver": "lead@example.com", "action_hash": asked.action_hash}
    spent = [r for r in testing.receipts(refunds.control) if r.result == "committed"]
    assert [(r.decision, r.approval_id, r.approver) for r in spent] == [
        ("approve", asked.request_id, "lead@example.com")
    ]


def test_a_denial_by_the_policy_and_by_a_human(refunds: Refunds) -> None:
    with pytest.raises(ActionDenied) as refused:
        refunds.refund(payment_id="txn_3", amount=900_000)
    assert refused.value.reason == "rule[2]"

    asked = refunds.ask("txn_4")
    denied = testing.deny(refunds.control, asked.request_id)
    assert (denied.status, denied.approver) == (ApprovalStatus.DENIED, testing.DEFAULT_APPROVER)
    with with_approval(asked.request_id), pytest.raises(ActionDenied) as turned_down:
        refunds.refund(payment_id="txn_4", amount=90_000)
    assert turned_down.value.reason == "approval_denied"
    assert refunds.calls == []
    kinds = [e.type for e in testing.events(refunds.control) if e.approval_id == asked.request_id]
    assert "APPROVAL_DENIED" in kinds
    assert [(r.decision, r.result) for r in testing.receipts(refunds.control)] == [
        ("deny", "denied"), ("approve", "denied")
    ]


def test_time_advanced_past_an_approvals_expiry(refunds: Refunds, clock: testing.Clock) -> None:
    granted_late = refunds.ask("txn_5")
    testing.grant(refunds.control, granted_late)
    never_answered = refunds.ask("txn_6")
    clock.advance(minutes=15, seconds=1)  # the requests' 15 minutes are up: no sleep

    assert testing.pending(refunds.control) == ()
    with with_approval(granted_late.request_id), pytest.raises(ApprovalMismatch) as expired:
        refunds.refund(payment_id="txn_5", amount=90_000)
    assert expired.value.reason == "expired"
    with pytest.raises(ApprovalMismatch) as too_late:
        testing.grant(refunds.control, never_answered)
    assert too_late.value.reason == "expired"
    assert refunds.control.store.get_approval(never_answered.request_id).status is ApprovalStatus.EXPIRED
    assert refunds.calls == []


def test_a_request_is_answered_once_and_an_unknown_one_not_at_all(refunds: Refunds) -> None:
    asked = refunds.ask("txn_7")
    record = testing.grant(refunds.control, testing.pending(refunds.control)[0])  # a record works too
    assert record.approval_id == asked.request_id
    for answer in (testing.grant, testing.deny):
        with pytest.raises(ApprovalMismatch) as twice:
            answer(refunds.control, asked)
        assert twice.value.reason == "granted"
        with pytest.raises(ApprovalMismatch) as unknown:
            answer(refunds.control, "apr_" + "0" * 32)
        assert unknown.value.reason == "unknown"
    with pytest.raises(InvalidArgument, match="request id"):
        testing.grant(refunds.control, 42)  # type: ignore[arg-type]


def test_a_grant_with_edits_is_rechecked_and_bound_to_the_edit(refunds: Refunds) -> None:
    asked = refunds.ask("txn_8", 400_000)
    with pytest.raises(ActionDenied):
        testing.grant(refunds.control, asked, arguments={"payment_id": "txn_8", "amount": 900_000})
    edited = testing.grant(refunds.control, asked, arguments={"payment_id": "txn_8", "amount": 40_000})
    assert edited.approved_arguments == {"payment_id": "txn_8", "amount": 40_000}
    assert [e.type for e in testing.events(refunds.control)].count("APPROVAL_EDITED") == 1
    with with_approval(asked.request_id):
        with pytest.raises(ApprovalMismatch):
            refunds.refund(payment_id="txn_8", amount=400_000)
        assert refunds.refund(payment_id="txn_8", amount=40_000) == "re_txn_8"
    assert refunds.calls == [("txn_8", 40_000)]


def test_wait_plays_the_scripted_answers_and_never_hangs(clock: testing.Clock) -> None:
    control = testing.control(POLICY, clock=clock, agent="a", answers=["pending", "grant", "deny"],
                              approver="lead@example.com")  # fmt: skip

    @protect("stripe.refund", wait=True, control=control)
    def refund(payment_id: str, amount: int) -> str:
        return "done"

    assert refund(payment_id="txn_9", amount=90_000) == "done"
    with pytest.raises(ActionDenied) as refused:
        refund(payment_id="txn_10", amount=90_000)
    assert refused.value.reason == "approval_denied"
    with pytest.raises(ApprovalTimeout) as timed_out:  # the script is played out: at once
        refund(payment_id="txn_11", amount=90_000)
    assert [(r.result, r.approver) for r in testing.receipts(control)] == [
        ("committed", "lead@example.com"), ("denied", "lead@example.com")
    ]
    assert [r.approval_id for r in testing.pending(control)] == [timed_out.value.request_id]


# --------------------------------------------------------------------------- control()


@pytest.mark.parametrize("form", ["yaml", "mapping", "frozen mapping", "path", "policy"])
def test_the_policy_may_be_text_a_mapping_a_path_or_loaded(tmp_path: Path, clock: testing.Clock,
                                                           form: str) -> None:  # fmt: skip
    (tmp_path / "ctrlrun.yaml").write_text(POLICY, encoding="utf-8")
    policy = {
        "yaml": POLICY,
        "mapping": POLICY_DATA,
        "frozen mapping": MappingProxyType({**POLICY_DATA, "actions": MappingProxyType(POLICY_DATA["actions"])}),
        "path": tmp_path / "ctrlrun.yaml",
        "policy": Policy.from_yaml(POLICY),
    }[form]
    control = testing.control(policy, clock=clock)
    assert control.policy.policy_hash == Policy.from_yaml(POLICY).policy_hash
    assert isinstance(control.store, InMemoryStateStore) and control.clock is clock
    refunds = Refunds(control)
    with ctrlrun.context(agent="from-context"):  # no agent=: the context decides
        refunds.refund(payment_id="txn_1", amount=1)
    assert testing.receipts(control)[0].principal.agent == "from-context"


def test_a_bad_policy_or_wiring_is_refused(clock: testing.Clock) -> None:
    with pytest.raises(PolicyError):
        testing.control({"schema": "ctrlrun.policy/v2", "actions": {"a": {"decision": "maybe"}}})
    with pytest.raises(PolicyError):
        testing.control(Path("no/such/ctrlrun.yaml"))
    with pytest.raises(InvalidArgument, match="policy must be"):
        testing.control(42)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="not both"):
        testing.control(POLICY, agent="a", identity=ctrlrun.StaticIdentityProvider("b"))
    with pytest.raises(InvalidArgument, match="not both"):
        testing.control(POLICY, answers=["grant"], approvals=lambda store: ctrlrun.LocalApprovalProvider(store))
    with pytest.raises(InvalidArgument, match="needs agent"):
        testing.control(POLICY, user="ada")


def test_the_store_shares_the_clock_and_other_options_reach_the_control(clock: testing.Clock) -> None:
    control = testing.control(POLICY, clock=clock, agent="a", user="ada", environment="staging",
                              approval_ttl=timedelta(minutes=2))  # fmt: skip
    assert (control.environment, control.approval_ttl) == ("staging", timedelta(minutes=2))
    refunds = Refunds(control)
    asked = refunds.ask("txn_1")
    assert testing.pending(control)[0].request.action.principal.user == "ada"
    clock.advance(minutes=2, seconds=1)  # the store decides expiry by the same clock
    assert testing.pending(control) == ()
    with pytest.raises(ApprovalMismatch):
        testing.grant(control, asked)


def test_a_provider_of_ones_own_or_a_function_of_the_store_making_one(clock: testing.Clock) -> None:
    seen: list[object] = []

    def provider(store: object) -> ctrlrun.ScriptedApprovalProvider:
        seen.append(store)
        return ctrlrun.ScriptedApprovalProvider(store, ["grant"], clock=clock)

    control = testing.control(POLICY, clock=clock, approvals=provider)
    assert seen == [control.store] and control.approvals.store is control.store
    ready = ctrlrun.ScriptedApprovalProvider(InMemoryStateStore(clock=clock), [], clock=clock)
    assert testing.control(POLICY, clock=clock, approvals=ready).approvals is ready


def test_without_a_clock_one_is_made() -> None:
    control = testing.control(POLICY)
    assert isinstance(control.clock, testing.Clock) and control.clock() == testing.START


# --------------------------------------------------------------------------- Clock


def test_the_clock_moves_only_when_told() -> None:
    clock = testing.Clock()
    assert clock() == testing.START == datetime(2026, 11, 30, 9, 0, tzinfo=timezone.utc)
    assert clock() is clock.now and clock().tzinfo is timezone.utc
    assert clock.advance(minutes=5) == testing.START + timedelta(minutes=5) == clock()
    assert clock.advance(timedelta(seconds=-1)) == testing.START + timedelta(minutes=5, seconds=-1)
    moment = datetime(2030, 1, 1, tzinfo=timezone.utc)
    assert clock.set(moment) is moment and clock() is moment
    clock.now += timedelta(days=1)
    assert clock() == datetime(2030, 1, 2, tzinfo=timezone.utc)
    assert testing.Clock(moment)() is moment
    assert repr(testing.Clock(moment)) == "Clock(2030-01-01T00:00:00+00:00)"


def test_the_clock_is_aware_and_utc() -> None:
    clock = testing.Clock()
    plus_one = timezone(timedelta(hours=1))
    clock.set(datetime(2030, 1, 1, 10, 0, tzinfo=plus_one))
    assert clock() == datetime(2030, 1, 1, 9, 0, tzinfo=timezone.utc) and clock().tzinfo is timezone.utc
    for refuse in (clock.set, lambda m: setattr(clock, "now", m), testing.Clock):
        with pytest.raises(ValueError, match="aware"):
            refuse(datetime(2030, 1, 1))
    with pytest.raises(InvalidArgument, match="needs a datetime"):
        clock.set("2030-01-01")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="not both"):
        clock.advance(timedelta(seconds=1), seconds=1)
    assert clock() == datetime(2030, 1, 1, 9, 0, tzinfo=timezone.utc)  # nothing refused moved it


def test_the_suites_clocks_are_the_shipped_one() -> None:
    assert SuiteClock is testing.Clock and issubclass(FakeClock, testing.Clock)
    with pytest.raises(ValueError, match="FakeClock needs an aware datetime"):
        FakeClock().set(datetime(2030, 1, 1))


def test_importing_ctrlrun_does_not_load_the_testing_helpers() -> None:
    src = Path(ctrlrun.__file__).resolve().parents[1]
    code = "import sys, ctrlrun; ctrlrun.protect; print('ctrlrun.testing' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(src)}, check=True)  # fmt: skip
    assert done.stdout.strip() == "False"
