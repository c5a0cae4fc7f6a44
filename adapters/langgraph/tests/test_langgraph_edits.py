"""Approve with edits through LangGraph: the resume value carries ``edited_arguments``."""

from __future__ import annotations

import pytest
from ctrlrun_langgraph import LangGraphInterrupt
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command

from ctrlrun import ActionDenied, Control, InvalidArgument, Policy, SQLiteStateStore, context, protect
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


def build(tmp_path, *, with_policy=True):
    store = SQLiteStateStore(tmp_path / "state.db")
    policy = Policy.from_yaml(POLICY)
    provider = InterruptApprovalProvider(
        store, LangGraphInterrupt(carries_approved_arguments=True), policy=policy if with_policy else None
    )
    control = Control(policy, store, approvals=provider)
    stripe: list[tuple[str, int]] = []

    @protect("stripe.refund", effect="refund:{payment_id}", wait=True, control=control)
    def issue_refund(payment_id: str, amount: int) -> str:
        stripe.append((payment_id, amount))
        return f"re_{payment_id}_{amount}"

    def refund_node(state: dict) -> dict:
        with context(agent="refund-agent"):
            return {"status": issue_refund(payment_id=state["payment_id"], amount=state["amount"])}

    builder = StateGraph(dict)
    builder.add_node("refund", refund_node)
    builder.add_edge(START, "refund")
    builder.add_edge("refund", END)
    return builder.compile(checkpointer=InMemorySaver()), store, stripe


def thread(name):
    return {"configurable": {"thread_id": name}}


def test_resume_with_edits_runs_the_edited_call_once(tmp_path):
    graph, store, stripe = build(tmp_path)
    first = graph.invoke({"payment_id": "txn_2", "amount": 400_000}, thread("t"))
    shown = first["__interrupt__"][0].value
    resume = {"approved": True, "approver": "ada@example.com", "arguments": shown["arguments"],
              "edited_arguments": {"payment_id": "txn_2", "amount": 40_000 + 100_000}}  # fmt: skip
    done = graph.invoke(Command(resume=resume), thread("t"))
    assert done["status"] == "re_txn_2_140000" and stripe == [("txn_2", 140_000)]
    (receipt,) = store.receipts()
    assert receipt.result == "committed" and receipt.approver == "ada@example.com"
    assert receipt.edited_from == shown["action_hash"] != receipt.action_hash
    assert receipt.edit_diff == {"amount": {"from": 400_000, "to": 140_000}}
    store.close()


def test_an_edit_the_policy_denies_is_refused(tmp_path):
    graph, store, stripe = build(tmp_path)
    first = graph.invoke({"payment_id": "txn_2", "amount": 400_000}, thread("t"))
    shown = first["__interrupt__"][0].value
    resume = {"approved": True, "arguments": shown["arguments"],
              "edited_arguments": {"payment_id": "txn_2", "amount": 9_000_000}}  # fmt: skip
    with pytest.raises(ActionDenied, match="denied by the policy"):
        graph.invoke(Command(resume=resume), thread("t"))
    assert stripe == [] and store.receipts() == ()
    store.close()


def test_edits_need_a_policy_on_the_provider(tmp_path):
    graph, store, stripe = build(tmp_path, with_policy=False)
    first = graph.invoke({"payment_id": "txn_2", "amount": 400_000}, thread("t"))
    shown = first["__interrupt__"][0].value
    resume = {"approved": True, "arguments": shown["arguments"],
              "edited_arguments": {"payment_id": "txn_2", "amount": 100_000}}  # fmt: skip
    with pytest.raises(InvalidArgument, match="policy="):
        graph.invoke(Command(resume=resume), thread("t"))
    assert stripe == []
    store.close()
