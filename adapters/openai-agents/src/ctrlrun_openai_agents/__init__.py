"""ctrlrun for the OpenAI Agents SDK: the SDK's own tool approval answers ctrlrun's request.

The SDK decides before invoking a tool: ``protected_tool`` installs a ``needs_approval``
predicate (``approval_gate``) that asks ctrlrun whether a human is needed (the policy says
approve and the call's effect key can still be reserved); the run then stops with a
``ToolApprovalItem`` and the caller answers with ``state.approve(item)`` or
``state.reject(item)``. On the resumed run the tool body calls the ``@protect(..., wait=True)``
function; ``AgentsInterrupt`` reads the SDK's recorded decision for **this** tool call and hands
it to ctrlrun's ``InterruptApprovalProvider``, which records it. It asks nobody and grants
nothing itself.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from ctrlrun.adapter import (
    ApprovalAnswer,
    ApprovalNotAsked,
    PendingApproval,
    banner,
    needs_approval,
    observing,
)
from ctrlrun.control import Control
from ctrlrun.errors import InvalidArgument

__all__ = [
    "CHANNEL",
    "AgentsInterrupt",
    "ApprovalNotAsked",
    "__version__",
    "approval_gate",
    "protected_tool",
    "run",
    "run_sync",
    "unwrap",
]

__version__ = "0.1.0"

CHANNEL = "openai-agents:tool-approval"
"""The approver recorded for every answer: the SDK records that a call was approved, not by whom."""


@dataclass
class _Invocation:
    """One ``protected_tool`` invocation: the SDK's ToolContext and the action it was gated for."""

    tool_context: Any
    action: str
    answered: str | None = None  # the request id this tool call's decision was handed to


_invocation: ContextVar[_Invocation | None] = ContextVar("ctrlrun_agents_invocation", default=None)


# --------------------------------------------------------------------------- reading the answer


def _names_of(tool_context: Any) -> set[str]:
    names = set()
    for attribute in ("tool_name", "qualified_tool_name"):
        value = getattr(tool_context, attribute, None)
        if isinstance(value, str) and value:
            names.add(value)
    return names


def _names_this_tool(key: Any, names: set[str]) -> bool:
    tool_key = getattr(key, "tool_key", None)  # SDK >= 0.23: owner-bound (agent, tool) keys
    if isinstance(tool_key, str):
        return tool_key in names
    return type(key) is str and key in names


def exact_decision(tool_context: Any) -> bool | None:
    """The SDK's decision for exactly this tool call: ``False`` / ``True`` / ``None`` (none).

    Only per-call (list) decisions count and a rejection anywhere wins; sticky booleans
    (``always_approve`` / ``always_reject``) are never an answer. Reads the SDK's private
    approval table; the public ``is_tool_approved`` falls back to sticky values.
    """
    table = getattr(tool_context, "_approvals", None)
    call_id = getattr(tool_context, "tool_call_id", None)
    if not isinstance(table, Mapping) or not isinstance(call_id, str) or not call_id:
        return None
    names = _names_of(tool_context)
    approved = False
    for key, record in list(table.items()):
        if not _names_this_tool(key, names):
            continue
        rejected_ids = getattr(record, "rejected", None)
        if isinstance(rejected_ids, list) and call_id in rejected_ids:
            return False
        approved_ids = getattr(record, "approved", None)
        if isinstance(approved_ids, list) and call_id in approved_ids:
            approved = True
    return True if approved else None


class AgentsInterrupt:
    """A ctrlrun ``FrameworkInterrupt`` that reads the SDK's answer for the current tool call.

    **Attribution**: the arguments the human saw live on the SDK's ``ToolApprovalItem``, out of
    the tool body's reach, so ``carries_approved_arguments`` is ``False``.
    """

    framework = "openai-agents"
    carries_approved_arguments = False

    def __repr__(self) -> str:
        return "AgentsInterrupt()"

    def interrupt(self, pending: PendingApproval) -> ApprovalAnswer:
        """The SDK's recorded decision for this call, or ``ApprovalNotAsked``."""
        request_id = pending.request_id
        invocation = _invocation.get()
        left = (
            f"; request {request_id} stays pending (answer it with `ctrlrun approve "
            f"{request_id}` or `ctrlrun deny {request_id}`), nothing was reserved or run"
        )
        if invocation is None:
            raise ApprovalNotAsked(
                f"action {pending.action!r} needs approval, but it was not called from a "
                "ctrlrun_openai_agents.protected_tool invocation, so no human was asked through "
                "the Agents SDK" + left
            )
        if pending.action != invocation.action:
            raise ApprovalNotAsked(
                f"action {pending.action!r} needs approval, but this tool was gated for "
                f"{invocation.action!r}; the SDK's approval of this call answers only that "
                "action (give the other action its own protected_tool)" + left
            )
        if invocation.answered is not None and invocation.answered != request_id:
            raise ApprovalNotAsked(
                f"this tool call's approval already answered request {invocation.answered}; "
                f"one SDK approval answers one request, not also {pending.action!r} "
                "(make one gated protected call per tool)" + left
            )
        decision = exact_decision(invocation.tool_context)
        if decision is None:
            call = getattr(invocation.tool_context, "tool_call_id", "?")
            raise ApprovalNotAsked(
                f"action {pending.action!r} needs approval, but the Agents SDK holds no "
                f"approval or rejection for exactly this call ({call}): the gate did not ask "
                "(its arguments differed from the protected call's, e.g. defaulted parameters "
                "or a decorator-only resource, or the effect key was held by another attempt "
                "when it asked) or the tool was approved with "
                "always_approve=True, which ctrlrun never takes as an answer" + left
            )
        invocation.answered = request_id
        return ApprovalAnswer(decision, CHANNEL)


# --------------------------------------------------------------------------- hooking in


def _check_control(control: Any, where: str) -> None:
    if not isinstance(control, Control):
        raise InvalidArgument(f"{where}: control must be a ctrlrun.Control, got {control!r}")


def _check_action(action: Any, where: str) -> None:
    if not isinstance(action, str) or not action.strip():
        raise InvalidArgument(f"{where}: action must be a non-empty action name, got {action!r}")


def approval_gate(
    control: Control, action: str, *, resource: str | None = None, effect: str | None = None
) -> Callable[[Any, Mapping[str, Any], str], Any]:
    """The SDK ``needs_approval`` predicate: ``True`` iff ctrlrun would ask a human.

    Writes nothing. A policy **deny** answers ``False`` so the tool runs into ``Control`` and is
    refused there with a receipt; so does a call whose effect key (``effect``, else the policy's
    ``effect:`` template) cannot be reserved now (committed, ambiguous, held by another attempt):
    ``Control`` refuses it without asking, so the SDK must not ask either. Observe mode answers
    ``False`` (no human is asked).
    """
    _check_control(control, "approval_gate")
    _check_action(action, "approval_gate")
    if resource is not None and not isinstance(resource, str):
        raise InvalidArgument(f"approval_gate({action!r}): resource= must be a string template")
    if effect is not None and (not isinstance(effect, str) or not effect):
        raise InvalidArgument(f"approval_gate({action!r}): effect= must be a non-empty template")
    banner(control)

    async def gate(run_context: Any, params: Mapping[str, Any], call_id: str) -> bool:
        if observing(control):
            return False
        return needs_approval(control, action, dict(params), resource=resource, effect=effect)

    gate.__name__ = f"ctrlrun_gate_{action}"
    gate.__qualname__ = gate.__name__
    return gate


def _scoped(invoke: Callable[..., Any], action: str) -> Callable[..., Any]:
    @functools.wraps(invoke)
    async def invoke_in_scope(ctx: Any, input: str) -> Any:
        token = _invocation.set(_Invocation(ctx, action))
        try:
            return await invoke(ctx, input)
        finally:
            _invocation.reset(token)

    return invoke_in_scope


def _wrap_invocation(tool: Any, action: str) -> None:
    """Hold the SDK ToolContext and the gated action in a context variable during each call.

    Where the SDK's invoker keeps its implementation separately (0.2x), the implementation is
    wrapped so the invoker object (failure policy, argument inspection for approval, copies)
    stays the SDK's own; otherwise ``on_invoke_tool`` itself is wrapped.
    """
    invoker = tool.on_invoke_tool
    inner = getattr(invoker, "_invoke_tool_impl", None)
    if callable(inner):
        invoker._invoke_tool_impl = _scoped(inner, action)
    else:
        tool.on_invoke_tool = _scoped(invoker, action)


def protected_tool(
    control: Control,
    action: str,
    function: Callable[..., Any],
    *,
    resource: str | None = None,
    effect: str | None = None,
    **options: Any,
) -> Any:
    """``agents.function_tool(function, **options)`` gated by ctrlrun's policy for ``action``.

    ``failure_error_function`` defaults to ``None`` so ctrlrun's refusals fail the run (use
    ``run``/``run_sync`` or ``unwrap`` to get them back as themselves); a caller supplying one
    must re-raise ``CTRLRunError``. ``needs_approval=`` is refused: the gate is the policy.
    ``resource=`` / ``effect=`` are the templates the gate renders over the tool's arguments
    when the protected call declares them on ``@protect`` only (the policy's are used otherwise).
    """
    if "needs_approval" in options:
        raise InvalidArgument(
            f"protected_tool({action!r}): needs_approval= is not accepted; ctrlrun's policy "
            "decides which calls need a human (approval_gate)"
        )
    if not callable(function):
        raise InvalidArgument(f"protected_tool({action!r}): function must be callable")
    gate = approval_gate(control, action, resource=resource, effect=effect)
    options.setdefault("failure_error_function", None)
    from agents import function_tool

    tool = function_tool(function, needs_approval=gate, **options)
    _wrap_invocation(tool, action)
    return tool


# --------------------------------------------------------------------------- errors


def unwrap(error: BaseException) -> BaseException:
    """The exception an SDK wrapper (``UserError``/``AgentsException``) was raised from.

    Follows ``__cause__`` only (never ``__context__``), only through SDK wrappers, stops at the
    first non-wrapper and terminates on cycles.
    """
    from agents.exceptions import AgentsException

    seen: set[int] = set()
    current = error
    while isinstance(current, AgentsException) and id(current) not in seen:
        seen.add(id(current))
        cause = current.__cause__
        if cause is None:
            break
        current = cause
    return current


async def run(agent: Any, input: Any, **kwargs: Any) -> Any:
    """``Runner.run``, re-raising the exception the SDK wrapped (e.g. ``ActionDenied``)."""
    from agents import Runner
    from agents.exceptions import AgentsException

    try:
        return await Runner.run(agent, input, **kwargs)
    except AgentsException as error:
        inner = unwrap(error)
        if inner is error:
            raise
    raise inner  # outside the handler: no ``from`` and no implicit context, so no cycle


def run_sync(agent: Any, input: Any, **kwargs: Any) -> Any:
    """``Runner.run_sync``, re-raising the exception the SDK wrapped (e.g. ``ActionDenied``)."""
    from agents import Runner
    from agents.exceptions import AgentsException

    try:
        return Runner.run_sync(agent, input, **kwargs)
    except AgentsException as error:
        inner = unwrap(error)
        if inner is error:
            raise
    raise inner  # outside the handler: no ``from`` and no implicit context, so no cycle
