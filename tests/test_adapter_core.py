"""ctrlrun.adapter: PendingApproval, ApprovalAnswer, InterruptApprovalProvider, needs_approval, banner.

A fake FrameworkInterrupt stands in for a framework; every row of 06 §1.6 runs against the
in-memory and the SQLite store (the ``store`` fixture), with an injected clock and no sleeps.
"""

from __future__ import annotations

import json
import logging
import re
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from ctrlrun import (
    ActionDenied,
    ApprovalMismatch,
    ApprovalTimeout,
    Control,
    CTRLRunError,
    IdentityError,
    InvalidArgument,
    Policy,
    context,
    protect,
    with_approval,
)
from ctrlrun.action import Action, Principal
from ctrlrun.adapter import (
    OBSERVE_BANNER,
    ApprovalAnswer,
    ApprovalNotAsked,
    FrameworkInterrupt,
    InterruptApprovalProvider,
    PendingApproval,
    banner,
    needs_approval,
)
from ctrlrun.approvals.records import ApprovalStatus, build_request
from ctrlrun.identity import StaticIdentityProvider

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  billing.credit:
    effect: "credit:{invoice}"
    resource: "invoice/{invoice}"
    rules:
      - when: { cents_gte: 0, cents_lte: 1000 }
        decision: allow
      - when: { cents_gte: 0, cents_lte: 100000 }
        decision: approve
      - decision: deny
  billing.flag:
    decision: approve
  billing.void:
    decision: deny
"""

EXPECTED_KEYS = {
    "request_id", "action_id", "action", "action_hash", "arguments", "resource",
    "environment", "agent", "user", "created_at", "expires_at",
}  # fmt: skip


class Boom(Exception):
    """What a framework's own primitive might raise."""


class FakeInterrupt:
    """A FrameworkInterrupt whose answers are scripted by the test."""

    framework = "fake"

    def __init__(self, carries: bool, answer: Any = None) -> None:
        self.carries_approved_arguments = carries
        self.answer = answer
        self.seen: list[PendingApproval] = []

    def interrupt(self, pending: PendingApproval) -> Any:
        self.seen.append(pending)
        answer = self.answer
        return answer(pending) if callable(answer) else answer


def grant_as_shown(approver: str = "ada@example.com"):
    return lambda pending: ApprovalAnswer(True, approver, dict(pending.arguments))


@pytest.fixture
def make(store, clock):
    """Build (control, provider, interrupt, credit, calls) for a scripted interrupt."""

    def build(answer: Any = None, *, carries: bool = True):
        interrupt = FakeInterrupt(carries, answer)
        provider = InterruptApprovalProvider(store, interrupt, clock=clock)
        control = Control(
            Policy.from_yaml(POLICY), store, provider, clock=clock,
            identity=StaticIdentityProvider("billing-bot", "u-7"), environment="dev",
        )  # fmt: skip
        calls: list[tuple[str, int]] = []

        @protect("billing.credit", effect="credit:{invoice}", wait=True, control=control)
        def credit(invoice: str, cents: int, rush: bool) -> str:
            calls.append((invoice, cents))
            return f"credited {cents} on {invoice}"

        return SimpleNamespace(control=control, provider=provider, interrupt=interrupt,
                               credit=credit, calls=calls)  # fmt: skip

    return build


def types_of(store) -> list[str]:
    return [str(e.type) for e in store.events()]


def after_request(store) -> list[Any]:
    events = list(store.events())
    index = [str(e.type) for e in events].index("APPROVAL_REQUESTED")
    return events[index + 1 :]


def assert_untouched(store, w, request_id: str) -> None:
    """A "none" row of 06 §1.6: only APPROVAL_REQUESTED, no receipt, nothing reserved or run."""
    assert types_of(store) == ["ACTION_PROPOSED", "POLICY_EVALUATED", "APPROVAL_REQUESTED"]
    assert store.receipts() == ()
    assert store.get_effect("credit:inv-1") is None
    assert store.get_approval(request_id).status is ApprovalStatus.PENDING
    assert w.calls == []


# --------------------------------------------------------------------------- 06 §1.6 rows


def test_grant_with_matching_arguments_commits_once(make, store):
    w = make(grant_as_shown())
    assert w.credit(invoice="inv-1", cents=5000, rush=False) == "credited 5000 on inv-1"
    assert w.calls == [("inv-1", 5000)]
    (pending,) = w.interrupt.seen
    assert [str(e.type) for e in after_request(store)] == [
        "APPROVAL_GRANTED",  # the answer's own event, written with the grant
        "ACTION_PROPOSED", "POLICY_EVALUATED", "APPROVAL_CONSUMED", "EFFECT_RESERVED",
        "EXECUTION_STARTED", "EXECUTION_COMMITTED",
    ]  # fmt: skip
    granted = after_request(store)[0]
    assert granted.data == {"approver": "ada@example.com", "action_hash": pending.action_hash}
    consumed = next(e for e in store.events() if str(e.type) == "APPROVAL_CONSUMED")
    assert consumed.data["approver"] == "ada@example.com"
    reserved = next(e for e in store.events() if str(e.type) == "EFFECT_RESERVED")
    assert reserved.effect_key == "credit:inv-1"
    (receipt,) = store.receipts()
    assert (receipt.result, receipt.approver) == ("committed", "ada@example.com")
    assert receipt.approval_id == pending.request_id
    assert receipt.action_hash == pending.action_hash
    assert receipt.action_id == pending.action_id  # same Action re-presented (no replay here)
    assert store.get_approval(pending.request_id).status is ApprovalStatus.CONSUMED


def test_refusal_records_a_denial(make, store):
    w = make(ApprovalAnswer(False, "bob@example.com"))  # a refusal needs no arguments
    with pytest.raises(ActionDenied) as refused:
        w.credit(invoice="inv-1", cents=5000, rush=False)
    assert refused.value.reason == "approval_denied"
    assert w.calls == []
    assert [str(e.type) for e in after_request(store)] == [
        "APPROVAL_DENIED",  # the answer's own event, written with the denial
        "ACTION_PROPOSED", "POLICY_EVALUATED", "APPROVAL_DENIED", "ACTION_DENIED",
    ]  # fmt: skip
    assert after_request(store)[0].data == {"approver": "bob@example.com"}
    denied, action_denied = after_request(store)[3:]
    assert denied.data["approver"] == "bob@example.com"
    assert action_denied.data["reason"] == "approval_denied"
    (receipt,) = store.receipts()
    assert (receipt.result, receipt.approver) == ("denied", "bob@example.com")
    (pending,) = w.interrupt.seen
    record = store.get_approval(pending.request_id)
    assert (record.status, record.approver) == (ApprovalStatus.DENIED, "bob@example.com")


@pytest.mark.parametrize(
    "approved",
    [
        {"invoice": "inv-1", "cents": 9000, "rush": False},  # a changed amount
        {"invoice": "inv-1", "cents": 5000, "rush": 0},  # 0 is not False
        {"invoice": "inv-1", "cents": 5000},  # an omitted (defaulted) parameter
        {"invoice": "inv-1", "cents": 5000, "rush": False, "note": "x"},  # an extra one
        None,  # no arguments at all
    ],
)
def test_prevention_mismatch_writes_nothing_and_leaves_the_request_grantable(make, store, approved):
    w = make(lambda pending: ApprovalAnswer(True, "ada@example.com", approved))
    with pytest.raises(ApprovalMismatch) as mismatch:
        w.credit(invoice="inv-1", cents=5000, rush=False)
    assert mismatch.value.reason == "mismatch"
    (pending,) = w.interrupt.seen
    assert_untouched(store, w, pending.request_id)

    # still grantable (as `ctrlrun approve` does), and then it runs exactly the action shown
    store.grant_approval(pending.request_id, "cli:local")
    with with_approval(pending.request_id):
        assert w.credit(invoice="inv-1", cents=5000, rush=False) == "credited 5000 on inv-1"
    assert w.calls == [("inv-1", 5000)]


def test_prevention_float_argument_is_invalid(make, store):
    w = make(lambda p: ApprovalAnswer(True, "ada@example.com", dict(p.arguments, cents=5000.0)))
    with pytest.raises(InvalidArgument):
        w.credit(invoice="inv-1", cents=5000, rush=False)
    assert_untouched(store, w, w.interrupt.seen[0].request_id)


def test_attribution_ignores_the_answers_arguments(make, store):
    w = make(ApprovalAnswer(True, "ada@example.com", {"invoice": "other", "cents": 1}),
             carries=False)  # fmt: skip
    assert w.credit(invoice="inv-1", cents=5000, rush=False) == "credited 5000 on inv-1"
    (receipt,) = store.receipts()
    assert (receipt.result, receipt.approver) == ("committed", "ada@example.com")
    w2 = make(ApprovalAnswer(True, "ada@example.com"), carries=False)  # none needed either
    assert w2.credit(invoice="inv-2", cents=5000, rush=False) == "credited 5000 on inv-2"


class _Forged:
    """An object posing as an answer."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)


def _forged_answer(**changes: Any) -> ApprovalAnswer:
    answer = ApprovalAnswer(True, "ada@example.com", None)
    for name, value in changes.items():
        object.__setattr__(answer, name, value)
    return answer


@pytest.mark.parametrize(
    "answer",
    [
        "yes",
        True,
        1,
        None,
        {"granted": True, "approver": "ada"},
        _Forged(granted=True, approver="ada", approved_arguments=None),
        _forged_answer(granted="yes"),
        _forged_answer(granted=1),
        _forged_answer(approver=""),
        _forged_answer(approver="   "),
        _forged_answer(approver=42),
        _forged_answer(approver="ada\nroot"),
        _forged_answer(approved_arguments=["inv-1"]),
    ],
    ids=lambda a: type(a).__name__ if not isinstance(a, ApprovalAnswer) else repr(a)[:60],
)
def test_malformed_answer_is_invalid_and_writes_nothing(make, store, answer):
    w = make(answer, carries=False)
    with pytest.raises(InvalidArgument):
        w.credit(invoice="inv-1", cents=5000, rush=False)
    assert_untouched(store, w, w.interrupt.seen[0].request_id)


def test_interrupt_exception_propagates_unchanged(make, store):
    boom = Boom("framework checkpointed")

    def raise_(pending):
        raise boom

    w = make(raise_)
    with pytest.raises(Boom) as raised:
        w.credit(invoice="inv-1", cents=5000, rush=False)
    assert raised.value is boom
    assert_untouched(store, w, w.interrupt.seen[0].request_id)


def test_deadline_passing_during_the_interrupt_times_out(make, store, clock):
    def slow(pending):
        clock.advance(minutes=16)  # the human answered after the request's 15 minutes
        return ApprovalAnswer(True, "ada@example.com", dict(pending.arguments))

    w = make(slow)
    with pytest.raises(ApprovalTimeout) as timed_out:
        w.credit(invoice="inv-1", cents=5000, rush=False)
    (pending,) = w.interrupt.seen
    assert timed_out.value.request_id == pending.request_id
    assert_untouched(store, w, pending.request_id)


def test_a_refusal_after_the_deadline_is_not_recorded_either(make, store, clock):
    def slow(pending):
        clock.advance(minutes=16)
        return ApprovalAnswer(False, "bob@example.com")

    w = make(slow)
    with pytest.raises(ApprovalTimeout):
        w.credit(invoice="inv-1", cents=5000, rush=False)
    assert_untouched(store, w, w.interrupt.seen[0].request_id)


def test_deadline_exactly_at_expiry_still_records(make, store, clock):
    def at_the_wire(pending):
        clock.set(pending.expires_at)
        return ApprovalAnswer(True, "ada@example.com", dict(pending.arguments))

    w = make(at_the_wire)
    assert w.credit(invoice="inv-1", cents=5000, rush=False) == "credited 5000 on inv-1"


# --------------------------------------------------------------------------- wait() directly


def _request(store, clock, provider, *, name: str = "billing.flag", **kwargs: Any):
    action = Action(name, {"invoice": "inv-9", "cents": 10}, Principal("billing-bot"),
                    environment="dev")  # fmt: skip
    if kwargs:
        request = build_request(action, None, clock(), **kwargs)
        store.put_approval_request(request)
        return request
    return provider.request(action, timedelta(minutes=15))


def test_already_granted_out_of_band_returns_without_asking(store, clock):
    interrupt = FakeInterrupt(True, ApprovalAnswer(False, "nobody"))
    provider = InterruptApprovalProvider(store, interrupt, clock=clock)
    request = _request(store, clock, provider)
    store.grant_approval(request.request_id, "cli:local")
    approval = provider.wait(request.request_id)
    assert (approval.approval_id, approval.approver) == (request.request_id, "cli:local")
    assert interrupt.seen == []


def test_out_of_band_grant_through_protect_is_used(make, store):
    def approve_elsewhere(pending):  # pragma: no cover - must not be reached
        raise AssertionError("interrupt called for a granted request")

    w = make(approve_elsewhere)
    original = w.provider.wait

    def wait(request_id, timeout=None):
        store.grant_approval(request_id, "cli:local")  # `ctrlrun approve` wins the race
        return original(request_id, timeout)

    w.provider.wait = wait
    assert w.credit(invoice="inv-1", cents=5000, rush=False) == "credited 5000 on inv-1"
    assert store.receipts()[-1].approver == "cli:local"


@pytest.mark.parametrize("status", ["denied", "consumed", "expired"])
def test_settled_requests_return_none_without_asking(store, clock, status):
    interrupt = FakeInterrupt(True, ApprovalAnswer(True, "ada", {}))
    provider = InterruptApprovalProvider(store, interrupt, clock=clock)
    request = _request(store, clock, provider)
    rid = request.request_id
    if status == "denied":
        store.deny_approval(rid, "cli:local")
    elif status == "consumed":
        store.grant_approval(rid, "cli:local")
        store.consume_approval(rid, request.action_hash)
    else:
        clock.advance(minutes=20)
        with pytest.raises(ApprovalMismatch):
            store.grant_approval(rid, "cli:local")  # marks it expired
    assert str(store.get_approval(rid).status) == status
    assert provider.wait(rid) is None
    assert interrupt.seen == []


def test_unknown_request_is_a_mismatch(store, clock):
    provider = InterruptApprovalProvider(store, FakeInterrupt(True), clock=clock)
    with pytest.raises(ApprovalMismatch) as unknown:
        provider.wait("apr_" + "0" * 32)
    assert unknown.value.reason == "unknown"


def test_past_deadline_times_out_before_asking(store, clock):
    interrupt = FakeInterrupt(True, ApprovalAnswer(True, "ada", {}))
    provider = InterruptApprovalProvider(store, interrupt, clock=clock)
    request = _request(store, clock, provider)
    clock.advance(minutes=15, seconds=1)
    with pytest.raises(ApprovalTimeout):
        provider.wait(request.request_id)
    assert interrupt.seen == []
    assert store.get_approval(request.request_id).status is ApprovalStatus.PENDING


def test_wait_timeout_bounds_the_answer(store, clock):
    def slow(pending):
        clock.advance(seconds=10)
        return ApprovalAnswer(False, "bob")

    interrupt = FakeInterrupt(False, slow)
    provider = InterruptApprovalProvider(store, interrupt, clock=clock)
    request = _request(store, clock, provider)
    with pytest.raises(ApprovalTimeout):
        provider.wait(request.request_id, timedelta(seconds=5))
    with pytest.raises(ApprovalTimeout):
        provider.wait(request.request_id, 5)  # seconds
    assert store.get_approval(request.request_id).status is ApprovalStatus.PENDING
    assert provider.wait(request.request_id, timedelta(seconds=30)) is None  # in time: recorded
    assert store.get_approval(request.request_id).status is ApprovalStatus.DENIED
    with pytest.raises(InvalidArgument):
        provider.wait(request.request_id, "soon")


def test_provider_writes_the_answers_event_as_the_cli_does(store, clock):
    interrupt = FakeInterrupt(False, ApprovalAnswer(True, "ada"))
    provider = InterruptApprovalProvider(store, interrupt, clock=clock)
    request = _request(store, clock, provider)
    approval = provider.wait(request.request_id)
    assert approval.approver == "ada" and approval.action_hash == request.action_hash
    (granted,) = store.events()
    assert (str(granted.type), granted.approval_id, granted.action_id) == (
        "APPROVAL_GRANTED", request.request_id, request.action.action_id)
    assert granted.data == {"approver": "ada", "action_hash": request.action_hash}
    assert store.receipts() == ()
    other = _request(store, clock, provider)
    interrupt.answer = ApprovalAnswer(False, "bob")
    assert provider.wait(other.request_id) is None
    denied = store.events()[-1]
    assert (str(denied.type), denied.approval_id, denied.data) == (
        "APPROVAL_DENIED", other.request_id, {"approver": "bob"})


def test_grant_below_a_multi_approver_threshold_times_out(store, clock):
    interrupt = FakeInterrupt(False, ApprovalAnswer(True, "ada"))
    provider = InterruptApprovalProvider(store, interrupt, clock=clock)
    request = _request(store, clock, provider, approvals_required=2)
    with pytest.raises(ApprovalTimeout):
        provider.wait(request.request_id)
    assert store.get_approval(request.request_id).status is ApprovalStatus.PENDING


def test_request_stores_a_pending_request(store, clock):
    provider = InterruptApprovalProvider(store, FakeInterrupt(True), clock=clock)
    action = Action("billing.flag", {"invoice": "inv-9"}, Principal("bot"), environment="dev")
    request = provider.request(action, policy_hash="sha256:" + "a" * 64)
    record = store.get_approval(request.request_id)
    assert record.status is ApprovalStatus.PENDING
    assert record.request.policy_hash == "sha256:" + "a" * 64
    assert request.expires_at - request.created_at == timedelta(minutes=15)
    assert provider.request(action, None).expires_at - clock() == timedelta(minutes=15)


# --------------------------------------------------------------------------- the payload


def test_pending_payload_is_json_and_has_exactly_eleven_keys(make, store, clock):
    shown: list[dict[str, Any]] = []

    def capture(pending):
        shown.append(pending.to_dict())
        return ApprovalAnswer(True, "ada@example.com", shown[-1]["arguments"])

    w = make(capture)
    w.credit(invoice="inv-1", cents=5000, rush=True)
    (payload,) = shown
    assert set(payload) == EXPECTED_KEYS and len(payload) == 11
    assert json.loads(json.dumps(payload)) == payload
    assert re.fullmatch(r"apr_[0-9a-f]{32}", payload["request_id"])
    assert re.fullmatch(r"act_[0-9a-f]{32}", payload["action_id"])
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", payload["action_hash"])
    assert payload["action"] == "billing.credit"
    assert payload["arguments"] == {"invoice": "inv-1", "cents": 5000, "rush": True}
    assert type(payload["arguments"]) is dict
    assert (payload["resource"], payload["environment"]) == ("invoice/inv-1", "dev")
    assert (payload["agent"], payload["user"]) == ("billing-bot", "u-7")
    assert payload["created_at"] == clock().isoformat()
    assert payload["created_at"].endswith("+00:00")
    assert payload["expires_at"] == (clock() + timedelta(minutes=15)).isoformat()
    assert store.receipts()[-1].action_hash == payload["action_hash"]


def test_pending_approval_is_a_value(store, clock):
    provider = InterruptApprovalProvider(store, FakeInterrupt(True), clock=clock)
    request = _request(store, clock, provider)
    pending = PendingApproval.of(store.get_approval(request.request_id))
    assert pending == PendingApproval.of(request)
    payload = pending.to_dict()
    payload["arguments"]["cents"] = 1  # a fresh dict each time: the value is unchanged
    assert pending.to_dict()["arguments"] == {"invoice": "inv-9", "cents": 10}
    with pytest.raises(TypeError):
        pending.arguments["cents"] = 1  # type: ignore[index]
    with pytest.raises(AttributeError):
        pending.request_id = "x"  # type: ignore[misc]
    assert pending.created_at.utcoffset() == timedelta(0)
    for value in vars(pending).values() if hasattr(pending, "__dict__") else ():
        assert not isinstance(value, (Action, Control))
    with pytest.raises(InvalidArgument):
        PendingApproval.of("apr_x")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- answer & wiring


@pytest.mark.parametrize("granted", ["yes", 1, 0, None, "true"])
def test_answer_verdict_must_be_a_real_bool(granted):
    with pytest.raises(InvalidArgument):
        ApprovalAnswer(granted, "ada")  # type: ignore[arg-type]


@pytest.mark.parametrize("approver", ["", "   ", None, 42, "ada\nroot", "a\x00b"])
def test_answer_approver_must_be_non_blank_text(approver):
    with pytest.raises(InvalidArgument):
        ApprovalAnswer(True, approver)  # type: ignore[arg-type]


def test_answer_arguments_must_be_a_mapping():
    with pytest.raises(InvalidArgument):
        ApprovalAnswer(True, "ada", ["inv-1"])  # type: ignore[arg-type]
    answer = ApprovalAnswer(True, "ada", {"items": [1, 2]})
    assert answer.approved_arguments == {"items": (1, 2)}  # a frozen copy
    with pytest.raises(AttributeError):
        answer.granted = False  # type: ignore[misc]


class _NoCarries:
    framework = "x"

    def interrupt(self, pending):  # pragma: no cover
        return None


@pytest.mark.parametrize(
    "interrupt",
    [
        _NoCarries(),
        SimpleNamespace(framework="x", carries_approved_arguments="yes", interrupt=lambda p: p),
        SimpleNamespace(framework="x", carries_approved_arguments=1, interrupt=lambda p: p),
        SimpleNamespace(framework="", carries_approved_arguments=True, interrupt=lambda p: p),
        SimpleNamespace(framework=7, carries_approved_arguments=True, interrupt=lambda p: p),
        SimpleNamespace(carries_approved_arguments=True, interrupt=lambda p: p),
        SimpleNamespace(framework="x", carries_approved_arguments=True, interrupt="call me"),
        SimpleNamespace(framework="x", carries_approved_arguments=True),
    ],
)
def test_provider_refuses_a_malformed_interrupt(store, interrupt):
    with pytest.raises(InvalidArgument):
        InterruptApprovalProvider(store, interrupt)


def test_provider_mirrors_the_interrupt(store):
    fake = FakeInterrupt(False)
    assert isinstance(fake, FrameworkInterrupt)
    provider = InterruptApprovalProvider(store, fake)
    assert (provider.framework, provider.carries_approved_arguments) == ("fake", False)
    with pytest.raises(InvalidArgument):
        InterruptApprovalProvider(object(), fake)


def test_approval_not_asked_is_a_ctrlrun_runtime_error():
    error = ApprovalNotAsked("no answer for this call")
    assert isinstance(error, CTRLRunError) and isinstance(error, RuntimeError)


# --------------------------------------------------------------------------- needs_approval


@pytest.fixture
def plain_control(store, clock):
    return Control(Policy.from_yaml(POLICY), store, clock=clock,
                   identity=StaticIdentityProvider("billing-bot"), environment="dev")  # fmt: skip


def test_needs_approval_is_true_only_for_approve(plain_control, store):
    c = plain_control
    assert needs_approval(c, "billing.credit", {"invoice": "i", "cents": 5000}) is True
    assert needs_approval(c, "billing.credit", {"invoice": "i", "cents": 500}) is False  # allow
    assert needs_approval(c, "billing.credit", {"invoice": "i", "cents": 10**9}) is False  # deny
    assert needs_approval(c, "billing.void", {}) is False  # deny: the tool runs into execute
    assert needs_approval(c, "no.such.action", {}) is False  # unknown → deny
    assert needs_approval(c, "billing.flag", {}, task="t", hop="h") is True
    for _ in range(3):
        needs_approval(c, "billing.credit", {"invoice": "i", "cents": 5000})
    assert store.events() == () and store.receipts() == () and store.pending_approvals() == ()


def test_needs_approval_renders_the_resource(plain_control):
    c = plain_control
    args = {"invoice": "i", "cents": 5000}
    assert needs_approval(c, "billing.credit", args) is True  # policy template renders
    with pytest.raises(InvalidArgument):
        needs_approval(c, "billing.credit", args, resource="{customer}")  # names no argument
    assert needs_approval(c, "billing.credit", args, resource="static") is True
    with pytest.raises(InvalidArgument):
        needs_approval(c, "billing.credit", {"invoice": "i", "cents": 50.0})  # floats refused
    with pytest.raises(InvalidArgument):
        needs_approval(c, "", args)


def test_needs_approval_propagates_identity_errors(store, clock):
    anonymous = Control(Policy.from_yaml(POLICY), store, clock=clock, environment="dev")
    with pytest.raises(ActionDenied) as denied:
        needs_approval(anonymous, "billing.flag", {})
    assert denied.value.reason == "no_principal"
    with context(agent="ctx-agent"):
        assert needs_approval(anonymous, "billing.flag", {}) is True

    class Broken:
        def principal(self, action_name):
            raise RuntimeError("token endpoint down")

    broken = Control(Policy.from_yaml(POLICY), store, clock=clock, environment="dev",
                     identity=Broken())  # fmt: skip
    with pytest.raises(IdentityError):
        needs_approval(broken, "billing.flag", {})


# --------------------------------------------------------------------------- banner


def test_banner_logs_once_per_control_in_observe_mode_only(plain_control, caplog):
    caplog.set_level(logging.WARNING, logger="ctrlrun")
    banner(plain_control)  # enforce mode: silent
    assert not [r for r in caplog.records if OBSERVE_BANNER in r.getMessage()]

    # Control refuses `mode: observe` until observe mode is built; a stand-in carries the mode.
    observing_a = SimpleNamespace(policy=SimpleNamespace(mode="observe"))
    observing_b = SimpleNamespace(policy=SimpleNamespace(mode="observe"))
    for _ in range(3):
        banner(observing_a)
    banner(observing_b)
    hits = [r for r in caplog.records if "OBSERVE MODE - nothing is enforced" in r.getMessage()]
    assert len(hits) == 2
    assert all(r.levelno == logging.WARNING and r.name == "ctrlrun" for r in hits)
