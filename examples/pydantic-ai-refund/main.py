"""A Pydantic AI refund agent whose large refunds pause for a human, through ctrlrun.

    python main.py            # ada@example.com approves the EUR 2,500 refund
    python main.py --deny     # ada@example.com refuses it

Runs offline: a FunctionModel stands in for the LLM; Pydantic AI's deferred tools are real.
State lives in .ctrlrun/state.db, so a second run refunds nothing again; delete that directory to
start over.
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

import json

from ctrlrun_pydantic_ai import ApprovalScope, PydanticAIInterrupt
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults, ToolDenied

from ctrlrun import ActionDenied, Control, DuplicateEffect, Policy, SQLiteStateStore, context, protect
from ctrlrun.adapter import InterruptApprovalProvider

store = SQLiteStateStore(".ctrlrun/state.db")
control = Control(Policy.from_file("ctrlrun.yaml"), store,
    approvals=InterruptApprovalProvider(store, PydanticAIInterrupt(carries_approved_arguments=True)))

stripe_calls: list[str] = []  # what the (fake) payment provider was asked to do


@protect("stripe.refund", effect="refund:{payment_id}", wait=True, control=control)
def issue_refund(payment_id: str, amount: int) -> str:
    stripe_calls.append(payment_id)
    return f"re_{payment_id}"


def scripted_llm(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Turn 1 asks for the refund the user named; once the tool answered, it reports back."""
    for part in messages[-1].parts:
        if part.part_kind == "tool-return":
            return ModelResponse(parts=[TextPart(f"done: {part.content}")])
    prompt = messages[0].parts[-1].content  # "refund <payment_id> <amount in cents>"
    _, payment_id, amount = str(prompt).split()
    arguments = json.dumps({"payment_id": payment_id, "amount": int(amount)})
    return ModelResponse(parts=[ToolCallPart("refund", arguments, tool_call_id=f"call_{payment_id}")])


agent = Agent(FunctionModel(scripted_llm), output_type=[str, DeferredToolRequests],
              capabilities=[ApprovalScope()])


@agent.tool_plain
def refund(payment_id: str, amount: int) -> str:
    """Refund a payment. The amount is in integer cents."""
    with context(agent="refund-agent"):
        return issue_refund(payment_id=payment_id, amount=amount)


def ask_ada(payment_id: str, paused: DeferredToolRequests, approve: bool) -> DeferredToolResults:
    """The approvals console: show each paused call, send back ada's answer with what she saw."""
    answers = DeferredToolResults()
    for call in paused.approvals:
        shown = paused.metadata[call.tool_call_id]["ctrlrun"]  # ctrlrun's PendingApproval
        print(f"{payment_id}: paused for approval of {shown['action']} {json.dumps(shown['arguments'])}")
        print(f"{payment_id}: request {shown['request_id']} bound to {shown['action_hash'][:19]}...")
        if approve:
            answers.approvals[call.tool_call_id] = True
            answers.metadata[call.tool_call_id] = {
                "ctrlrun": {"approver": "ada@example.com", "arguments": shown["arguments"]}}
        else:
            answers.approvals[call.tool_call_id] = ToolDenied("ada@example.com refused this refund")
        print(f"{payment_id}: ada@example.com {'approves' if approve else 'refuses'}")
    return answers


def conversation(payment_id: str, amount: int, approve: bool) -> None:
    try:
        result = agent.run_sync(f"refund {payment_id} {amount}")
        if isinstance(result.output, DeferredToolRequests):
            answers = ask_ada(payment_id, result.output, approve)
            result = agent.run_sync(message_history=result.all_messages(),
                                    deferred_tool_results=answers)
        print(f"{payment_id}: agent says {result.output!r}")
    except ActionDenied as refused:
        print(f"{payment_id}: refused ({refused.reason})")
    except DuplicateEffect as duplicate:
        print(f"{payment_id}: not run again ({duplicate.state})")


if __name__ == "__main__":
    approve = not ARGUMENTS.deny
    conversation("txn_1", 40_000, approve)       # EUR 400: allowed, no human
    conversation("txn_2", 250_000, approve)      # EUR 2,500: a human decides
    conversation("txn_2", 250_000, approve)      # the agent tries the same refund again
    print(f"stripe was called for: {', '.join(stripe_calls) or 'nothing'}")
    for receipt in store.receipts():
        print(f"receipt {receipt.action} {receipt.arguments['payment_id']}: "
              f"{receipt.decision}/{receipt.result} approver={receipt.approver}")
    # Each approved pause leaves its first request pending: the tool re-ran and asked again (README).
    print(f"requests left pending: {len(store.pending_approvals())}")
    store.close()
