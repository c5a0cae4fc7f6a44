"""An offline Agent Framework app for the suite: a fake chat client and a protected refund tool."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agent_framework import (
    Agent,
    AgentSession,
    BaseChatClient,
    ChatMiddlewareLayer,
    ChatResponse,
    Content,
    FunctionInvocationLayer,
    Message,
    tool,
)
from ctrlrun_agent_framework import APPROVER_KEY, AgentFrameworkInterrupt, ApprovalMiddleware

from ctrlrun import Control, InterruptApprovalProvider, Policy, protect
from ctrlrun.identity import StaticIdentityProvider

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


class Fake(FunctionInvocationLayer, ChatMiddlewareLayer, BaseChatClient):  # type: ignore[misc]
    """The model: a user prompt gets the scripted function calls; anything else gets text.

    The text reply lists the function results of the last message, so a test can see what the
    model was told (a tool result, a rejection).
    """

    def __init__(self, calls: Sequence[tuple[str, str, str]], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.calls = list(calls)  # (call_id, tool name, JSON arguments as the model sends them)
        self.turns = 0

    async def _inner_get_response(self, *, messages: Sequence[Message], stream: bool,
                                  options: Any, **kwargs: Any) -> ChatResponse:  # fmt: skip
        if stream:
            raise NotImplementedError("the fake model does not stream")
        self.turns += 1
        last = messages[-1] if messages else Message(role="user", contents=[])
        if last.role == "user" and any(c.type == "text" for c in last.contents):
            contents = [Content.from_function_call(call_id=call_id, name=name, arguments=arguments)
                        for call_id, name, arguments in self.calls]  # fmt: skip
            return ChatResponse(messages=[Message(role="assistant", contents=contents)])
        told = [str(c.result) for c in last.contents if c.type == "function_result"]
        reply = "model was told: " + " | ".join(told) if told else "model: nothing to do"
        return ChatResponse(messages=[Message(role="assistant", contents=[Content.from_text(reply)])])


def call(call_id: str, payment_id: str, amount: Any, name: str = "refund") -> tuple[str, str, str]:
    return (call_id, name, json.dumps({"payment_id": payment_id, "amount": amount}))


@dataclass
class App:
    store: Any
    client: Fake
    agent: Agent[Any]
    control: Control
    stripe: list[tuple[str, int]] = field(default_factory=list)
    other: list[str] = field(default_factory=list)

    def session(self) -> AgentSession:
        return self.agent.create_session()


def build(store: Any, calls: Sequence[tuple[str, str, str]], *, approval_mode: str = "never_require",
          concurrent: bool = True, middleware: bool = True, policy: str = POLICY,
          effect: str | None = "refund:{payment_id}") -> App:  # fmt: skip
    client = Fake(calls, function_invocation_configuration={"allow_concurrent_invocation": concurrent})
    control = Control(Policy.from_yaml(policy), store,
                      InterruptApprovalProvider(store, AgentFrameworkInterrupt(client)),
                      identity=StaticIdentityProvider("refund-agent"), environment="dev")  # fmt: skip
    stripe: list[tuple[str, int]] = []
    other: list[str] = []

    @protect("stripe.refund", effect=effect, wait=True, control=control)
    def issue_refund(payment_id: str, amount: int) -> str:
        stripe.append((payment_id, amount))
        return f"re_{payment_id}"

    @tool(approval_mode=approval_mode)  # type: ignore[call-overload]
    def refund(payment_id: str, amount: int) -> str:
        """Refund a payment; amount in integer cents."""
        return issue_refund(payment_id=payment_id, amount=amount)

    @tool(approval_mode="never_require")
    def refund_pair(payment_id: str, amount: int) -> str:
        """Refund a payment and its twin (two approval-gated calls in one tool call)."""
        first = issue_refund(payment_id=payment_id, amount=amount)
        return first + "," + issue_refund(payment_id=payment_id + "_twin", amount=amount)

    @tool(approval_mode="never_require")
    def lookup(payment_id: str) -> str:
        """An unprotected tool."""
        other.append(payment_id)
        return f"found {payment_id}"

    @tool(approval_mode="never_require")
    def refund_default(payment_id: str, amount: int = 250_000) -> str:
        """A protected tool with a defaulted parameter (cannot be approved: see the README)."""
        return issue_refund(payment_id=payment_id, amount=amount)

    @tool(approval_mode="never_require")
    def explode(payment_id: str) -> str:
        """A tool whose body fails with an ordinary exception."""
        raise RuntimeError(f"lookup service down for {payment_id}")

    agent = Agent(client=client, name="refunds", instructions="Refund payments.",
                  tools=[refund, refund_pair, refund_default, lookup, explode],
                  middleware=[ApprovalMiddleware()] if middleware else [])  # fmt: skip
    return App(store, client, agent, control, stripe, other)


def answer(request: Content, approved: bool, approver: Any = None) -> Message:
    """The caller's answer to one request, as a user message."""
    response = request.to_function_approval_response(approved)
    if approver is not None:
        response.additional_properties = {**(response.additional_properties or {}), APPROVER_KEY: approver}
    return Message(role="user", contents=[response])
