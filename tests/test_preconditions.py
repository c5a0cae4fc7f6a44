"""Preconditions: the state a human approved is fingerprinted when the request is made and
rechecked strictly before the approval is spent; only fingerprints are ever stored."""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from datetime import timedelta
from typing import Any

import pytest

import ctrlrun
from ctrlrun import (
    ActionDenied,
    ApprovalMismatch,
    ApprovalRequired,
    ApprovalStatus,
    Control,
    InvalidArgument,
    JSONLEventSink,
    LocalApprovalProvider,
    NotExecuted,
    Policy,
    ScriptedApprovalProvider,
    context,
    protect,
    with_approval,
)
from ctrlrun.control.preconditions import fingerprint
from ctrlrun.approvals.records import build_request

from .conftest import STORE_FACTORIES, pg_schema_for, postgres_url
from .policies import REFUND_POLICY
from .test_store_conformance import make_action

VECTOR = "sha256:3ed5cc6e71e10f099156d6f54a8eb967c9e359e7c7007ac766a00f1e6848e4fd"
MARKER = "zq-precondition-marker-7f3e91"


class World:
    """A provider over a mutable state; it records every call (and what the store held then)."""

    def __init__(self, store: Any = None, **state: Any) -> None:
        self.store = store
        self.state: Any = dict(state)
        self.calls: list[dict[str, Any]] = []
        self.requests_seen: list[int] = []
        self.raises: BaseException | None = None

    def __call__(self, action: ctrlrun.Action) -> Any:
        self.calls.append(action.canonical_arguments)
        if self.store is not None:
            self.requests_seen.append(len(self.store.approvals_for(action.action_hash)))
        if self.raises is not None:
            raise self.raises
        return self.state


def make_refund(control: Control, runs: list[Any], world: Any = None, **options: Any) -> Any:
    @protect("stripe.refund", control=control, preconditions=world, **options)
    def refund(payment_id: str, amount: int) -> str:
        runs.append((payment_id, amount))
        return f"re_{payment_id}"

    return refund


def ask(refund: Any, amount: int = 200_000, payment_id: str = "txn_2") -> str:
    with context(agent="support-agent"), pytest.raises(ApprovalRequired) as asked:
        refund(payment_id=payment_id, amount=amount)
    return asked.value.request_id


def present(refund: Any, request_id: str, amount: int = 200_000, payment_id: str = "txn_2") -> Any:
    with context(agent="support-agent"), with_approval(request_id):
        return refund(payment_id=payment_id, amount=amount)


def events_of(store: Any, type_: str) -> list[Any]:
    return [e for e in store.events() if e.type == type_]


@pytest.fixture
def control(store, clock):
    return Control(Policy.from_yaml(REFUND_POLICY), store, clock=clock)


# --------------------------------------------------------------------------- the fingerprint


def test_the_fingerprint_vector():
    assert fingerprint({"balance": 0, "active": False}) == VECTOR
    assert fingerprint({"active": False, "balance": 0}) == VECTOR  # key order is not state
    assert fingerprint({"balance": 1, "active": False}) != VECTOR
    for refused in ([("balance", 0)], None, "balance", {"balance": 0.5}, {1: "x"}):
        with pytest.raises(InvalidArgument):
            fingerprint(refused)


# --------------------------------------------------------------------------- when it applies


def test_allow_and_deny_never_call_the_provider(control, store):
    world, runs = World(balance=100), []
    refund = make_refund(control, runs, world)
    with context(agent="support-agent"):
        assert refund(payment_id="txn_1", amount=100) == "re_txn_1"  # allow: the straight path
        with pytest.raises(ActionDenied):
            refund(payment_id="txn_3", amount=900_000)  # deny
    action = ctrlrun.Action("stripe.refund", {"payment_id": "txn_4", "amount": 5}, ctrlrun.Principal("a"))
    assert control.execute(action, lambda: "ok", "refund:txn_4", preconditions=world).result == "committed"
    assert world.calls == [] and runs == [("txn_1", 100)]
    assert [r.precondition_at_request for r in store.receipts()] == [None, None, None]


def test_preconditions_must_be_callable(control):
    action = ctrlrun.Action("stripe.refund", {"payment_id": "t", "amount": 5}, ctrlrun.Principal("a"))
    with pytest.raises(InvalidArgument, match="preconditions= for action 'stripe.refund' must be callable"):
        control.execute(action, lambda: None, "refund:t", preconditions={"balance": 0})
    with pytest.raises(InvalidArgument, match="preconditions= must be callable"):
        protect("stripe.refund", preconditions="balance")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the request pass


def test_the_request_stores_the_fingerprint_taken_before_it_exists(control, store):
    world, runs = World(store, balance=0, active=False), []
    refund = make_refund(control, runs, world)
    request_id = ask(refund)
    assert world.requests_seen == [0]  # called before the request was stored
    record = store.get_approval(request_id)
    assert record.request.precondition_fingerprint == VECTOR
    assert store.receipts() == ()  # waiting for a human writes no receipt


@pytest.mark.parametrize(
    "answer, error",
    [
        (ValueError("down"), "ValueError"),
        (["balance", 0], "InvalidArgument"),
        ({"balance": 0.5}, "InvalidArgument"),
        ({7: "x"}, "InvalidArgument"),
    ],
)
def test_a_provider_that_fails_on_the_request_pass_denies_and_asks_nobody(control, store, answer, error):
    world, runs = World(), []
    if isinstance(answer, BaseException):
        world.raises = answer
    else:
        world.state = answer
    refund = make_refund(control, runs, world)
    with context(agent="support-agent"), pytest.raises(ActionDenied) as refused:
        refund(payment_id="txn_2", amount=200_000)
    assert refused.value.reason == "precondition_unavailable" and refused.value.action_id
    assert runs == [] and store.pending_approvals() == () and store.list_effects() == ()
    assert [e.type for e in store.events()] == ["ACTION_PROPOSED", "POLICY_EVALUATED", "ACTION_DENIED"]
    assert events_of(store, "ACTION_DENIED")[0].data == {"reason": "precondition_unavailable", "error": error}
    (receipt,) = store.receipts()
    assert (receipt.decision, receipt.decision_reason, receipt.result) == ("approve", "rule[1]", "denied")
    assert error in receipt.error and "precondition_unavailable" in receipt.error


def test_a_base_exception_on_the_request_pass_propagates_and_records_nothing(control, store):
    world, runs = World(), []
    world.raises = KeyboardInterrupt()
    refund = make_refund(control, runs, world)
    with context(agent="support-agent"), pytest.raises(KeyboardInterrupt):
        refund(payment_id="txn_2", amount=200_000)
    assert store.pending_approvals() == () and store.receipts() == () and store.list_effects() == ()


# --------------------------------------------------------------------------- the presenting pass


def test_the_same_state_spends_the_approval_and_the_receipt_carries_both_hashes(control, store):
    world, runs = World(balance=0, active=False), []
    refund = make_refund(control, runs, world)
    request_id = ask(refund)
    store.grant_approval(request_id, "cli:local")
    assert present(refund, request_id) == "re_txn_2"
    assert runs == [("txn_2", 200_000)] and len(world.calls) == 2
    assert store.get_approval(request_id).status is ApprovalStatus.CONSUMED
    (consumed,) = events_of(store, "APPROVAL_CONSUMED")
    assert consumed.data == {"approver": "cli:local", "precondition_at_request": VECTOR,
                             "precondition_at_recheck": VECTOR}  # fmt: skip
    (receipt,) = store.receipts()
    assert (receipt.decision, receipt.result) == ("approve", "committed")
    assert (receipt.precondition_at_request, receipt.precondition_at_recheck) == (VECTOR, VECTOR)
    document = json.loads(receipt.to_json())
    assert document["precondition_at_request"] == document["precondition_at_recheck"] == VECTOR


def test_the_recheck_runs_before_the_store_spends_anything(control, store):
    seen: list[Any] = []

    def provider(action: ctrlrun.Action) -> dict[str, int]:
        (record,) = store.approvals_for(action.action_hash) or (None,)
        seen.append((record and record.status.value, store.get_effect("refund:txn_2"), store.receipts()))
        return {"balance": 0}

    refund = make_refund(control, [], provider)
    request_id = ask(refund)
    store.grant_approval(request_id, "cli:local")
    present(refund, request_id)
    assert seen == [(None, None, ()), ("granted", None, ())]


def test_a_changed_state_refuses_and_leaves_the_approval_granted(control, store):
    world, runs = World(balance=0, active=False), []
    refund = make_refund(control, runs, world)
    request_id = ask(refund)
    store.grant_approval(request_id, "cli:local")
    world.state = {"balance": 25, "active": False}
    with pytest.raises(ApprovalMismatch) as refused:
        present(refund, request_id)
    assert refused.value.reason == "precondition_changed" and refused.value.approval_id == request_id
    assert runs == [] and store.list_effects() == ()  # nothing reserved
    assert store.get_approval(request_id).status is ApprovalStatus.GRANTED
    (invalidated,) = events_of(store, "APPROVAL_INVALIDATED")
    changed = fingerprint(world.state)
    assert invalidated.data == {
        "reason": "precondition_changed", "action_hash": store.get_approval(request_id).action_hash,
        "precondition_at_request": VECTOR, "precondition_at_recheck": changed,
    }  # fmt: skip
    assert events_of(store, "APPROVAL_CONSUMED") == [] and events_of(store, "EFFECT_RESERVED") == []
    (blocked,) = store.receipts()
    assert (blocked.decision, blocked.decision_reason, blocked.result) == ("approve", "rule[1]", "blocked")
    assert (blocked.precondition_at_request, blocked.precondition_at_recheck) == (VECTOR, changed)
    assert blocked.approval_id == request_id and blocked.approver == "cli:local"
    assert "precondition_changed" in blocked.error

    world.state = {"active": False, "balance": 0}  # the world is back as the human saw it
    assert present(refund, request_id) == "re_txn_2"
    assert runs == [("txn_2", 200_000)]
    assert [r.result for r in store.receipts()] == ["blocked", "committed"]


def test_one_side_missing_refuses(control, store, clock):
    runs: list[Any] = []
    world = World(balance=0)
    with_provider = make_refund(control, runs, world)
    without = make_refund(control, runs)

    stored = ask(with_provider, payment_id="txn_a")
    store.grant_approval(stored, "cli:local")
    with pytest.raises(ApprovalMismatch) as no_provider:
        present(without, stored, payment_id="txn_a")
    assert no_provider.value.reason == "precondition_missing"

    unstored = ask(without, payment_id="txn_b")
    store.grant_approval(unstored, "cli:local")
    called = len(world.calls)
    with pytest.raises(ApprovalMismatch) as none_stored:
        present(with_provider, unstored, payment_id="txn_b")
    assert none_stored.value.reason == "precondition_missing"
    assert len(world.calls) == called  # nothing to compare with: the provider is not asked

    assert runs == [] and store.list_effects() == ()
    for request_id in (stored, unstored):
        assert store.get_approval(request_id).status is ApprovalStatus.GRANTED
    first, second = (e.data for e in events_of(store, "APPROVAL_INVALIDATED"))
    assert (first["precondition_at_request"], first["precondition_at_recheck"]) == (fingerprint({"balance": 0}), None)
    assert (second["precondition_at_request"], second["precondition_at_recheck"]) == (None, None)
    assert "error" not in first and "error" not in second
    assert [r.result for r in store.receipts()] == ["blocked", "blocked"]


@pytest.mark.parametrize(
    "answer, error",
    [(RuntimeError("gone"), "RuntimeError"), (None, "InvalidArgument"), ({"b": 1.5}, "InvalidArgument")],
)
def test_a_provider_that_fails_on_the_recheck_refuses(control, store, answer, error):
    world, runs = World(balance=0), []
    refund = make_refund(control, runs, world)
    request_id = ask(refund)
    store.grant_approval(request_id, "cli:local")
    if isinstance(answer, BaseException):
        world.raises = answer
    else:
        world.state = answer
    with pytest.raises(ApprovalMismatch) as refused:
        present(refund, request_id)
    assert refused.value.reason == "precondition_unavailable"
    assert runs == [] and store.list_effects() == ()
    assert store.get_approval(request_id).status is ApprovalStatus.GRANTED
    (invalidated,) = events_of(store, "APPROVAL_INVALIDATED")
    assert invalidated.data["error"] == error
    assert invalidated.data["precondition_at_request"] == fingerprint({"balance": 0})
    assert invalidated.data["precondition_at_recheck"] is None
    (blocked,) = store.receipts()
    assert blocked.result == "blocked" and error in blocked.error
    assert (blocked.precondition_at_request, blocked.precondition_at_recheck) == (fingerprint({"balance": 0}), None)


def test_a_base_exception_on_the_recheck_propagates_with_nothing_reserved(control, store):
    world, runs = World(balance=0), []
    refund = make_refund(control, runs, world)
    request_id = ask(refund)
    store.grant_approval(request_id, "cli:local")
    world.raises = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt):
        present(refund, request_id)
    assert runs == [] and store.list_effects() == () and store.receipts() == ()
    assert store.get_approval(request_id).status is ApprovalStatus.GRANTED


@pytest.mark.parametrize("status", ["pending", "denied", "consumed", "expired", "mismatch", "unknown"])
def test_the_ordinary_refusals_come_first_and_the_provider_is_not_asked(control, store, clock, status):
    world, runs = World(balance=0), []
    refund = make_refund(control, runs, world)
    request_id = ask(refund)
    amount = 200_000
    if status in ("denied",):
        store.deny_approval(request_id, "cli:local")
    elif status != "pending":
        store.grant_approval(request_id, "cli:local")
    if status == "consumed":
        present(refund, request_id)
        runs.clear()
    elif status == "expired":
        clock.advance(minutes=16)
    elif status == "mismatch":
        amount = 200_001
    elif status == "unknown":
        request_id = "apr_" + "0" * 32
    asked = len(world.calls)
    with pytest.raises((ApprovalMismatch, ActionDenied)) as refused:
        present(refund, request_id, amount=amount)
    expected = "approval_denied" if status == "denied" else status
    assert refused.value.reason == expected
    assert len(world.calls) == asked and runs == []
    last = store.receipts()[-1]
    assert last.precondition_at_request is None and last.precondition_at_recheck is None
    for event in events_of(store, "APPROVAL_INVALIDATED"):
        assert set(event.data) == {"reason", "action_hash"}
    if status == "expired":
        assert store.get_approval(request_id).status is ApprovalStatus.EXPIRED  # as before


def test_without_preconditions_nothing_changes(control, store):
    runs: list[Any] = []
    refund = make_refund(control, runs)
    request_id = ask(refund)
    assert store.get_approval(request_id).request.precondition_fingerprint is None
    store.grant_approval(request_id, "cli:local")
    present(refund, request_id)
    (consumed,) = events_of(store, "APPROVAL_CONSUMED")
    assert consumed.data == {"approver": "cli:local"}
    (receipt,) = store.receipts()
    assert receipt.precondition_at_request is None and receipt.precondition_at_recheck is None


def test_the_state_is_rechecked_again_before_a_second_reservation(control, store):
    """An ambiguous key and a hook that says the effect never happened: before the store is asked
    again the state is fetched again, and here the hook's own work changed it."""
    world, runs = World(balance=0), []
    remote = {"hang_up": False, "hook_changes_state": False}

    def hook(key: str) -> str:
        if remote["hook_changes_state"]:
            world.state = {"balance": 40}
        return "not_executed"

    @protect("stripe.refund", control=control, preconditions=world, reconcile=hook)
    def refund(payment_id: str, amount: int) -> str:
        if remote["hang_up"]:
            raise RuntimeError("the remote hung up")
        runs.append(payment_id)
        return "ok"

    request_id = ask(refund)  # asked while the key was free
    store.grant_approval(request_id, "cli:local")
    remote["hang_up"] = True
    with context(agent="support-agent"), pytest.raises(RuntimeError):
        refund(payment_id="txn_2", amount=100)  # allowed meanwhile; it ends ambiguous
    remote["hang_up"], remote["hook_changes_state"] = False, True
    with pytest.raises(ApprovalMismatch) as refused:
        present(refund, request_id)
    assert refused.value.reason == "precondition_changed"
    assert len(world.calls) == 3  # the request, the first recheck, the one after the hook
    assert store.get_approval(request_id).status is ApprovalStatus.GRANTED
    record = store.get_effect("refund:txn_2")
    assert (record.state, record.attempt, runs) == ("failed", 1, [])  # resolved, not renewed
    types = [e.type for e in store.events()][-4:]
    assert types == ["RECONCILIATION_STARTED", "RECONCILIATION_RESOLVED", "EFFECT_RESOLVED",
                     "APPROVAL_INVALIDATED"]  # fmt: skip

    world.state = {"balance": 0}
    assert present(refund, request_id) == "ok" and runs == ["txn_2"]
    assert store.get_effect("refund:txn_2").attempt == 2


def test_wait_true_fetches_at_the_request_and_again_before_spending(store, clock):
    world, runs = World(balance=0), []
    control = Control(Policy.from_yaml(REFUND_POLICY), store,
                      ScriptedApprovalProvider(store, ["grant"], clock=clock), clock=clock)  # fmt: skip
    refund = make_refund(control, runs, world, wait=True)
    with context(agent="support-agent"):
        assert refund(payment_id="txn_2", amount=200_000) == "re_txn_2"
    assert len(world.calls) == 2
    (receipt,) = store.receipts()
    assert receipt.precondition_at_request == receipt.precondition_at_recheck == fingerprint({"balance": 0})


def test_async_functions_recheck_the_same_way(control, store):
    world, runs = World(balance=0), []

    @protect("stripe.refund", control=control, preconditions=world)
    async def refund(payment_id: str, amount: int) -> str:
        runs.append(payment_id)
        return "ok"

    async def scenario() -> None:
        with context(agent="support-agent"):
            with pytest.raises(ApprovalRequired) as asked:
                await refund(payment_id="txn_2", amount=200_000)
            request_id = asked.value.request_id
            store.grant_approval(request_id, "cli:local")
            world.state = {"balance": 1}
            with with_approval(request_id), pytest.raises(ApprovalMismatch) as refused:
                await refund(payment_id="txn_2", amount=200_000)
            assert refused.value.reason == "precondition_changed"
            world.state = {"balance": 0}
            with with_approval(request_id):
                assert await refund(payment_id="txn_2", amount=200_000) == "ok"

    asyncio.run(scenario())
    assert runs == ["txn_2"] and len(world.calls) == 3


def test_a_failed_attempt_under_an_approval_records_the_hashes(control, store):
    world, runs = World(balance=0), []

    @protect("stripe.refund", control=control, preconditions=world)
    def refund(payment_id: str, amount: int) -> str:
        raise NotExecuted("card declined")

    request_id = ask(refund)
    store.grant_approval(request_id, "cli:local")
    with pytest.raises(NotExecuted):
        present(refund, request_id)
    (receipt,) = store.receipts()
    assert receipt.result == "failed" and receipt.precondition_at_recheck == fingerprint({"balance": 0})


# --------------------------------------------------------------------------- providers and stores


def test_an_approval_provider_without_the_keyword_still_serves_calls_without_preconditions(store, clock):
    class OldProvider:
        def __init__(self) -> None:
            self.inner = LocalApprovalProvider(store, clock=clock)

        def request(self, action, ttl, *, policy_hash=None):
            return self.inner.request(action, ttl, policy_hash=policy_hash)

        def wait(self, request_id, timeout):
            return self.inner.wait(request_id, timeout)

    control = Control(Policy.from_yaml(REFUND_POLICY), store, OldProvider(), clock=clock)
    request_id = ask(make_refund(control, []))
    assert store.get_approval(request_id).request.precondition_fingerprint is None


def test_every_provider_stores_the_fingerprint_it_is_given(store, clock):
    from ctrlrun.adapter import InterruptApprovalProvider

    class Interrupt:
        framework = "test"
        carries_approved_arguments = False

        def interrupt(self, pending):  # pragma: no cover - never asked here
            raise AssertionError

    providers = [
        LocalApprovalProvider(store, clock=clock),
        ScriptedApprovalProvider(store, [], clock=clock),
        InterruptApprovalProvider(store, Interrupt(), clock=clock),
    ]
    for number, provider in enumerate(providers):
        action = make_action(amount=number)
        stored = provider.request(action, timedelta(minutes=5), precondition_fingerprint=VECTOR)
        assert stored.precondition_fingerprint == VECTOR
        assert store.get_approval(stored.request_id).request.precondition_fingerprint == VECTOR
        plain = provider.request(action, timedelta(minutes=5))
        assert store.get_approval(plain.request_id).request.precondition_fingerprint is None


def test_a_durable_store_keeps_the_fingerprint_across_a_reopen(durable_kind, tmp_path, clock):
    store = STORE_FACTORIES[durable_kind](tmp_path, clock)
    request = build_request(make_action(), timedelta(minutes=5), clock(), precondition_fingerprint=VECTOR)
    store.put_approval_request(request)
    store.close()
    again = STORE_FACTORIES[durable_kind](tmp_path, clock)
    try:
        assert again.get_approval(request.request_id).request.precondition_fingerprint == VECTOR
    finally:
        again.close()


# --------------------------------------------------------------------------- never stored


def _every_stored_text(kind: str, store: Any, tmp_path: Any) -> str:
    """Every cell of every table of the store, as one text."""
    if kind == "sqlite":
        conn = sqlite3.connect(tmp_path / "state.db")
        try:
            tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            assert "approvals" in tables and "events" in tables and "receipts" in tables
            return "\n".join(repr(row) for t in tables for row in conn.execute(f'SELECT * FROM "{t}"'))
        finally:
            conn.close()
    import psycopg

    schema = pg_schema_for(tmp_path)
    with psycopg.connect(postgres_url()) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,))]  # fmt: skip
        assert "approvals" in tables and "events" in tables and "receipts" in tables
        return "\n".join(
            repr(row) for t in tables for row in conn.execute(f'SELECT * FROM "{schema}"."{t}"')
        )


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_neither_the_state_nor_an_exception_message_is_ever_stored_or_logged(kind, tmp_path, clock, caplog):
    store = STORE_FACTORIES[kind](tmp_path, clock)
    sinks = tmp_path / "evidence"
    control = Control(Policy.from_yaml(REFUND_POLICY), store, clock=clock, sinks=[JSONLEventSink(sinks)])
    world, runs = World(note=MARKER, nested={"list": [MARKER]}), []
    refund = make_refund(control, runs, world)
    caplog.set_level(logging.DEBUG)
    try:
        request_id = ask(refund)
        store.grant_approval(request_id, "cli:local")
        world.state = {"note": MARKER + "-changed"}
        with pytest.raises(ApprovalMismatch):
            present(refund, request_id)  # precondition_changed
        world.raises = ValueError(f"cannot read the balance: {MARKER}")
        with pytest.raises(ApprovalMismatch):
            present(refund, request_id)  # precondition_unavailable
        world.state = {MARKER: 1.5}  # canonicalization's own message would name the key
        world.raises = None
        with pytest.raises(ApprovalMismatch) as uncanonical:
            present(refund, request_id)  # unavailable: uncanonicalizable
        world.raises = RuntimeError(MARKER)
        with context(agent="support-agent"), pytest.raises(ActionDenied) as denied:
            refund(payment_id="txn_9", amount=200_000)  # the request pass fails
        for refusal in (uncanonical.value, denied.value):
            assert MARKER not in str(refusal) and refusal.__cause__ is None
        world.raises = None
        world.state = {"note": MARKER, "nested": {"list": [MARKER]}}
        assert present(refund, request_id) == "re_txn_2"
        stored = _every_stored_text(kind, store, tmp_path)
    finally:
        store.close()
    assert fingerprint(world.state) in stored  # the hash is there
    assert "ValueError" in stored and "RuntimeError" in stored  # the type names are
    assert MARKER not in stored
    for name in ("events.jsonl", "receipts.jsonl"):
        text = (sinks / name).read_text(encoding="utf-8")
        assert text and MARKER not in text
    assert MARKER not in caplog.text and all(MARKER not in r.getMessage() for r in caplog.records)
