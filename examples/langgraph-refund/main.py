"""A LangGraph refund agent whose large refunds pause for a human, through ctrlrun.

    python main.py            # the human approves the EUR 2,500 refund
    python main.py --deny     # the human refuses it

State lives in .ctrlrun/state.db; delete that directory to start over.
"""

from __future__ import annotations

import argparse


def parse_arguments() -> argparse.Namespace:
    """The command line, read before anything runs: ``--help`` shows what this does, and an
    option it does not take is refused (exit 2) instead of being ignored."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--deny", action="store_true",
                        help="ada@example.com refuses the EUR 2,500 refund")
    return parser.parse_args()


if __name__ == "__main__":  # first: --help needs no framework installed, and opens no store
    ARGUMENTS = parse_arguments()

from ctrlrun_langgraph import LangGraphInterrupt
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command

from ctrlrun import (
    ActionDenied,
    Control,
    DuplicateEffect,
    Policy,
    SQLiteStateStore,
    context,
    protect,
)
from ctrlrun.adapter import InterruptApprovalProvider

store = SQLiteStateStore(".ctrlrun/state.db")
control = Control(Policy.from_file("ctrlrun.yaml"), store,
    approvals=InterruptApprovalProvider(store, LangGraphInterrupt(carries_approved_arguments=True)))

stripe_calls: list[str] = []  # what the (fake) payment provider was asked to do


@protect("stripe.refund", effect="refund:{payment_id}", wait=True, control=control)
def issue_refund(payment_id: str, amount: int) -> str:
    stripe_calls.append(payment_id)
    return f"re_{payment_id}"


def refund_node(state: dict) -> dict:
    with context(agent="refund-agent"):
        return {"status": issue_refund(payment_id=state["payment_id"], amount=state["amount"])}


builder = StateGraph(dict)
builder.add_node("refund", refund_node)
builder.add_edge(START, "refund")
builder.add_edge("refund", END)
graph = builder.compile(checkpointer=InMemorySaver())


def refund(thread: str, payment_id: str, amount: int, approve: bool) -> None:
    config = {"configurable": {"thread_id": thread}}
    try:
        state = graph.invoke({"payment_id": payment_id, "amount": amount}, config)
        if "__interrupt__" in state:
            shown = state["__interrupt__"][0].value  # what the console shows the human
            print(f"{payment_id}: paused for approval of {shown['action']} {shown['arguments']}")
            print(f"{payment_id}: request {shown['request_id']} bound to {shown['action_hash'][:19]}...")
            answer = {"approved": approve, "approver": "ada@example.com"}
            if approve:
                answer["arguments"] = shown["arguments"]  # the arguments the human saw
            print(f"{payment_id}: ada@example.com {'approves' if approve else 'refuses'}")
            state = graph.invoke(Command(resume=answer), config)
        print(f"{payment_id}: refunded ({state['status']})")
    except ActionDenied as refused:
        print(f"{payment_id}: refused ({refused.reason})")
    except DuplicateEffect as duplicate:
        print(f"{payment_id}: not run again ({duplicate.state})")


if __name__ == "__main__":
    approve = not ARGUMENTS.deny
    refund("small", "txn_1", 40_000, approve)       # EUR 400: allowed, no human
    refund("large", "txn_2", 250_000, approve)      # EUR 2,500: a human decides
    refund("retry", "txn_2", 250_000, approve)      # the agent tries the same refund again
    print(f"stripe was called for: {', '.join(stripe_calls) or 'nothing'}")
    for receipt in store.receipts():
        print(f"receipt {receipt.action} {receipt.arguments['payment_id']}: "
              f"{receipt.decision}/{receipt.result} approver={receipt.approver}")
