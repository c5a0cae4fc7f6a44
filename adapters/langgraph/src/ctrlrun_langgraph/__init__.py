"""ctrlrun for LangGraph: ask for a ctrlrun approval through LangGraph's own ``interrupt()``.

Wire it as ``InterruptApprovalProvider(store, LangGraphInterrupt(carries_approved_arguments=True))``
and protect the node's consequential call with ``@protect(..., wait=True)``. On **approve** the
node pauses with the ``PendingApproval`` payload; ``Command(resume=...)`` carries the human's
answer back. This adapter grants nothing itself: ctrlrun's provider records the answer and
``Control`` re-decides, binds, reserves and records.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ctrlrun.adapter import ApprovalAnswer, PendingApproval
from ctrlrun.errors import InvalidArgument

__all__ = ["CHANNEL", "RESUME_SHAPE", "LangGraphInterrupt", "__version__"]

__version__ = "0.1.0"

CHANNEL = "langgraph:interrupt"
"""The approver recorded when the resume value names nobody (a channel, not a person)."""

RESUME_SHAPE = (
    "Command(resume=...) accepts: True (grant), False (refusal), or "
    '{"approved": True|False, "approver": "<who answered>" (optional), '
    '"arguments": {<the arguments shown in the interrupt payload>} '
    "(required on a grant when carries_approved_arguments=True), "
    '"edited_arguments": {<the arguments approved instead>} (optional, a grant with edits)}'
)
"""The accepted resume values, quoted in every refusal of a malformed one."""

_KEYS = frozenset({"approved", "approver", "arguments", "edited_arguments"})


def _refuse(resume: Any, why: str) -> InvalidArgument:
    return InvalidArgument(
        f"LangGraph resume value {resume!r} is not an approval answer ({why}); nothing was "
        f"recorded and nothing ran. {RESUME_SHAPE}"
    )


class LangGraphInterrupt:
    """A ctrlrun ``FrameworkInterrupt`` over ``langgraph.types.interrupt``.

    ``carries_approved_arguments=True`` (recommended) is **prevention**: the resume value must
    carry the arguments the human answered against and they must hash to the pending action.
    ``False`` is **attribution**: the binding across the pause is LangGraph's checkpoint.
    """

    framework = "langgraph"

    def __init__(self, *, carries_approved_arguments: bool) -> None:
        if type(carries_approved_arguments) is not bool:
            raise InvalidArgument(
                "LangGraphInterrupt(carries_approved_arguments=...) must be True (the resume "
                "value carries the arguments the human saw: prevention) or False "
                f"(attribution); got {carries_approved_arguments!r}"
            )
        self.carries_approved_arguments = carries_approved_arguments

    def __repr__(self) -> str:
        return f"LangGraphInterrupt(carries_approved_arguments={self.carries_approved_arguments})"

    def interrupt(self, pending: PendingApproval) -> ApprovalAnswer:
        """Pause the graph with ``pending.to_dict()``; on resume, turn the value into an answer.

        The first pass raises LangGraph's ``GraphInterrupt`` (the graph checkpoints); nothing is
        caught here.
        """
        from langgraph.types import interrupt

        return self.answer(interrupt(pending.to_dict()))

    def answer(self, resume: Any) -> ApprovalAnswer:
        """The ``ApprovalAnswer`` for a ``Command(resume=...)`` value, or ``InvalidArgument``."""
        if type(resume) is bool:
            if resume and self.carries_approved_arguments:
                raise _refuse(
                    resume,
                    "a bare True carries no arguments, and this interrupt binds approvals to "
                    "the arguments the human saw",
                )
            return ApprovalAnswer(resume, CHANNEL)
        if not isinstance(resume, Mapping):
            raise _refuse(resume, f"a {type(resume).__name__} is neither a bool nor a mapping")
        unknown = sorted(str(key) for key in resume if key not in _KEYS)
        if unknown:
            raise _refuse(resume, f"unknown key(s) {', '.join(unknown)}")
        if "approved" not in resume:
            raise _refuse(resume, "it has no 'approved' key")
        verdict = resume["approved"]
        if type(verdict) is not bool:
            raise _refuse(resume, f"'approved' must be true or false, not {verdict!r}")
        approver = resume.get("approver") or CHANNEL
        arguments = resume.get("arguments")
        if arguments is not None and not isinstance(arguments, Mapping):
            raise _refuse(resume, f"'arguments' must be a mapping, not {type(arguments).__name__}")
        edited = resume.get("edited_arguments")
        if edited is not None and not isinstance(edited, Mapping):
            raise _refuse(resume, f"'edited_arguments' must be a mapping, not {type(edited).__name__}")
        if edited is not None and verdict is not True:
            raise _refuse(resume, "'edited_arguments' go with approved: true")
        if not self.carries_approved_arguments:
            arguments = None  # attribution: the answer's arguments are never compared
        return ApprovalAnswer(verdict, approver, arguments, edited)
