"""Async LangGraph nodes (``graph.ainvoke``) calling an ``async def`` protected function."""

from __future__ import annotations

import asyncio

import pytest
from ctrlrun_langgraph import LangGraphInterrupt
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command

from ctrlrun import ApprovalMismatch, Control, Policy, SQLiteStateStore, context, protect
from ctrlrun.adapter import InterruptApprovalProvider

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


@pytest.fixture
def app(tmp_path):
    store = SQLiteStateStore(tmp_path / "state.db")
    control = Control(
        Policy.from_yaml(POLICY),
        store,
        approvals=InterruptApprovalProvider(store, LangGraphInterrupt(carries_approved_arguments=True)),
    )
    stripe: list[tuple[str, int]] = []

    @protect("stripe.refund", effect="refund:{payment_id}", wait=True, control=control)
    async def issue_refund(payment_id: str, amount: int) -> str:
        await asyncio.sleep(0)
        stripe.append((payment_id, amount))
        return f"re_{payment_id}"

    async def refund_node(state: dict) -> dict:
        with context(agent="refund-agent"):
            return {"status": await issue_refund(payment_id=state["payment_id"], amount=state["amount"])}

    builder = StateGraph(dict)
    builder.add_node("refund", refund_node)
    builder.add_edge(START, "refund")
    builder.add_edge("refund", END)
    graph = builder.compile(checkpointer=InMemorySaver())
    yield graph, store, stripe
    store.close()


def thread(name):
    return {"configurable": {"thread_id": name}}


def test_async_node_pauses_and_resumes(app):
    graph, store, stripe = app

    async def main():
        first = await graph.ainvoke({"payment_id": "txn_2", "amount": 250_000}, thread("t-1"))
        (interrupt,) = first["__interrupt__"]
        shown = interrupt.value
        assert shown["action"] == "stripe.refund"
        assert shown["arguments"] == {"amount": 250_000, "payment_id": "txn_2"}
        resume = {"approved": True, "approver": "ada@example.com", "arguments": shown["arguments"]}
        return await graph.ainvoke(Command(resume=resume), thread("t-1"))

    done = asyncio.run(main())
    assert done["status"] == "re_txn_2" and stripe == [("txn_2", 250_000)]
    (receipt,) = store.receipts()
    assert (receipt.decision, receipt.result, receipt.approver) == ("approve", "committed", "ada@example.com")


def test_async_node_mismatch_runs_nothing(app):
    graph, store, stripe = app

    async def main():
        await graph.ainvoke({"payment_id": "txn_2", "amount": 250_000}, thread("t-1"))
        resume = {"approved": True, "approver": "ada@example.com",
                  "arguments": {"payment_id": "txn_2", "amount": 2_500_000}}  # fmt: skip
        await graph.ainvoke(Command(resume=resume), thread("t-1"))

    with pytest.raises(ApprovalMismatch) as info:
        asyncio.run(main())
    assert info.value.reason == "mismatch" and stripe == [] and store.receipts() == ()
