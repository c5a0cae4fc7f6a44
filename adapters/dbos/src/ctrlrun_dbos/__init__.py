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

import functools
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from datetime import UTC, datetime, timedelta
from typing import Any, ParamSpec, TypeVar, cast

from ctrlrun import protect, with_approval
from ctrlrun.adapter import ApprovalAnswer, ApprovalNotAsked, PendingApproval, banner
from ctrlrun.approvals import ApprovalStatus
from ctrlrun.errors import (
    ApprovalMismatch,
    ApprovalRequired,
    ApprovalTimeout,
    DuplicateEffect,
    InvalidArgument,
    NotExecuted,
)

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

CHANNEL = "dbos:recv"
"""The approver recorded when the answer names nobody (a channel, not a person)."""

PENDING_EVENT = "ctrlrun.pending"
"""The workflow event holding the pending request (``PendingApproval.to_dict()``)."""

REFUSED_EVENT = "ctrlrun.refused"
"""The workflow event set when an answer was refused (``{"request_id", "refused"}``); it waits on."""

ANSWER_SHAPE = (
    'a DBOS answer is {"approved": true|false, "approver": "<who answered>" (optional), '
    '"arguments": {<the arguments shown in the ctrlrun.pending event>} (required on a grant '
    'when carries_approved_arguments=True)}, or {"recheck": true} after `ctrlrun approve`'
)
"""The accepted messages, quoted in every refusal of a malformed one."""

P = ParamSpec("P")
R = TypeVar("R")

_KEYS = frozenset({"approved", "approver", "arguments"})
_NO_MESSAGE: Any = object()
_message: ContextVar[Any] = ContextVar("ctrlrun_dbos_message", default=_NO_MESSAGE)
_DEFAULT_STEP_OPTIONS: dict[str, Any] = {
    "retries_allowed": True, "max_attempts": 10, "interval_seconds": 1.0, "backoff_rate": 2.0,
}  # fmt: skip


def topic(request_id: str) -> str:
    """The ``DBOS.recv`` topic a pending request's answer is sent on."""
    if not isinstance(request_id, str) or not request_id:
        raise InvalidArgument(f"topic(request_id) needs a request id, got {request_id!r}")
    return "ctrlrun:" + request_id


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
        message = _message.get()
        if message is _NO_MESSAGE:
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
    """Protect a function and run it as DBOS steps of the workflow that calls it.

    ``step_options`` go to the attempt step's ``@DBOS.step`` (defaults: ``retries_allowed=True,
    max_attempts=10``, waits from 1 s doubling); it retries only ``NotExecuted`` and an effect
    held by another attempt, and only where the caller's ``should_retry`` agrees. ``replay``: a
    committed effect of this same action with an exact result returns that result.
    """
    from dbos import DBOS

    interrupt = getattr(getattr(control, "approvals", None), "interrupt", None)
    if not isinstance(interrupt, DBOSInterrupt):
        raise InvalidArgument(
            f"protected_step({action!r}) needs a Control whose approvals are "
            "InterruptApprovalProvider(store, DBOSInterrupt(carries_approved_arguments=True)); "
            f"got {type(getattr(control, 'approvals', None)).__name__}"
        )
    if type(replay) is not bool:
        raise InvalidArgument(f"protected_step({action!r}): replay must be True or False")
    unknown = sorted(set(step_options) - {"retries_allowed", "interval_seconds", "max_attempts",
                                          "backoff_rate", "should_retry"})  # fmt: skip
    if unknown:
        raise InvalidArgument(
            f"protected_step({action!r}): unknown step option(s) {', '.join(unknown)}; it takes "
            "retries_allowed, interval_seconds, max_attempts, backoff_rate and should_retry"
        )
    options = {**_DEFAULT_STEP_OPTIONS, **step_options}
    options["should_retry"] = _retry_predicate(options.get("should_retry"))
    banner(control)

    def decorate(function: Callable[P, R]) -> Callable[P, R]:
        import inspect

        if inspect.iscoroutinefunction(function):
            raise InvalidArgument(
                f"protected_step({action!r}): {function.__qualname__} is async; this version "
                "runs def functions as DBOS steps"
            )
        protected = protect(
            action, effect=effect, resource=resource, lease=lease, reconcile=reconcile,
            reconcile_eagerly=reconcile_eagerly, task=task, hop=hop, wait=False, control=control,
        )(function)  # fmt: skip
        step_name = name or function.__qualname__

        def attempt(request_id: str | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
            present = request_id is not None and not _consumed(control, request_id)
            try:
                if present:
                    assert request_id is not None
                    with with_approval(request_id):
                        value = protected(*args, **kwargs)
                else:
                    value = protected(*args, **kwargs)
            except ApprovalRequired as asked:
                record = control.store.get_approval(asked.request_id)
                return {"request": PendingApproval.of(record).to_dict()}
            except DuplicateEffect as refused:
                if replay and refused.state == "committed" and refused.replayable:
                    return {"value": refused.result}
                raise
            return {"value": value}

        def answer_step(request_id: str, message: Any) -> Any:
            reset = _message.set(message)
            try:
                approval = control.approvals.wait(request_id)
            except (ApprovalNotAsked, ApprovalMismatch, InvalidArgument) as refused:
                return {"refused": f"{type(refused).__name__}: {refused}"}
            finally:
                _message.reset(reset)
            return "granted" if approval is not None else "denied"

        attempt_step = DBOS.step(name=step_name, **options)(attempt)
        answer_step_ = DBOS.step(name=step_name + ".answer")(answer_step)

        @functools.wraps(function)
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            if DBOS.workflow_id is None or DBOS.step_id is not None:
                raise InvalidArgument(
                    f"{function.__qualname__} is a ctrlrun protected_step: call it inside a "
                    "@DBOS.workflow() function (it runs as that workflow's steps)"
                )
            out = attempt_step(None, args, dict(kwargs))
            while "request" in out:
                pending = out["request"]
                request_id = pending["request_id"]
                DBOS.set_event(PENDING_EVENT, pending)
                expires_at = datetime.fromisoformat(pending["expires_at"])
                while True:
                    left = (expires_at - datetime.now(UTC)).total_seconds()
                    message = DBOS.recv(topic(request_id), timeout_seconds=max(left, 0.0))
                    if message is None:
                        raise ApprovalTimeout(
                            f"approval request {request_id} got no answer on DBOS topic "
                            f"{topic(request_id)!r} before it expired at {pending['expires_at']}; "
                            "nothing ran and the request is still pending",
                            request_id=request_id,
                        )
                    said = answer_step_(request_id, message)
                    if isinstance(said, dict):
                        DBOS.set_event(REFUSED_EVENT, {"request_id": request_id, **said})
                        continue
                    break
                out = attempt_step(request_id, args, dict(kwargs))
            return cast(R, out["value"])

        return run

    return decorate


def _consumed(control: Any, request_id: str) -> bool:
    record = control.store.get_approval(request_id)
    return record is not None and record.status is ApprovalStatus.CONSUMED

