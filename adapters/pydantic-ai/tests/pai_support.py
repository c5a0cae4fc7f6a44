"""An offline refund agent for the suite: a FunctionModel, a protected refund, ctrlrun's stores.

Imported by the tests and by the resumed pass that runs in a fresh process
(``python -m pai_support resume ...``).
"""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

from ctrlrun_pydantic_ai import ApprovalScope, PydanticAIInterrupt
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import DeferredToolRequests

from ctrlrun import Control, Policy, protect
from ctrlrun.adapter import InterruptApprovalProvider
from ctrlrun.identity import StaticIdentityProvider

# The starter policy's refund rules: up to 500.00 runs, up to 5,000.00 needs a human, else deny.
REFUND_POLICY = """\
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
ALWAYS_APPROVE = "schema: ctrlrun.policy/v2\nactions:\n  stripe.refund: {decision: approve}\n"
ALWAYS_DENY = "schema: ctrlrun.policy/v2\nactions:\n  stripe.refund: {decision: deny}\n"

Call = tuple[str, dict[str, Any] | str, str]  # (tool name, raw args from the model, tool_call_id)


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


def scripted_model(calls: Sequence[Call]) -> FunctionModel:
    """Turn 1 makes exactly these tool calls; once tool results came back, it reports them."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returned = [
            f"{part.tool_call_id}={part.content}"
            for part in messages[-1].parts
            if part.part_kind in ("tool-return", "retry-prompt")
        ]
        if returned:
            return ModelResponse(parts=[TextPart("; ".join(returned))])
        return ModelResponse(
            parts=[ToolCallPart(name, args, tool_call_id=call_id) for name, args, call_id in calls]
        )

    return FunctionModel(respond)


def build_app(
    store: Any,
    *,
    calls: Sequence[Call] = (("refund", {"payment_id": "txn_2", "amount": 250_000}, "call_1"),),
    carries: bool = True,
    effect: bool = True,
    policy: str = REFUND_POLICY,
    clock: Clock | None = None,
    scope: bool = True,
    capabilities: Sequence[Any] = (),
    output_type: Any = (str, DeferredToolRequests),
    asynchronous: bool = False,
) -> SimpleNamespace:
    clock = clock or Clock()
    control = Control(
        Policy.from_yaml(policy, source="inline"), store,
        InterruptApprovalProvider(store, PydanticAIInterrupt(carries_approved_arguments=carries),
                                  clock=clock),
        clock=clock, identity=StaticIdentityProvider("refund-agent"), environment="dev",
    )  # fmt: skip
    stripe: list[tuple[str, int]] = []
    key = "refund:{payment_id}" if effect else None

    @protect("stripe.refund", effect=key, wait=True, control=control)
    def issue_refund(payment_id: str, amount: int) -> str:
        stripe.append((payment_id, amount))
        return f"re_{payment_id}"

    @protect("stripe.refund", effect=key, wait=True, control=control)
    async def issue_refund_async(payment_id: str, amount: int) -> str:
        stripe.append((payment_id, amount))
        return f"re_{payment_id}"

    caps = ([ApprovalScope()] if scope else []) + list(capabilities)
    agent = Agent(scripted_model(calls), output_type=list(output_type), capabilities=caps)

    if asynchronous:

        @agent.tool_plain(name="refund")
        async def refund_async(payment_id: str, amount: int) -> str:
            """Refund a payment, amount in integer cents."""
            return await issue_refund_async(payment_id=payment_id, amount=amount)

    else:

        @agent.tool_plain
        def refund(payment_id: str, amount: int) -> str:
            """Refund a payment, amount in integer cents."""
            return issue_refund(payment_id=payment_id, amount=amount)

    @agent.tool_plain
    def refund_twice(payment_id: str, other: str, amount: int) -> str:
        """Two approval-gated protected calls in one tool call (the adapter refuses the second)."""
        return issue_refund(payment_id=payment_id, amount=amount) + issue_refund(
            payment_id=other, amount=amount
        )

    return SimpleNamespace(agent=agent, store=store, stripe=stripe, clock=clock, control=control)


def guard_network() -> None:
    """Refuse every non-UNIX socket connection (the fresh-process pass runs offline too)."""
    real_connect: Callable[..., Any] = socket.socket.connect

    def connect(self: socket.socket, address: Any) -> Any:
        if self.family != getattr(socket, "AF_UNIX", None):
            raise ConnectionRefusedError(f"network refused in tests: {address!r}")
        return real_connect(self, address)

    socket.socket.connect = connect  # type: ignore[method-assign]


def resume_in_this_process(state: str, history: str, answer: str) -> None:
    """The second pass, from JSON only: the message history and the console's answer."""
    from pydantic_ai.messages import ModelMessagesTypeAdapter
    from pydantic_ai.tools import DeferredToolResults

    from ctrlrun import SQLiteStateStore

    guard_network()
    clock = Clock()  # the first pass's clock: the request has not expired by it
    store = SQLiteStateStore(state, clock=clock)
    try:
        app = build_app(store, clock=clock)
        with open(history, "rb") as handle:
            messages = ModelMessagesTypeAdapter.validate_json(handle.read())
        with open(answer, encoding="utf-8") as handle:
            said = json.load(handle)
        results = DeferredToolResults(approvals={i: True for i in said}, metadata=said)
        done = app.agent.run_sync(message_history=messages, deferred_tool_results=results)
        print(json.dumps({"output": done.output, "stripe": app.stripe}))
    finally:
        store.close()


if __name__ == "__main__":
    command, *arguments = sys.argv[1:]
    assert command == "resume", command
    resume_in_this_process(*arguments)
