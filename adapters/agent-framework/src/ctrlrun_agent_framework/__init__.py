"""ctrlrun for Microsoft Agent Framework: ask through the framework's own function approval.

Wire it as ``InterruptApprovalProvider(store, AgentFrameworkInterrupt(client))``, give the agent
``middleware=[ApprovalMiddleware()]`` and call the ``@protect(..., wait=True)`` function from a
pass-through tool. On **approve** the middleware answers the tool call with a
``function_approval_request`` (the tool's validated arguments, ctrlrun's payload under
``additional_properties["ctrlrun"]``) and the run returns it in ``response.user_input_requests``.
The caller answers ``request.to_function_approval_response(True)`` in the **same session**; the
framework binds the answer to its own snapshot and re-invokes the call, and
``AgentFrameworkInterrupt`` hands ctrlrun the arguments of that bound record (prevention). It
grants nothing itself: ctrlrun's provider records the answer and ``Control`` re-decides, binds,
reserves and records.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ctrlrun.adapter import ApprovalAnswer, ApprovalNotAsked, PendingApproval
from ctrlrun.errors import InvalidArgument

if TYPE_CHECKING:
    from ._middleware import ApprovalMiddleware

__all__ = [
    "APPROVER_KEY",
    "CHANNEL",
    "AgentFrameworkInterrupt",
    "ApprovalMiddleware",
    "ApprovalNotAsked",
    "__version__",
    "unwrap",
]

__version__ = "0.1.0"

CHANNEL = "agent-framework:function-approval"
"""The approver recorded when the answer names nobody (a channel, not a person)."""

APPROVER_KEY = "ctrlrun_approver"
"""The answer's ``additional_properties`` key naming who answered (recorded as given, not
authenticated)."""

_BINDING = "disable_approval_response_binding"


@dataclass
class _Scope:
    """One function invocation seen by ``ApprovalMiddleware``: the framework's context."""

    context: Any  # agent_framework.FunctionInvocationContext
    request_id: str | None = None  # the one ctrlrun request this call asked (or answered)


_scope: ContextVar[_Scope | None] = ContextVar("ctrlrun_agent_framework_scope", default=None)


class _ApprovalPause(Exception):
    """The adapter's private pause signal: ``ApprovalMiddleware`` turns it into the request.

    Deliberately not a ``CTRLRunError`` (those become ``MiddlewareFailure``) and never seen
    outside the middleware.
    """

    def __init__(
        self,
        pending: PendingApproval,
        call_id: str,
        occurrence_id: str,
        name: str,
        arguments: dict[str, Any],
    ) -> None:
        super().__init__(f"ctrlrun approval pause for request {pending.request_id}")
        self.pending = pending
        self.call_id = call_id
        self.occurrence_id = occurrence_id
        self.name = name
        self.arguments = arguments


def _binding_disabled(client: Any) -> bool:
    config = getattr(client, "function_invocation_configuration", None)
    if not isinstance(config, Mapping):
        return True  # no function-invocation layer to bind anything: fail closed
    return bool(config.get(_BINDING, False))


def _arguments(context: Any) -> dict[str, Any] | None:
    arguments = getattr(context, "arguments", None)
    if isinstance(arguments, Mapping):
        return dict(arguments)
    dump = getattr(arguments, "model_dump", None)  # a pydantic model of the tool's parameters
    if callable(dump):
        dumped = dump()
        if isinstance(dumped, Mapping):
            return dict(dumped)
    return None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


class AgentFrameworkInterrupt:
    """A ctrlrun ``FrameworkInterrupt`` over Agent Framework's function approval.

    **Prevention**: on a grant, ``approved_arguments`` are the arguments of the framework's own
    bound record of the request (``function_call.parse_arguments()`` of the answer the framework
    matched to its session snapshot), so ``carries_approved_arguments`` is ``True``.

    ``client`` is the chat client the agent runs on; its ``function_invocation_configuration``
    must keep approval-response binding on (the default), checked here and on every answer.
    """

    framework = "agent-framework"
    carries_approved_arguments = True

    def __init__(self, client: Any) -> None:
        config = getattr(client, "function_invocation_configuration", None)
        if not isinstance(config, Mapping):
            raise InvalidArgument(
                "AgentFrameworkInterrupt(client) needs the agent's chat client, one with a "
                "function-invocation layer (a FunctionInvocationLayer client, which has "
                f"function_invocation_configuration); got {type(client).__name__}"
            )
        if bool(config.get(_BINDING, False)):
            raise InvalidArgument(
                "AgentFrameworkInterrupt: this client has approval-response binding disabled "
                f"(function_invocation_configuration[{_BINDING!r}] is true), so an answer would "
                "not be bound to the request the framework recorded and its arguments could be "
                f"anyone's; set it to False (the default) to use ctrlrun approvals"
            )
        self._client = client

    @property
    def client(self) -> Any:
        return self._client

    def __repr__(self) -> str:
        return f"AgentFrameworkInterrupt({type(self._client).__name__})"

    def interrupt(self, pending: PendingApproval) -> ApprovalAnswer:
        """Pause the tool call with a ``function_approval_request``, or read the bound answer."""
        request_id = pending.request_id
        left = (
            f"; request {request_id} stays pending (answer it with `ctrlrun approve "
            f"{request_id}` or `ctrlrun deny {request_id}`), nothing was granted, reserved or run"
        )
        scope = _scope.get()
        if scope is None:
            raise ApprovalNotAsked(
                f"action {pending.action!r} needs approval, but it was not called from a tool "
                "invoked under ctrlrun_agent_framework.ApprovalMiddleware (add "
                "middleware=[ApprovalMiddleware()] to the Agent), so no human was asked through "
                "Agent Framework" + left
            )
        if scope.request_id is not None and scope.request_id != request_id:
            raise ApprovalNotAsked(
                f"this tool call already asked for request {scope.request_id}; one Agent "
                f"Framework approval answers one request, not also {pending.action!r} (make one "
                "approval-gated protected call per tool)" + left
            )
        context = scope.context
        metadata = getattr(context, "metadata", None)
        metadata = metadata if isinstance(metadata, Mapping) else {}
        response = metadata.get("approval_response")
        if response is None:
            return self._pause(scope, pending, metadata, left)
        scope.request_id = request_id
        if _binding_disabled(self._client):
            raise ApprovalNotAsked(
                f"the answer for {pending.action!r} arrived on a client with approval-response "
                f"binding disabled (function_invocation_configuration[{_BINDING!r}]), so it is "
                "not bound to the request the framework recorded; set it back to False" + left
            )
        if getattr(context, "session", None) is None:
            raise ApprovalNotAsked(
                f"the answer for {pending.action!r} came without an AgentSession; the framework "
                "binds an answer to the request it recorded in the session, so pass the same "
                "session to agent.run" + left
            )
        if getattr(response, "approved", None) is not True:
            raise ApprovalNotAsked(
                f"the framework's answer for {pending.action!r} is not an approval "
                f"(approved={getattr(response, 'approved', None)!r}); only a human's approval is "
                "taken as an answer" + left
            )
        function_call = getattr(response, "function_call", None)
        if function_call is None or getattr(function_call, "type", None) != "function_call":
            raise ApprovalNotAsked(
                f"the framework's answer for {pending.action!r} carries no function_call record "
                "to bind the approval to" + left
            )
        properties = getattr(response, "additional_properties", None) or {}
        approver: Any = properties.get(APPROVER_KEY) if isinstance(properties, Mapping) else None
        if approver is None:
            approver = CHANNEL
        elif not isinstance(approver, str) or not approver.strip():
            raise InvalidArgument(
                f"the approval's additional_properties[{APPROVER_KEY!r}] must be a non-blank "
                f"string naming who answered (or absent: the channel {CHANNEL!r}), got "
                f"{approver!r}; nothing was recorded and request {request_id} stays pending"
            )
        arguments = function_call.parse_arguments()
        return ApprovalAnswer(True, approver, arguments)

    def _pause(
        self, scope: _Scope, pending: PendingApproval, metadata: Mapping[str, Any], left: str
    ) -> ApprovalAnswer:
        call_id = _text(metadata.get("call_id"))
        arguments = _arguments(scope.context)
        name = _text(getattr(getattr(scope.context, "function", None), "name", None))
        if call_id is None or arguments is None or name is None:
            raise ApprovalNotAsked(
                f"action {pending.action!r} needs approval, but this function invocation has no "
                "call id, tool name or arguments to build a function_approval_request from (it "
                "was not invoked by the agent's function-calling loop)" + left
            )
        occurrence_id = _text(metadata.get("function_call_occurrence_id")) or call_id
        scope.request_id = pending.request_id
        raise _ApprovalPause(pending, call_id, occurrence_id, name, arguments)


def unwrap(error: BaseException) -> BaseException:
    """The exception a ``MiddlewareFailure`` was raised from (e.g. ``ActionDenied``).

    Follows ``__cause__`` only (never ``__context__``), only out of ``MiddlewareFailure``, stops
    at the first other exception and terminates on cycles.
    """
    from agent_framework import MiddlewareFailure

    seen: set[int] = set()
    current = error
    while isinstance(current, MiddlewareFailure) and id(current) not in seen:
        seen.add(id(current))
        cause = current.__cause__
        if cause is None:
            break
        current = cause
    return current


def __getattr__(name: str) -> Any:
    if name == "ApprovalMiddleware":  # imports agent_framework only when asked for
        from ._middleware import ApprovalMiddleware

        return ApprovalMiddleware
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
