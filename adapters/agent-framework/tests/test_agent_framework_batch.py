"""``MiddlewareFailure`` cancels the batch: what ctrlrun records for a sibling."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from af_support import POLICY, Fake, call
from agent_framework import Agent, MiddlewareFailure, tool
from ctrlrun_agent_framework import AgentFrameworkInterrupt, ApprovalMiddleware, unwrap

from ctrlrun import ActionDenied, Control, InterruptApprovalProvider, Policy, protect
from ctrlrun.identity import StaticIdentityProvider


def app(store: Any, calls: list[tuple[str, str, str]], *, concurrent: bool) -> tuple[Agent[Any], list[str]]:
    client = Fake(calls, function_invocation_configuration={"allow_concurrent_invocation": concurrent})
    control = Control(Policy.from_yaml(POLICY), store,
                      InterruptApprovalProvider(store, AgentFrameworkInterrupt(client)),
                      identity=StaticIdentityProvider("refund-agent"), environment="dev")  # fmt: skip
    log: list[str] = []
    started = asyncio.Event()  # the async sibling's body is running
    never = asyncio.Event()  # ... and would go on until this is set (it is not)

    @protect("stripe.refund", effect="refund:{payment_id}", wait=True, control=control)
    async def slow_refund(payment_id: str, amount: int) -> str:
        log.append(f"started {payment_id}")
        started.set()
        await never.wait()
        log.append(f"finished {payment_id}")
        return f"re_{payment_id}"

    @protect("stripe.refund", effect="refund:{payment_id}", wait=True, control=control)
    async def issue_refund(payment_id: str, amount: int) -> str:
        log.append(f"ran {payment_id}")
        return f"re_{payment_id}"

    @tool(approval_mode="never_require")
    async def slow(payment_id: str, amount: int) -> str:
        """An async refund that takes its time."""
        return await slow_refund(payment_id=payment_id, amount=amount)

    @tool(approval_mode="never_require")
    async def refund(payment_id: str, amount: int) -> str:
        """A refund, called once the slow one is under way when calls run concurrently."""
        if concurrent:
            await started.wait()
        return await issue_refund(payment_id=payment_id, amount=amount)

    agent = Agent(client=client, name="refunds", tools=[slow, refund], middleware=[ApprovalMiddleware()])
    return agent, log


SLOW = ("call_1", "slow", json.dumps({"payment_id": "txn_1", "amount": 100}))
DENIED = call("call_2", "txn_9", 9_000_000)


def run_failing(agent: Agent[Any]) -> BaseException:
    async def main() -> None:  # a guard against a hang, not a timing assumption
        await asyncio.wait_for(agent.run("refund both", session=agent.create_session()), timeout=60)

    with pytest.raises(MiddlewareFailure) as excinfo:
        asyncio.run(main())
    return unwrap(excinfo.value)


def test_concurrent_a_failure_cancels_an_async_sibling_mid_execution(store):
    agent, log = app(store, [SLOW, DENIED], concurrent=True)
    assert isinstance(run_failing(agent), ActionDenied)
    assert log == ["started txn_1"]  # cut off mid-execution
    results = {r.arguments["payment_id"]: r.result for r in store.receipts()}
    assert results == {"txn_9": "denied", "txn_1": "ambiguous"}  # observed
    assert str(store.get_effect("refund:txn_1").state) == "ambiguous"


def test_sequential_no_call_starts_after_a_failure(store):
    agent, log = app(store, [DENIED, SLOW], concurrent=False)
    assert isinstance(run_failing(agent), ActionDenied)
    assert log == []  # the slow refund never started
    assert [(r.arguments["payment_id"], r.result) for r in store.receipts()] == [("txn_9", "denied")]
    assert store.get_effect("refund:txn_1") is None
