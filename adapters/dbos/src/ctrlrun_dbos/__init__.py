"""ctrlrun for DBOS: a protected call run as durable steps, its approval wait a durable ``recv``.

``protected_step(control, "stripe.refund", effect="refund:{payment_id}")`` turns a function into
one called inside a ``@DBOS.workflow()``: an *attempt* step runs the protected call (the policy,
the effect key, the receipt); on **approve** the workflow publishes the request as the
``ctrlrun.pending`` event and waits in ``DBOS.recv`` for the answer that ``answer()`` sends, which
an *answer* step hands to ctrlrun's provider; the attempt then runs again with the approval. The
request is made once (the attempt's output is checkpointed) and the wait survives the process.
The effect key, not DBOS, makes the effect happen at most once when a step re-runs on recovery.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, ParamSpec, TypeVar, cast

from ctrlrun import protect
from ctrlrun.adapter import ApprovalAnswer, ApprovalNotAsked, PendingApproval, banner
from ctrlrun.errors import DuplicateEffect, InvalidArgument, NotExecuted

from . import _wire
from ._wire import CHANNEL, PENDING_EVENT, REFUSED_EVENT, topic

__all__ = [
    "ANSWER_SHAPE",
    "CHANNEL",
    "PENDING_EVENT",
    "REFUSED_EVENT",
    "DBOSInterrupt",
    "__version__",
    "answer",
    "protected_step",
    "topic",
]

__version__ = "0.1.0"

ANSWER_SHAPE = (
    'a DBOS answer is {"approved": true|false, "approver": "<who answered>" (optional), '
    '"arguments": {<the arguments shown in the ctrlrun.pending event>} (required on a grant '
    'when carries_approved_arguments=True)}, or {"recheck": true} after `ctrlrun approve`'
)
"""The accepted messages, quoted in every refusal of a malformed one."""

P = ParamSpec("P")
R = TypeVar("R")

_KEYS = frozenset({"approved", "approver", "arguments"})
_DEFAULT_STEP_OPTIONS: dict[str, Any] = {
    "retries_allowed": True, "max_attempts": 10, "interval_seconds": 1.0, "backoff_rate": 2.0,
}  # fmt: skip
_STEP_OPTIONS = frozenset({"retries_allowed", "interval_seconds", "max_attempts", "backoff_rate",
                           "should_retry"})  # fmt: skip


def _refuse(message: Any, why: str) -> InvalidArgument:
    return InvalidArgument(
        f"DBOS message {message!r} is not an approval answer ({why}); nothing was recorded and "
        f"the workflow waits on. Send {ANSWER_SHAPE}"
    )


class DBOSInterrupt:
    """A ctrlrun ``FrameworkInterrupt`` over the message a ``protected_step`` workflow received.

    ``carries_approved_arguments=True`` (recommended) is **prevention**: a grant must echo the
    arguments the human answered against, and ctrlrun re-hashes them against the request.
    """

    framework = "dbos"

    def __init__(self, *, carries_approved_arguments: bool) -> None:
        if type(carries_approved_arguments) is not bool:
            raise InvalidArgument(
                "DBOSInterrupt(carries_approved_arguments=...) must be True (the message echoes "
                "the arguments the human saw: prevention) or False (attribution); got "
                f"{carries_approved_arguments!r}"
            )
        self.carries_approved_arguments = carries_approved_arguments

    def __repr__(self) -> str:
        return f"DBOSInterrupt(carries_approved_arguments={self.carries_approved_arguments})"

    def interrupt(self, pending: PendingApproval) -> ApprovalAnswer:
        """The answer in the message the workflow received for ``pending``."""
        message = _wire.message.get()
        if message is _wire.NO_MESSAGE:
            raise ApprovalNotAsked(
                f"approval {pending.request_id}: DBOSInterrupt answers only inside a "
                "protected_step's answer step (send the answer with ctrlrun_dbos.answer); "
                "nothing was granted and the request is still pending"
            )
        return self.answer(message)

    def answer(self, message: Any) -> ApprovalAnswer:
        """The ``ApprovalAnswer`` a message stands for, ``ApprovalNotAsked`` for a re-check, or
        ``InvalidArgument``."""
        if not isinstance(message, Mapping):
            raise _refuse(message, f"a {type(message).__name__} is not a mapping")
        if set(message) == {"recheck"} and message["recheck"] is True:
            raise ApprovalNotAsked(
                "the message asks to re-check the request, and it is not answered in ctrlrun "
                "yet (`ctrlrun approve` it, then send the re-check again); nothing was granted"
            )
        unknown = sorted(str(key) for key in message if key not in _KEYS)
        if unknown:
            raise _refuse(message, f"unknown key(s) {', '.join(unknown)}")
        verdict = message.get("approved")
        if type(verdict) is not bool:
            raise _refuse(message, f"'approved' must be true or false, not {verdict!r}")
        approver = message.get("approver")
        if approver is not None and (not isinstance(approver, str) or not approver.strip()):
            raise _refuse(message, f"'approver' must be a non-blank string, not {approver!r}")
        arguments = message.get("arguments")
        if arguments is not None and not isinstance(arguments, Mapping):
            raise _refuse(message, f"'arguments' must be a mapping, not {type(arguments).__name__}")
        return ApprovalAnswer(
            verdict, approver or CHANNEL, arguments if self.carries_approved_arguments else None
        )


def answer(
    client: Any, workflow_id: str, *, approved: bool, approver: str | None = None,
    arguments: Mapping[str, Any] | None = None,
) -> str:  # fmt: skip
    """Send the answer to the request ``workflow_id`` is waiting on (its ``ctrlrun.pending``
    event), keyed by the request and the approver: sent twice, it is delivered once (a corrected
    answer after a refusal goes by ``client.send`` on ``topic(request_id)``). Returns the request id."""
    if type(approved) is not bool:
        raise InvalidArgument(f"answer(approved=...) must be True or False, got {approved!r}")
    pending = client.get_event(workflow_id, PENDING_EVENT, timeout_seconds=0)
    if not isinstance(pending, Mapping) or not isinstance(pending.get("request_id"), str):
        raise InvalidArgument(
            f"workflow {workflow_id!r} has published no pending ctrlrun request (no "
            f"{PENDING_EVENT!r} event); nothing was sent"
        )
    request_id: str = pending["request_id"]
    message: dict[str, Any] = {"approved": approved}
    if approver is not None:
        message["approver"] = approver
    if arguments is not None:
        message["arguments"] = dict(arguments)
    client.send(workflow_id, message, topic(request_id),
                idempotency_key=f"{request_id}:{approver or CHANNEL}")  # fmt: skip
    return request_id


def _retry_predicate(caller: Callable[[BaseException], Any] | None) -> Callable[[BaseException], bool]:
    def should_retry(error: BaseException) -> bool:
        retryable = isinstance(error, NotExecuted) or (
            isinstance(error, DuplicateEffect) and error.state == "in_progress"
        )
        return retryable and (caller is None or bool(caller(error)))

    return should_retry


def protected_step(
    control: Any,
    action: str,
    *,
    effect: str | None = None,
    resource: str | None = None,
    lease: timedelta | None = None,
    reconcile: Callable[..., Any] | None = None,
    reconcile_eagerly: bool = False,
    task: str | None = None,
    hop: str | None = None,
    replay: bool = True,
    name: str | None = None,
    **step_options: Any,
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Protect a function (``def`` or ``async def``) and run it as DBOS steps of the workflow
    that calls it.

    ``step_options`` go to the attempt step's ``@DBOS.step`` (defaults: ``retries_allowed=True,
    max_attempts=10``, waits from 1 s doubling); it retries only ``NotExecuted`` and an effect
    held by another attempt, and only where the caller's ``should_retry`` agrees. ``replay``: a
    committed effect of this same action with an exact result returns that result.
    """
    interrupt = getattr(getattr(control, "approvals", None), "interrupt", None)
    if not isinstance(interrupt, DBOSInterrupt):
        raise InvalidArgument(
            f"protected_step({action!r}) needs a Control whose approvals are "
            "InterruptApprovalProvider(store, DBOSInterrupt(carries_approved_arguments=True)); "
            f"got {type(getattr(control, 'approvals', None)).__name__}"
        )
    if type(replay) is not bool:
        raise InvalidArgument(f"protected_step({action!r}): replay must be True or False")
    unknown = sorted(set(step_options) - _STEP_OPTIONS)
    if unknown:
        raise InvalidArgument(
            f"protected_step({action!r}): unknown step option(s) {', '.join(unknown)}; it takes "
            "retries_allowed, interval_seconds, max_attempts, backoff_rate and should_retry"
        )
    options = {**_DEFAULT_STEP_OPTIONS, **step_options}
    options["should_retry"] = _retry_predicate(options.get("should_retry"))
    banner(control)

    def decorate(function: Callable[P, R]) -> Callable[P, R]:
        from ._steps import ProtectedCall, async_runner, sync_runner

        protected = protect(
            action, effect=effect, resource=resource, lease=lease, reconcile=reconcile,
            reconcile_eagerly=reconcile_eagerly, task=task, hop=hop, wait=False, control=control,
        )(function)  # fmt: skip
        call = ProtectedCall(control, protected, replay, function.__qualname__)
        runner = async_runner if inspect.iscoroutinefunction(function) else sync_runner
        return cast(Callable[P, R], runner(call, function, name or function.__qualname__, options))

    return decorate
