"""Native async: one parametrized suite runs the core scenarios for ``def`` and ``async def``."""

from __future__ import annotations

import asyncio
import inspect
import threading
import time

import pytest

import ctrlrun
from ctrlrun import (
    AmbiguousEffect,
    ApprovalMismatch,
    ApprovalRequired,
    Control,
    DuplicateEffect,
    EffectState,
    InMemoryStateStore,
    LocalApprovalProvider,
    NotExecuted,
    Policy,
    ScriptedApprovalProvider,
    SQLiteStateStore,
    context,
    protect,
    with_approval,
)
from ctrlrun.receipt import verify_chain


POLICY = """\
schema: ctrlrun.policy/v2
actions:
  stripe.refund:
    rules:
      - when: { amount_gte: 0, amount_lte: 50000 }
        decision: allow
      - when: { amount_gte: 0, amount_lte: 500000 }
        decision: approve
      - decision: deny
"""


@pytest.fixture(params=["sync", "async"])
def flavour(request):
    return request.param


@pytest.fixture
def clock():
    from ctrlrun.testing import Clock as TestingClock  # what tests/clock.py's Clock is

    return TestingClock()


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


def make_refund(flavour, control, calls, behaviour=None, **options):
    """The same refund as a ``def`` or an ``async def``."""

    def body(payment_id, amount):
        calls.append((payment_id, amount))
        if behaviour is not None:
            behaviour(payment_id, amount)
        return {"id": f"re_{payment_id}"}

    if flavour == "sync":

        @protect("stripe.refund", effect="refund:{payment_id}", control=control, **options)
        def refund(payment_id: str, amount: int) -> dict:
            return body(payment_id, amount)

    else:

        @protect("stripe.refund", effect="refund:{payment_id}", control=control, **options)
        async def refund(payment_id: str, amount: int) -> dict:
            await asyncio.sleep(0)
            return body(payment_id, amount)

    return refund


def invoke(function, *args, **kwargs):
    """Call a protected function the way its caller would: awaited in an event loop if async."""
    if inspect.iscoroutinefunction(function):
        return asyncio.run(function(*args, **kwargs))
    return function(*args, **kwargs)


def results(store):
    return [f"{r.decision}/{r.result}" for r in store.receipts()]


def test_wrapper_shape():
    @protect("x.y")
    async def act(a: int) -> int:
        """Doc."""
        return a

    assert inspect.iscoroutinefunction(act)
    assert act.__name__ == "act" and act.__doc__ == "Doc."
    assert list(inspect.signature(act).parameters) == ["a"]


def test_allow_runs_once_then_duplicate(flavour, control, store):
    calls = []
    refund = make_refund(flavour, control, calls)
    with context(agent="a"):
        assert invoke(refund, "txn_1", 100) == {"id": "re_txn_1"}
        with pytest.raises(DuplicateEffect) as info:
            invoke(refund, "txn_1", 100)
    assert info.value.state == "committed" and calls == [("txn_1", 100)]
    assert results(store) == ["allow/committed", "allow/blocked"]
    assert [e.type.value for e in store.events()][:5] == [
        "ACTION_PROPOSED", "POLICY_EVALUATED", "EFFECT_RESERVED", "EXECUTION_STARTED",
        "EXECUTION_COMMITTED",
    ]  # fmt: skip


def test_approval_mismatch_and_replay(flavour, control, store):
    calls = []
    refund = make_refund(flavour, control, calls)
    with context(agent="a"):
        with pytest.raises(ApprovalRequired) as required:
            invoke(refund, "txn_2", 200_000)
        request_id = required.value.request_id
        store.grant_approval(request_id, "cli:local")
        with with_approval(request_id):
            with pytest.raises(ApprovalMismatch) as mutated:
                invoke(refund, "txn_2", 200_001)
            assert invoke(refund, "txn_2", 200_000) == {"id": "re_txn_2"}
            with pytest.raises(ApprovalMismatch) as replayed:
                invoke(refund, "txn_2", 200_000)
    assert (mutated.value.reason, replayed.value.reason) == ("mismatch", "consumed")
    assert calls == [("txn_2", 200_000)]
    assert results(store) == ["approve/blocked", "approve/committed", "approve/blocked"]
    assert store.receipts()[1].approver == "cli:local"


def test_ambiguous_blocks_retry_and_not_executed_renews(flavour, control, store):
    def lose(payment_id, amount):
        if payment_id == "txn_3":
            raise TimeoutError("reply lost")
        if payment_id == "txn_4" and amount == 1:
            raise NotExecuted("connection refused")

    calls = []
    refund = make_refund(flavour, control, calls, lose)
    with context(agent="a"):
        with pytest.raises(TimeoutError):
            invoke(refund, "txn_3", 100)
        with pytest.raises(AmbiguousEffect):
            invoke(refund, "txn_3", 100)
        with pytest.raises(NotExecuted):
            invoke(refund, "txn_4", 1)
        invoke(refund, "txn_4", 2)
    assert store.get_effect("refund:txn_3").state is EffectState.AMBIGUOUS
    assert store.get_effect("refund:txn_4").attempt == 2
    assert results(store) == ["allow/ambiguous", "allow/blocked", "allow/failed", "allow/committed"]
    assert verify_chain(store).ok


def test_wait_true_with_scripted_approver(flavour, store):
    control = Control(Policy.from_yaml(POLICY), store, ScriptedApprovalProvider(store, ["pending", "grant"]))
    calls = []
    refund = make_refund(flavour, control, calls, wait=True)
    with context(agent="a"):
        assert invoke(refund, "txn_5", 200_000) == {"id": "re_txn_5"}
    assert calls == [("txn_5", 200_000)] and results(store) == ["approve/committed"]


def test_idempotency_token_inside_async_function(control):
    tokens = []

    @protect("stripe.refund", effect="refund:{payment_id}", control=control)
    async def refund(payment_id: str, amount: int) -> str:
        await asyncio.sleep(0)
        tokens.append(ctrlrun.idempotency_token())
        return "ok"

    with context(agent="a"):
        invoke(refund, "txn_1", 1)
    assert tokens == [ctrlrun.effects.records.idempotency_token_for("refund:txn_1", 1)]


def test_context_follows_tasks(control, store):
    @protect("stripe.refund", effect="refund:{payment_id}", control=control)
    async def refund(payment_id: str, amount: int) -> str:
        await asyncio.sleep(0)
        return payment_id

    async def as_agent(agent, payment_id):
        with context(agent=agent):
            return await refund(payment_id, 1)

    async def main():
        return await asyncio.gather(*(as_agent(f"agent-{i}", f"txn_{i}") for i in range(10)))

    assert asyncio.run(main()) == [f"txn_{i}" for i in range(10)]
    agents = {r.effect_key: r.principal.agent for r in store.receipts()}
    assert agents == {f"refund:txn_{i}": f"agent-{i}" for i in range(10)}


class ThreadRecordingStore:
    """Delegates to a store and remembers which threads called it."""

    def __init__(self, inner):
        self._inner = inner
        self.threads: set[int] = set()

    def __getattr__(self, name):
        target = getattr(self._inner, name)
        if not callable(target):
            return target

        def called(*args, **kwargs):
            self.threads.add(threading.get_ident())
            return target(*args, **kwargs)

        return called


def test_200_tasks_50_keys_never_block_the_loop(tmp_path):
    inner = SQLiteStateStore(tmp_path / "state.db")
    store = ThreadRecordingStore(inner)
    control = Control(Policy.from_yaml(POLICY), store)
    executions: dict[str, int] = {}

    @protect("stripe.refund", effect="refund:{payment_id}", control=control)
    async def refund(payment_id: str, amount: int) -> str:
        executions[payment_id] = executions.get(payment_id, 0) + 1
        await asyncio.sleep(0.001)  # the remote call
        return payment_id

    async def main():
        loop_thread = threading.get_ident()
        gaps: list[float] = []
        stop = asyncio.Event()

        async def heartbeat():
            last = time.perf_counter()
            while not stop.is_set():
                await asyncio.sleep(0.001)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        async def agent(i):
            with context(agent=f"agent-{i % 7}"):
                try:
                    return await refund(f"txn_{i % 50}", 100)
                except DuplicateEffect as exc:
                    return exc.state

        beat = asyncio.create_task(heartbeat())
        outcomes = await asyncio.gather(*(agent(i) for i in range(200)))
        stop.set()
        await beat
        return loop_thread, outcomes, gaps

    loop_thread, outcomes, gaps = asyncio.run(main())
    assert executions == {f"txn_{k}": 1 for k in range(50)}
    assert sum(1 for o in outcomes if o.startswith("txn_")) == 50
    assert set(outcomes) - {f"txn_{k}" for k in range(50)} <= {"committed", "in_progress"}
    assert loop_thread not in store.threads  # every store call ran in a worker thread
    print(f"\nheartbeat ticks: {len(gaps)}, longest gap: {max(gaps) * 1000:.1f} ms")
    assert len(inner.receipts()) == 200 and verify_chain(inner).ok
    inner.close()


def test_cancelled_task_leaves_the_effect_ambiguous(control, store):
    started = []

    @protect("stripe.refund", effect="refund:{payment_id}", control=control)
    async def refund(payment_id: str, amount: int) -> str:
        started.append(payment_id)
        await asyncio.Event().wait()  # the remote never answers
        return "never"

    async def main():
        with context(agent="a"):
            task = asyncio.create_task(refund("txn_1", 100))
            while not started:
                await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            with pytest.raises(AmbiguousEffect):
                await refund("txn_1", 100)
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.01):
                    await refund("txn_2", 100)

    asyncio.run(main())
    assert store.get_effect("refund:txn_1").state is EffectState.AMBIGUOUS
    assert store.get_effect("refund:txn_2").state is EffectState.AMBIGUOUS
    assert store.receipts()[0].error.startswith("CancelledError")
    assert results(store) == ["allow/ambiguous", "allow/blocked", "allow/ambiguous"]


def test_wait_true_does_not_block_the_loop(store):
    answered = threading.Event()
    provider = LocalApprovalProvider(store, sleep=lambda seconds: answered.wait(10))
    control = Control(Policy.from_yaml(POLICY), store, provider)
    calls = []
    refund = make_refund("async", control, calls, wait=True)

    async def human():
        while not store.pending_approvals():
            await asyncio.sleep(0)
        (pending,) = store.pending_approvals()
        store.grant_approval(pending.approval_id, "cli:local")
        answered.set()

    async def main():
        with context(agent="a"):
            return await asyncio.gather(refund("txn_6", 200_000), human())

    assert asyncio.run(main())[0] == {"id": "re_txn_6"}
    assert calls == [("txn_6", 200_000)] and results(store) == ["approve/committed"]
