"""The protected call: pipeline, events, receipts, approvals, outcomes, reconcile, wiring."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest

import ctrlrun
from ctrlrun import (
    Action,
    ActionDenied,
    AmbiguousEffect,
    ApprovalMismatch,
    ApprovalRequired,
    ApprovalTimeout,
    Control,
    DuplicateEffect,
    EffectKeyError,
    EffectState,
    InMemoryStateStore,
    InvalidArgument,
    NotExecuted,
    Policy,
    PolicyError,
    Principal,
    ScriptedApprovalProvider,
    SQLiteStateStore,
    context,
    protect,
    with_approval,
)
from ctrlrun.receipt import verify_chain

from .clock import Clock

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
  customer.read: { decision: allow }
  iam.grant_admin: { decision: deny }
"""


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture(params=["memory", "sqlite"])
def store(request, tmp_path, clock):
    if request.param == "memory":
        yield InMemoryStateStore(clock=clock)
    else:
        store = SQLiteStateStore(tmp_path / "state.db", clock=clock)
        yield store
        store.close()


@pytest.fixture
def control(store, clock):
    return Control(Policy.from_yaml(POLICY), store, clock=clock)


def make_refund(control, calls, **options):
    @protect("stripe.refund", control=control, **options)
    def refund(payment_id: str, amount: int, note: str = "") -> dict:
        calls.append((payment_id, amount))
        return {"id": f"re_{payment_id}"}

    return refund


def types(store):
    return [e.type.value for e in store.events()]


def results(store):
    return [f"{r.decision}/{r.result}" for r in store.receipts()]


# -- the allow path ---------------------------------------------------------------------------


def test_allow_runs_once_and_records(control, store):
    calls = []
    refund = make_refund(control, calls)
    with context(agent="support-agent"):
        assert refund("txn_1", 100) == {"id": "re_txn_1"}
        with pytest.raises(DuplicateEffect) as dup:
            refund(payment_id="txn_1", amount=100)
    assert dup.value.state == "committed" and dup.value.effect_key == "refund:txn_1"
    assert calls == [("txn_1", 100)]
    assert types(store) == [
        "ACTION_PROPOSED", "POLICY_EVALUATED", "EFFECT_RESERVED", "EXECUTION_STARTED",
        "EXECUTION_COMMITTED",
        "ACTION_PROPOSED", "POLICY_EVALUATED", "EFFECT_RESERVATION_REFUSED",
    ]  # fmt: skip
    assert results(store) == ["allow/committed", "allow/blocked"]
    first = store.receipts()[0]
    assert first.arguments == {"amount": 100, "note": "", "payment_id": "txn_1"}
    assert first.policy_hash == control.policy.policy_hash
    assert first.principal.agent == "support-agent"
    record = store.get_effect("refund:txn_1")
    assert record.state is EffectState.COMMITTED and record.result == {"id": "re_txn_1"}
    assert verify_chain(store).ok


def test_at_most_two_store_transactions_per_allowed_call(control, store):
    refund = make_refund(control, [])
    with context(agent="a"):
        before = store.transactions
        refund("txn_1", 100)
    assert store.transactions - before <= 2


def test_positional_and_keyword_calls_are_one_action(control, store):
    calls = []
    refund = make_refund(control, calls)
    with context(agent="a"):
        refund("txn_1", 100)
        with pytest.raises(DuplicateEffect):
            refund(amount=100, payment_id="txn_1", note="")
    hashes = {e.data.get("action_hash") for e in store.events() if e.type == "ACTION_PROPOSED"}
    assert len(hashes) == 1


def test_function_receives_canonical_copies(control):
    seen = []

    @protect("customer.read", control=control)
    def read(ids: list, meta: dict) -> int:
        seen.append((ids, meta))
        ids.append("mutated")
        return len(ids)

    mine = ["a", ("b", "c")]
    with context(agent="a"):
        assert read(mine, {"k": (1, 2)}) == 3
    assert seen[0] == (["a", ["b", "c"], "mutated"], {"k": [1, 2]})
    assert mine == ["a", ("b", "c")]


def test_call_without_effect_key(control, store):
    @protect("customer.read", control=control)
    def read(customer_id: str) -> str:
        return customer_id

    with context(agent="a"):
        assert read("c1") == "c1"
        assert read("c1") == "c1"
    assert results(store) == ["allow/committed", "allow/committed"]
    assert store.list_effects() == ()
    assert "EFFECT_RESERVED" not in types(store)


# -- denials and bad input --------------------------------------------------------------------


def test_policy_deny_and_unknown_action(control, store):
    calls = []
    refund = make_refund(control, calls)

    @protect("nobody.declared", control=control)
    def unknown() -> None:
        calls.append("unknown")

    with context(agent="a"):
        with pytest.raises(ActionDenied) as deny:
            refund("txn_9", 500_001)
        with pytest.raises(ActionDenied) as unknown_denied:
            unknown()
    assert deny.value.reason == "rule[2]" and deny.value.action_id.startswith("act_")
    assert unknown_denied.value.reason == "unknown_action"
    assert calls == []
    assert results(store) == ["deny/denied", "deny/denied"]
    assert [r.error for r in store.receipts()] == [None, None]
    assert store.list_effects() == ()


def test_no_principal_records_nothing(control, store, caplog):
    refund = make_refund(control, [])
    with caplog.at_level(logging.WARNING, logger="ctrlrun"):
        with pytest.raises(ActionDenied) as info:
            refund("txn_1", 100)
    assert info.value.reason == "no_principal" and info.value.action_id is None
    assert store.events() == () and store.receipts() == ()
    assert "context" in caplog.text


def test_float_argument_refused_before_anything(control, store):
    calls = []
    refund = make_refund(control, calls)
    with context(agent="a"), pytest.raises(InvalidArgument) as info:
        refund("txn_1", 10.5)
    assert "arguments.amount" in str(info.value) and "minor units" in str(info.value)
    assert calls == [] and store.events() == () and store.receipts() == ()


@pytest.mark.parametrize("payment_id", ["", None, True, ["x"]])
def test_unrenderable_effect_key(control, store, payment_id):
    calls = []
    refund = make_refund(control, calls)
    with context(agent="a"), pytest.raises(EffectKeyError) as info:
        refund(payment_id, 100)
    assert "payment_id" in str(info.value)
    assert calls == []
    assert types(store) == ["ACTION_PROPOSED", "ACTION_DENIED"]
    (receipt,) = store.receipts()
    assert (receipt.decision, receipt.result, receipt.decision_reason) == ("deny", "denied", "effect_key_error")
    assert receipt.error == str(info.value)


def test_decoration_checks():
    with pytest.raises(InvalidArgument):
        protect("")
    with pytest.raises(InvalidArgument, match="x.y"):
        protect("x.y", effect="refund:{payment id}")
    with pytest.raises(InvalidArgument):
        protect("x.y", effect="refund:{id:>5}")
    with pytest.raises(InvalidArgument):
        protect("x.y", lease=timedelta(0))
    with pytest.raises(InvalidArgument):
        protect("x.y", reconcile_eagerly=True)
    with pytest.raises(InvalidArgument):
        protect("x.y", reconcile="not callable")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="preconditions"):
        protect("x.y", preconditions={"balance": 0})  # type: ignore[arg-type]
    protect("x.y", preconditions=lambda action: {})  # a callable is accepted
    for bad in (lambda *args: None, lambda **kw: None, lambda data_scope: None):
        with pytest.raises(InvalidArgument, match="x.y"):
            protect("x.y")(bad)

    def gen():
        yield 1

    async def agen():
        yield 1

    for bad in (gen, agen):
        with pytest.raises(InvalidArgument, match="x.y"):
            protect("x.y")(bad)


def test_wrapper_keeps_metadata(control):
    @protect("customer.read", control=control)
    def read(customer_id: str) -> str:
        """Read one customer."""
        return customer_id

    assert read.__name__ == "read" and read.__doc__ == "Read one customer."


def test_control_refuses_unenforced_features(store):
    policy = Policy.from_yaml(
        "schema: ctrlrun.policy/v6\nactions:\n  a.b: { decision: approve, approvals_required: 2 }\n"
    )
    with pytest.raises(PolicyError, match="not enforced"):
        Control(policy, store)


def test_environment_resolution(store, monkeypatch):
    policy = Policy.from_yaml("schema: ctrlrun.policy/v3\nenvironment: staging\nactions: {}\n")
    monkeypatch.delenv("CTRLRUN_ENVIRONMENT", raising=False)
    assert Control(policy, store).environment == "staging"
    assert Control(policy, store, environment="dev").environment == "dev"
    monkeypatch.setenv("CTRLRUN_ENVIRONMENT", "qa")
    assert Control(policy, store).environment == "qa"
    monkeypatch.setenv("CTRLRUN_ENVIRONMENT", " ")
    with pytest.raises(InvalidArgument, match="CTRLRUN_ENVIRONMENT"):
        Control(policy, store)


def test_execute_refuses_wrong_environment_and_reserved_keys(control):
    action = Action("customer.read", {}, Principal("a"), environment="staging")
    with pytest.raises(InvalidArgument, match="staging"):
        control.execute(action, lambda: None)
    action = Action("customer.read", {}, Principal("a"))
    for key in ("", "policy:abc"):
        with pytest.raises(InvalidArgument):
            control.execute(action, lambda: None, key)
    receipt = control.execute(action, lambda: 7, "read:1")
    assert receipt.result == "committed" and receipt.seq == 1


# -- approvals --------------------------------------------------------------------------------


def request(refund, amount=200_000, payment_id="txn_2"):
    with context(agent="a"), pytest.raises(ApprovalRequired) as info:
        refund(payment_id, amount)
    return info.value


def test_approval_flow(control, store):
    calls = []
    refund = make_refund(control, calls)
    required = request(refund)
    assert types(store) == ["ACTION_PROPOSED", "POLICY_EVALUATED", "APPROVAL_REQUESTED"]
    assert store.receipts() == () and store.list_effects() == ()
    pending = store.pending_approvals()
    assert [p.approval_id for p in pending] == [required.request_id]
    assert pending[0].request.policy_hash == control.policy_hash

    with context(agent="a"), with_approval(required.request_id):
        with pytest.raises(ApprovalMismatch) as early:
            refund("txn_2", 200_000)
    assert early.value.reason == "pending"

    store.grant_approval(required.request_id, "cli:local")
    with context(agent="a"), with_approval(required.request_id):
        with pytest.raises(ApprovalMismatch) as changed:
            refund("txn_2", 200_001)
        assert changed.value.reason == "mismatch"
        refund("txn_2", 200_000)
        with pytest.raises(ApprovalMismatch) as again:
            refund("txn_2", 200_000)
        assert again.value.reason == "consumed"
    assert calls == [("txn_2", 200_000)]
    assert results(store) == ["approve/blocked", "approve/blocked", "approve/committed", "approve/blocked"]
    committed = store.receipts()[2]
    assert committed.approver == "cli:local" and committed.approval_id == required.request_id
    consumed = [e for e in store.events() if e.type == "APPROVAL_CONSUMED"]
    assert consumed[0].data == {"approver": "cli:local"}
    invalidated = [e.data["reason"] for e in store.events() if e.type == "APPROVAL_INVALIDATED"]
    assert invalidated == ["pending", "mismatch", "consumed"]


def test_denied_approval(control, store):
    calls = []
    refund = make_refund(control, calls)
    required = request(refund)
    store.deny_approval(required.request_id, "cli:local")
    with context(agent="a"), with_approval(required.request_id), pytest.raises(ActionDenied) as info:
        refund("txn_2", 200_000)
    assert info.value.reason == "approval_denied" and calls == []
    (receipt,) = store.receipts()
    assert (receipt.decision, receipt.result, receipt.approver) == ("approve", "denied", "cli:local")
    assert types(store)[-2:] == ["APPROVAL_DENIED", "ACTION_DENIED"]


def test_expired_approval(control, store, clock):
    refund = make_refund(control, [])
    required = request(refund)
    store.grant_approval(required.request_id, "cli:local")
    clock.advance(minutes=15)
    clock.advance(microseconds=1)
    with context(agent="a"), with_approval(required.request_id), pytest.raises(ApprovalMismatch) as info:
        refund("txn_2", 200_000)
    assert info.value.reason == "expired"
    assert store.get_approval(required.request_id).status == "expired"
    assert types(store)[-2:] == ["APPROVAL_EXPIRED", "APPROVAL_INVALIDATED"]


def test_refused_reservation_leaves_approval_unspent(control, store):
    calls = []
    refund = make_refund(control, calls)
    required = request(refund)  # asked while refund:txn_2 was still free
    with context(agent="a"):
        refund("txn_2", 100)  # then committed on the allow band
    store.grant_approval(required.request_id, "cli:local")
    with context(agent="a"), with_approval(required.request_id), pytest.raises(DuplicateEffect):
        refund("txn_2", 200_000)
    assert store.get_approval(required.request_id).status == "granted"


def test_presented_approval_on_deny_is_untouched(control, store):
    refund = make_refund(control, [])
    required = request(refund)
    store.grant_approval(required.request_id, "cli:local")
    with context(agent="a"), with_approval(required.request_id), pytest.raises(ActionDenied):
        refund("txn_2", 900_000)
    assert store.get_approval(required.request_id).status == "granted"
    assert store.receipts()[-1].approval_id == required.request_id


def test_wait_true_grant_and_deny(store, clock):
    policy = Policy.from_yaml(POLICY)
    calls = []
    granting = Control(policy, store, ScriptedApprovalProvider(store, ["pending", "grant"], clock=clock), clock=clock)
    refund = make_refund(granting, calls, wait=True)
    with context(agent="a"):
        assert refund("txn_5", 200_000) == {"id": "re_txn_5"}
    assert calls == [("txn_5", 200_000)]
    proposals = [e.action_id for e in store.events() if e.type == "ACTION_PROPOSED"]
    assert len(proposals) == 2 and proposals[0] == proposals[1]
    assert results(store) == ["approve/committed"]
    assert store.receipts()[0].approver == "cli:scripted"

    denying = Control(policy, store, ScriptedApprovalProvider(store, ["deny"], clock=clock), clock=clock)
    refund = make_refund(denying, calls, wait=True)
    with context(agent="a"), pytest.raises(ActionDenied) as info:
        refund("txn_6", 200_000)
    assert info.value.reason == "approval_denied"
    assert results(store)[-1] == "approve/denied"

    silent = Control(policy, store, ScriptedApprovalProvider(store, ["pending"], clock=clock), clock=clock)
    refund = make_refund(silent, calls, wait=True)
    with context(agent="a"), pytest.raises(ApprovalTimeout):
        refund("txn_7", 200_000)
    assert len(calls) == 1 and len(store.receipts()) == 2


def test_local_provider_polls_without_sleeping(store, clock):
    from ctrlrun import LocalApprovalProvider

    naps = []

    def nap(seconds):
        naps.append(seconds)
        if len(naps) == 2:
            (pending,) = store.pending_approvals()
            store.grant_approval(pending.approval_id, "cli:local")
        clock.advance(seconds=seconds)

    provider = LocalApprovalProvider(store, clock=clock, sleep=nap)
    control = Control(Policy.from_yaml(POLICY), store, provider, clock=clock)
    calls = []
    refund = make_refund(control, calls, wait=True)
    with context(agent="a"):
        refund("txn_8", 200_000)
    assert calls == [("txn_8", 200_000)] and len(naps) == 2


# -- outcomes ---------------------------------------------------------------------------------


def test_not_executed_is_failed_and_renews(control, store):
    tokens = []
    attempts = iter([NotExecuted("connection refused before sending"), None])

    @protect("stripe.refund", control=control)
    def refund(payment_id: str, amount: int) -> str:
        tokens.append(ctrlrun.idempotency_token())
        error = next(attempts)
        if error:
            raise error
        return "ok"

    with context(agent="a"):
        with pytest.raises(NotExecuted):
            refund("txn_1", 100)
        assert refund("txn_1", 100) == "ok"
    assert results(store) == ["allow/failed", "allow/committed"]
    receipts = store.receipts()
    assert receipts[0].error == "connection refused before sending"
    assert [r.attempt for r in receipts] == [1, 2]
    assert tokens[0] != tokens[1]
    assert tokens[0] == ctrlrun.effects.records.idempotency_token_for("refund:txn_1", 1)


def test_any_other_exception_is_ambiguous(control, store):
    @protect("stripe.refund", control=control)
    def refund(payment_id: str, amount: int) -> str:
        raise ConnectionResetError("reset by peer")

    with context(agent="a"):
        with pytest.raises(ConnectionResetError):
            refund("txn_1", 100)
        with pytest.raises(AmbiguousEffect) as info:
            refund("txn_1", 100)
    assert info.value.effect_key == "refund:txn_1"
    assert results(store) == ["allow/ambiguous", "allow/blocked"]
    assert store.receipts()[0].error == "ConnectionResetError: reset by peer"
    assert store.get_effect("refund:txn_1").state is EffectState.AMBIGUOUS


def test_keyboard_interrupt_is_ambiguous_and_propagates(control, store):
    @protect("stripe.refund", control=control)
    def refund(payment_id: str, amount: int) -> str:
        raise KeyboardInterrupt

    with context(agent="a"), pytest.raises(KeyboardInterrupt):
        refund("txn_1", 100)
    assert store.get_effect("refund:txn_1").state is EffectState.AMBIGUOUS


def test_in_progress_and_lapsed_lease(control, store, clock):
    calls = []
    inner = {}

    @protect("stripe.refund", control=control)
    def refund(payment_id: str, amount: int) -> str:
        calls.append(payment_id)
        if payment_id == "txn_1":
            with pytest.raises(DuplicateEffect) as held:
                refund(payment_id, amount)  # a second agent while the first executes
            inner["state"] = held.value.state
        return "ok"

    with context(agent="a"):
        refund("txn_1", 100)
    assert inner["state"] == "in_progress" and calls == ["txn_1"]


def test_outcome_write_refused_when_record_moved_on(control, store, clock):
    @protect("stripe.refund", control=control)
    def refund(payment_id: str, amount: int) -> str:
        clock.advance(minutes=6)  # the lease lapses while we run...
        with pytest.raises(AmbiguousEffect):
            store.reserve_effect("refund:txn_1", "act_" + "0" * 32)  # ...and someone contests it
        return "done"

    with context(agent="a"), pytest.raises(AmbiguousEffect):
        refund("txn_1", 100)
    (receipt,) = store.receipts()
    assert receipt.result == "ambiguous" and "returned" in receipt.error


def test_sink_failure_never_fails_the_call(store, clock, caplog):
    class Broken:
        def on_event(self, event):
            raise RuntimeError("disk full")

        def on_receipt(self, receipt):
            raise RuntimeError("disk full")

    class Keep:
        def __init__(self):
            self.events, self.receipts = [], []

        def on_event(self, event):
            self.events.append(event)

        def on_receipt(self, receipt):
            self.receipts.append(receipt)

    keep = Keep()
    control = Control(Policy.from_yaml(POLICY), store, clock=clock, sinks=[Broken(), keep])
    refund = make_refund(control, [])
    with context(agent="a"):
        refund("txn_1", 100)
    assert [e.event_id for e in keep.events] == [e.event_id for e in store.events()]
    assert keep.receipts[0].hash == store.receipts()[0].hash
    assert "disk full" in caplog.text or "sink" in caplog.text


# -- reconcile --------------------------------------------------------------------------------


def ambiguous_first(control, store, hook, **options):
    calls = []
    state = {"fail": True}

    @protect("stripe.refund", control=control, reconcile=hook, **options)
    def refund(payment_id: str, amount: int) -> str:
        calls.append(payment_id)
        if state["fail"]:
            state["fail"] = False
            raise TimeoutError("lost reply")
        return "ok"

    return refund, calls


def test_reconcile_committed(control, store):
    asked = []

    def hook(key):
        asked.append(key)
        return "committed"

    refund, calls = ambiguous_first(control, store, hook)
    with context(agent="a"):
        with pytest.raises(TimeoutError):
            refund("txn_1", 100)
        with pytest.raises(DuplicateEffect) as info:
            refund("txn_1", 100)
    assert info.value.state == "committed" and asked == ["refund:txn_1"] and calls == ["txn_1"]
    record = store.get_effect("refund:txn_1")
    assert record.state is EffectState.COMMITTED and record.resolved_by == "reconcile:stripe.refund"
    kinds = types(store)
    assert "RECONCILIATION_STARTED" in kinds and "EFFECT_RESOLVED" in kinds


def test_reconcile_not_executed_retries_once(control, store):
    refund, calls = ambiguous_first(control, store, lambda key: "not_executed")
    with context(agent="a"):
        with pytest.raises(TimeoutError):
            refund("txn_1", 100)
        assert refund("txn_1", 100) == "ok"
    assert calls == ["txn_1", "txn_1"]
    assert store.get_effect("refund:txn_1").attempt == 2
    assert results(store) == ["allow/ambiguous", "allow/committed"]


@pytest.mark.parametrize("answer", ["unknown", "maybe", RuntimeError("remote down")])
def test_reconcile_unknown_keeps_it_ambiguous(control, store, answer):
    def hook(key):
        if isinstance(answer, Exception):
            raise answer
        return answer

    refund, calls = ambiguous_first(control, store, hook)
    with context(agent="a"):
        with pytest.raises(TimeoutError):
            refund("txn_1", 100)
        with pytest.raises(AmbiguousEffect):
            refund("txn_1", 100)
    assert store.get_effect("refund:txn_1").state is EffectState.AMBIGUOUS and calls == ["txn_1"]


def test_reconcile_eagerly(control, store):
    refund, calls = ambiguous_first(control, store, lambda key: "committed", reconcile_eagerly=True)
    with context(agent="a"), pytest.raises(TimeoutError):
        refund("txn_1", 100)
    assert store.get_effect("refund:txn_1").state is EffectState.COMMITTED
    assert results(store) == ["allow/ambiguous"]
    started = [e.data for e in store.events() if e.type == "RECONCILIATION_STARTED"]
    assert started == [{"effect_key": "refund:txn_1", "trigger": "eager"}]


# -- ambient helpers --------------------------------------------------------------------------


def test_idempotency_token_outside_an_executor():
    with pytest.raises(InvalidArgument):
        ctrlrun.idempotency_token()


def test_token_vectors():
    from ctrlrun.effects.records import idempotency_token_for

    assert idempotency_token_for("refund:txn_1", 1) == "382ee448-97da-8107-b674-8c253650d93f"
    assert idempotency_token_for("refund:txn_1", 2) == "28bb40af-814c-8fb6-ba63-e8663b1c036d"


def test_context_validation_and_nesting():
    from ctrlrun.control.ambient import current_hint

    with pytest.raises(InvalidArgument):
        with context(agent=""):
            pass
    with pytest.raises(InvalidArgument):
        with with_approval(""):
            pass
    with context(agent="outer"):
        with context(agent="inner", user="u"):
            assert current_hint() == ("inner", "u")
        assert current_hint() == ("outer", None)
    assert current_hint() is None


def test_identity_provider_decides(store, clock):
    from ctrlrun.identity import StaticIdentityProvider

    control = Control(Policy.from_yaml(POLICY), store, clock=clock, identity=StaticIdentityProvider("svc"))
    refund = make_refund(control, [])
    refund("txn_1", 100)  # no context needed
    assert store.receipts()[0].principal.agent == "svc"


def test_no_human_is_asked_about_an_execution_whose_lease_lapsed(control, store, clock):
    refund = make_refund(control, [])
    store.reserve_effect("refund:txn_3", "act_other", lease=timedelta(seconds=30))
    store.begin_execution("refund:txn_3", "act_other")
    clock.advance(minutes=1)  # the worker died mid-call: its lease lapsed
    with context(agent="a"), pytest.raises(AmbiguousEffect):
        refund("txn_3", 200_000)  # would need approval: the key is judged first
    assert store.pending_approvals() == ()
    assert store.get_effect("refund:txn_3").state == EffectState.AMBIGUOUS  # as the reservation makes it


@pytest.mark.parametrize("state", ["committed", "ambiguous", "in_progress"])
def test_no_human_is_asked_about_a_call_whose_key_cannot_be_reserved(control, store, state):
    refund = make_refund(control, [])
    if state == "committed":
        with context(agent="a"):
            refund("txn_2", 100)
    else:
        store.reserve_effect("refund:txn_2", "act_other")
        store.begin_execution("refund:txn_2", "act_other")
        if state == "ambiguous":
            store.mark_ambiguous("refund:txn_2", "act_other", "lost")
    refused = AmbiguousEffect if state == "ambiguous" else DuplicateEffect
    with context(agent="a"), pytest.raises(refused):
        refund("txn_2", 200_000)  # would need approval: the key is judged first
    assert store.pending_approvals() == ()  # nobody was asked
    assert "APPROVAL_REQUESTED" not in [e.type for e in store.events()]
    last = store.receipts()[-1]
    assert (last.decision, last.result) == ("approve", "blocked")


def test_keyword_arguments_bind_in_the_signature_order_whatever_their_order(control) -> None:
    @protect("ops.delete_row", control=control)
    def delete_row(table: str, row: int, *, dry_run: bool = False) -> None: ...

    protected = delete_row.__ctrlrun__  # type: ignore[attr-defined]
    for given in ({"table": "t", "row": 1, "dry_run": True}, {"dry_run": True, "row": 1, "table": "t"}):
        bound = protected.bind((), dict(given))
        assert list(bound) == ["table", "row", "dry_run"] and bound == given
    assert list(protected.bind((), {"row": 1, "table": "t"})) == ["table", "row", "dry_run"]
