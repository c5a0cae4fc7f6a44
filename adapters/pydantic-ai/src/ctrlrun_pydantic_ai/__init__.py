"""ctrlrun for Pydantic AI: ask for a ctrlrun approval through Pydantic AI's deferred tools.

Wire it as
``InterruptApprovalProvider(store, PydanticAIInterrupt(carries_approved_arguments=True))``, give
the agent ``capabilities=[ApprovalScope()]`` and ``output_type=[..., DeferredToolRequests]``, and
call a ``@protect(..., wait=True)`` function from the tool body. On **approve** the tool raises
Pydantic AI's ``ApprovalRequired`` with ``metadata={"ctrlrun": <PendingApproval.to_dict()>}`` and
the run ends with ``DeferredToolRequests``; the caller resumes with ``DeferredToolResults(
approvals={id: True}, metadata={id: {"ctrlrun": {"approver": ..., "arguments": ...}}})``, the
tool body runs again and the interrupt returns the human's answer. This adapter grants nothing
itself: ctrlrun's provider records the answer and ``Control`` re-decides, binds, reserves and
records.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ctrlrun.adapter import ApprovalAnswer, ApprovalNotAsked, PendingApproval
from ctrlrun.errors import InvalidArgument

from . import _calls

if TYPE_CHECKING:
    from ._scope import ApprovalScope

__all__ = [
    "ANSWER_SHAPE",
    "CHANNEL",
    "ApprovalNotAsked",
    "ApprovalScope",
    "PydanticAIInterrupt",
    "__version__",
]

__version__ = "0.1.0"

CHANNEL = "pydantic-ai:deferred-tools"
"""The approver recorded when the answer names nobody (a channel, not a person)."""

ANSWER_SHAPE = (
    "resume with DeferredToolResults(approvals={<tool_call_id>: True}, metadata={<tool_call_id>: "
    '{"ctrlrun": {"approver": "<who answered, a non-empty string>" (optional), '
    '"arguments": {<the arguments shown in DeferredToolRequests.metadata[<tool_call_id>]'
    '["ctrlrun"]["arguments"]>} (required on a grant when carries_approved_arguments=True)}}}); '
    "the call's metadata may be absent and may hold other keys beside \"ctrlrun\", and the "
    '"ctrlrun" entry holds no other keys'
)
"""The accepted shape of a call's ``tool_call_metadata`` on the resumed pass, quoted in refusals."""

_KEYS = frozenset({"approver", "arguments"})


def __getattr__(name: str) -> Any:
    if name == "ApprovalScope":  # defining it imports Pydantic AI: only on first use
        from ._scope import ApprovalScope

        return ApprovalScope
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _refuse(metadata: Any, why: str, where: str) -> InvalidArgument:
    return InvalidArgument(
        f"Pydantic AI tool_call_metadata {metadata!r}{where} is not a ctrlrun approval answer "
        f"({why}); nothing was recorded and nothing ran. Accepted: {ANSWER_SHAPE}"
    )


class PydanticAIInterrupt:
    """A ctrlrun ``FrameworkInterrupt`` over Pydantic AI's ``ApprovalRequired`` deferral.

    ``carries_approved_arguments=True`` (recommended) is **prevention**: the call's metadata must
    carry the arguments the human answered against and they must hash to the pending action.
    ``False`` is **attribution**: the answer's arguments are ignored and what ties the answer to
    the call is the caller-held message history and its ``tool_call_id``.
    """

    framework = "pydantic-ai"

    def __init__(self, *, carries_approved_arguments: bool) -> None:
        if type(carries_approved_arguments) is not bool:
            raise InvalidArgument(
                "PydanticAIInterrupt(carries_approved_arguments=...) must be True (the call's "
                "metadata carries the arguments the human saw: prevention) or False "
                f"(attribution); got {carries_approved_arguments!r}"
            )
        self.carries_approved_arguments = carries_approved_arguments

    def __repr__(self) -> str:
        return f"PydanticAIInterrupt(carries_approved_arguments={self.carries_approved_arguments})"

    def interrupt(self, pending: PendingApproval) -> ApprovalAnswer:
        """Defer the tool call with ``pending`` (first pass), or read the answer (resumed pass).

        The first pass raises Pydantic AI's ``ApprovalRequired``; nothing is caught here.
        """
        request_id = pending.request_id
        left = (
            f"; request {request_id} stays pending (answer it with `ctrlrun approve "
            f"{request_id}` or `ctrlrun deny {request_id}`), nothing was reserved or run"
        )
        call = _calls.current.get()
        if call is None:
            raise ApprovalNotAsked(
                f"action {pending.action!r} needs approval, but it was not called from a Pydantic "
                "AI tool under ctrlrun_pydantic_ai.ApprovalScope, so no human can be asked "
                "through Pydantic AI's deferred tools (add ApprovalScope() to "
                "Agent(capabilities=[...]) and call the protected function from the tool "
                "body)" + left
            )
        tool_call_id = getattr(call.ctx, "tool_call_id", None)
        if call.request_id is not None and call.request_id != request_id:
            raise ApprovalNotAsked(
                f"Pydantic AI tool call {tool_call_id!r} was already put to request "
                f"{call.request_id}; one tool call answers one request, not also "
                f"{pending.action!r} (make one approval-gated protected call per tool)" + left
            )
        call.request_id = request_id
        if getattr(call.ctx, "tool_call_approved", False) is not True:
            from pydantic_ai.exceptions import ApprovalRequired

            raise ApprovalRequired(metadata={"ctrlrun": pending.to_dict()})
        return self.answer(getattr(call.ctx, "tool_call_metadata", None), tool_call_id=tool_call_id)

    def answer(self, metadata: Any, *, tool_call_id: str | None = None) -> ApprovalAnswer:
        """The grant an approved call's ``tool_call_metadata`` stands for, or ``InvalidArgument``.

        Public so a deployment can test its console's metadata. Pydantic AI re-runs a tool only
        once approved, so the answer is always a grant; a refusal never reaches the tool body.
        """
        where = "" if tool_call_id is None else f" for tool call {tool_call_id!r}"
        if metadata is None:
            entry: Mapping[str, Any] = {}
        elif not isinstance(metadata, Mapping):
            raise _refuse(metadata, f"a {type(metadata).__name__} is not a mapping", where)
        else:
            found = metadata.get("ctrlrun")
            if found is None:
                entry = {}
            elif not isinstance(found, Mapping):
                kind = type(found).__name__
                raise _refuse(metadata, f"its 'ctrlrun' entry is a {kind}, not a mapping", where)
            else:
                entry = found
        unknown = sorted(str(key) for key in entry if key not in _KEYS)
        if unknown:
            raise _refuse(metadata, f"unknown key(s) {', '.join(unknown)} in 'ctrlrun'", where)
        approver = entry.get("approver")
        if approver is not None and (not isinstance(approver, str) or not approver.strip()):
            why = f"'approver' must be a non-empty string naming who answered, not {approver!r}"
            raise _refuse(metadata, why, where)
        arguments = entry.get("arguments")
        if arguments is not None and not isinstance(arguments, Mapping):
            raise _refuse(
                metadata, f"'arguments' must be a mapping, not {type(arguments).__name__}", where
            )
        if not self.carries_approved_arguments:
            arguments = None  # attribution: the answer's arguments are never compared
        return ApprovalAnswer(True, approver if approver is not None else CHANNEL, arguments)
