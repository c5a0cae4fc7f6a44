"""A Microsoft Agent Framework refund agent whose large refunds wait for the framework's approval.

    python main.py             # ada@example.com approves the EUR 2,500 refund
    python main.py --reject    # she rejects it

Runs offline: a scripted chat client stands in for the LLM; the framework's function-calling
loop, approval binding and session are real. State lives in .ctrlrun/state.db, so a second run
refunds nothing again; delete that directory to start over.
"""

from __future__ import annotations

import argparse


def parse_arguments() -> argparse.Namespace:
    """The command line, read before anything runs: ``--help`` shows what this does, and an
    option it does not take is refused (exit 2) instead of being ignored."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reject", action="store_true",
                        help="ada@example.com rejects the EUR 2,500 refund in the framework")
    return parser.parse_args()


if __name__ == "__main__":  # first: --help needs no framework installed, and opens no store
    ARGUMENTS = parse_arguments()

import asyncio
import json
import logging
from collections.abc import Sequence
from typing import Any

from agent_framework import (
    Agent,
    BaseChatClient,
    ChatMiddlewareLayer,
    ChatResponse,
    Content,
    FunctionInvocationLayer,
    Message,
    MiddlewareFailure,
    tool,
)
from ctrlrun_agent_framework import APPROVER_KEY, AgentFrameworkInterrupt, ApprovalMiddleware, unwrap

from ctrlrun import ActionDenied, Control, DuplicateEffect, Policy, SQLiteStateStore, protect
from ctrlrun.adapter import InterruptApprovalProvider
from ctrlrun.identity import StaticIdentityProvider

# The framework logs every tool body that raises, including the adapter's pause and ctrlrun's
# refusals ("Function refund failed (...)"); this example prints what happened itself.
logging.getLogger("agent_framework").setLevel(logging.CRITICAL)


class ScriptedClient(FunctionInvocationLayer, ChatMiddlewareLayer, BaseChatClient):  # type: ignore[misc]
    """The model: a user's request gets one refund call; a tool result gets a short reply."""

    def __init__(self) -> None:
        super().__init__()
        self.arguments = "{}"

    async def _inner_get_response(self, *, messages: Sequence[Message], stream: bool,
                                  options: Any, **kwargs: Any) -> ChatResponse:
        last = messages[-1]
        results = [str(c.result) for c in last.contents if c.type == "function_result"]
        if results:
            reply = Content.from_text("tool said: " + "; ".join(results))
        else:  # the model sends the amount as a string; the framework validates it to an int
            reply = Content.from_function_call(call_id="call_1", name="refund", arguments=self.arguments)
        return ChatResponse(messages=[Message(role="assistant", contents=[reply])])


client = ScriptedClient()
store = SQLiteStateStore(".ctrlrun/state.db")
control = Control(Policy.from_file("ctrlrun.yaml"), store,
                  InterruptApprovalProvider(store, AgentFrameworkInterrupt(client)),
                  identity=StaticIdentityProvider("refund-agent"))

stripe_calls: list[str] = []  # what the (fake) payment provider was asked to do


@protect("stripe.refund", effect="refund:{payment_id}", wait=True, control=control)
def issue_refund(payment_id: str, amount: int) -> str:
    stripe_calls.append(payment_id)
    return f"re_{payment_id}"


@tool(approval_mode="never_require")  # ctrlrun's policy decides who needs a human
def refund(payment_id: str, amount: int) -> str:
    """Refund a payment. The amount is in integer cents."""
    return issue_refund(payment_id=payment_id, amount=amount)  # pass-through


agent = Agent(client=client, name="refunds", instructions="Refund payments.", tools=[refund],
              middleware=[ApprovalMiddleware()])


async def conversation(payment_id: str, amount: int, approve: bool) -> None:
    client.arguments = json.dumps({"payment_id": payment_id, "amount": str(amount)})
    session = agent.create_session()
    try:
        response = await agent.run(f"Please refund {payment_id}.", session=session)
        for request in response.user_input_requests:  # function_approval_request contents
            shown = request.additional_properties["ctrlrun"]
            print(f"{payment_id}: paused for approval of {request.function_call.name} "
                  f"{json.dumps(request.function_call.parse_arguments())}")
            print(f"{payment_id}: request {shown['request_id']} bound to {shown['action_hash'][:19]}...")
            print(f"{payment_id}: ada@example.com {'approves' if approve else 'rejects'}")
            answer = request.to_function_approval_response(approve)
            answer.additional_properties = {**answer.additional_properties, APPROVER_KEY: "ada@example.com"}
            response = await agent.run(Message(role="user", contents=[answer]), session=session)
        print(f"{payment_id}: agent says: {response.text}")
    except MiddlewareFailure as failure:  # ctrlrun refused: the run failed closed
        refused = unwrap(failure)
        if isinstance(refused, DuplicateEffect):  # a second run: the refund already happened
            print(f"{payment_id}: not run again ({refused.state})")
        elif isinstance(refused, ActionDenied):
            print(f"{payment_id}: refused ({refused.reason})")
        else:
            raise


async def main(approve: bool) -> None:
    await conversation("txn_1", 40_000, approve)      # EUR 400: allowed, nobody asked
    await conversation("txn_2", 250_000, approve)     # EUR 2,500: ada@example.com decides
    print(f"stripe was called for: {', '.join(stripe_calls) or 'nothing'}")
    for receipt in store.receipts():
        print(f"receipt {receipt.action} {receipt.arguments['payment_id']}: "
              f"{receipt.decision}/{receipt.result} approver={receipt.approver}")


if __name__ == "__main__":
    asyncio.run(main(not ARGUMENTS.reject))
