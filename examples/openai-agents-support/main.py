"""A support agent (OpenAI Agents SDK) whose large refunds wait for the SDK's tool approval.

    python main.py             # the support lead approves the EUR 2,500 refund
    python main.py --reject    # the support lead rejects it

Runs offline: a scripted Model stands in for the LLM; the SDK's approval machinery is real.
State lives in .ctrlrun/state.db, so a second run refunds nothing again and asks nobody; delete
that directory to start over.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from agents import Agent, set_tracing_disabled
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from ctrlrun_openai_agents import AgentsInterrupt, protected_tool, run_sync
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from ctrlrun import ActionDenied, Control, DuplicateEffect, Policy, SQLiteStateStore, protect
from ctrlrun.adapter import InterruptApprovalProvider
from ctrlrun.identity import StaticIdentityProvider


class ScriptedModel(Model):
    """Turn 1 asks for one refund; turn 2 tells the customer what happened."""

    def __init__(self, payment_id: str, amount: int) -> None:
        self.arguments = json.dumps({"payment_id": payment_id, "amount": amount})
        self.turn = 0

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        self.turn += 1
        if self.turn == 1:
            out: Any = ResponseFunctionToolCall(type="function_call", id="fc_1", call_id="call_1",
                                                name="refund", arguments=self.arguments)
        else:
            out = ResponseOutputMessage(type="message", id="msg_1", role="assistant", status="completed",
                content=[ResponseOutputText(type="output_text", text="Your refund request is handled.",
                                            annotations=[])])
        return ModelResponse(output=[out], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any):
        raise NotImplementedError


stripe_calls: list[str] = []  # what the (fake) payment provider was asked to do


def refund_tool_for(control: Control) -> Any:
    """The agent's ``refund`` tool: a protected refund, gated by the policy before each call."""

    @protect("stripe.refund", effect="refund:{payment_id}", wait=True, control=control)
    def refund(payment_id: str, amount: int) -> str:
        stripe_calls.append(payment_id)
        return f"re_{payment_id}"

    def refund_tool(payment_id: str, amount: int) -> str:
        """Refund a payment. The amount is in integer cents."""
        return refund(payment_id=payment_id, amount=amount)

    return protected_tool(control, "stripe.refund", refund_tool, name_override="refund")


def conversation(tool: Any, payment_id: str, amount: int, approve: bool) -> None:
    """One customer asks for one refund; a pause, if any, is answered by the support lead."""
    agent = Agent(name="support", instructions="Help customers with refunds.", tools=[tool],
                  model=ScriptedModel(payment_id, amount))
    try:
        result = run_sync(agent, f"Please refund {payment_id}.")
        if result.interruptions:
            state = result.to_state()
            for item in result.interruptions:
                print(f"{payment_id}: paused for approval of {item.tool_name} {item.raw_item.arguments}")
                print(f"{payment_id}: support lead {'approves' if approve else 'rejects'}")
                (state.approve if approve else state.reject)(item)  # the SDK's own approval
            result = run_sync(agent, state)
        print(f"{payment_id}: agent says: {result.final_output}")
    except ActionDenied as refused:
        print(f"{payment_id}: refused ({refused.reason})")
    except DuplicateEffect as duplicate:  # a second run: the refund already happened once
        print(f"{payment_id}: not run again ({duplicate.state})")


def main(argv: list[str] | None = None) -> None:
    """Parse the options first (``--help`` and a wrong option touch nothing), then run."""
    parser = argparse.ArgumentParser(
        description="A support agent refunds two payments; the EUR 2,500 one needs the support "
        "lead's approval through the Agents SDK. Offline; state in .ctrlrun/state.db.")  # fmt: skip
    parser.add_argument("--reject", action="store_true",
                        help="the support lead rejects the EUR 2,500 refund (default: approves)")
    approve = not parser.parse_args(argv).reject

    set_tracing_disabled(True)  # offline: no trace export
    store = SQLiteStateStore(".ctrlrun/state.db")
    control = Control(Policy.from_file("ctrlrun.yaml"), store,
                      InterruptApprovalProvider(store, AgentsInterrupt()),
                      identity=StaticIdentityProvider("support-agent"))
    tool = refund_tool_for(control)
    conversation(tool, "txn_1", 40_000, approve)       # EUR 400: allowed, nobody asked
    conversation(tool, "txn_2", 250_000, approve)      # EUR 2,500: the support lead decides
    print(f"stripe was called for: {', '.join(stripe_calls) or 'nothing'}")
    for receipt in store.receipts():
        print(f"receipt {receipt.action} {receipt.arguments['payment_id']}: "
              f"{receipt.decision}/{receipt.result} approver={receipt.approver}")


if __name__ == "__main__":
    main()
