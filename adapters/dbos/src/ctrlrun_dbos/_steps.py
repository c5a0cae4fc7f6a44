"""One protected call as DBOS steps: the attempt, the durable wait, the answer; sync and async."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from ctrlrun import with_approval
from ctrlrun.adapter import ApprovalNotAsked, PendingApproval
from ctrlrun.approvals import ApprovalStatus
from ctrlrun.errors import (
    ApprovalMismatch,
    ApprovalRequired,
    ApprovalTimeout,
    DuplicateEffect,
    InvalidArgument,
)

from . import _wire

Outcome = dict[str, Any]  # the attempt's checkpointed output: {"value": v} or {"request": payload}


class ProtectedCall:
    """What the steps of one protected function share."""

    def __init__(self, control: Any, protected: Callable[..., Any], replay: bool, qualname: str) -> None:
        self.control = control
        self.protected = protected
        self.replay = replay
        self.qualname = qualname

    def consumed(self, request_id: str | None) -> bool:
        """Whether the request was spent (a re-run after the consuming attempt presents nothing)."""
        if request_id is None:
            return True
        record = self.control.store.get_approval(request_id)
        return record is not None and record.status is ApprovalStatus.CONSUMED

    def asked(self, asked: ApprovalRequired) -> Outcome:
        record = self.control.store.get_approval(asked.request_id)
        return {"request": PendingApproval.of(record).to_dict()}

    def refused(self, refused: DuplicateEffect) -> Outcome:
        if self.replay and refused.state == "committed" and refused.replayable:
            return {"value": refused.result}
        raise refused

    def answer(self, request_id: str, received: Any) -> Any:
        """The answer step: ``"granted"``, ``"denied"`` or ``{"refused": "<Type>: <message>"}``."""
        reset = _wire.message.set(received)
        try:
            approval = self.control.approvals.wait(request_id)
        except (ApprovalNotAsked, ApprovalMismatch, InvalidArgument) as refused:
            return {"refused": f"{type(refused).__name__}: {refused}"}
        finally:
            _wire.message.reset(reset)
        return "granted" if approval is not None else "denied"

    def check_in_workflow(self, dbos: Any) -> None:
        if dbos.workflow_id is None or dbos.step_id is not None:
            raise InvalidArgument(
                f"{self.qualname} is a ctrlrun protected_step: call it inside a "
                "@DBOS.workflow() function (it runs as that workflow's steps)"
            )


def _left(pending: dict[str, Any]) -> float:
    expires_at = datetime.fromisoformat(pending["expires_at"])
    return max((expires_at - datetime.now(UTC)).total_seconds(), 0.0)


def _timeout(pending: dict[str, Any]) -> ApprovalTimeout:
    request_id = pending["request_id"]
    return ApprovalTimeout(
        f"approval request {request_id} got no answer on DBOS topic {_wire.topic(request_id)!r} "
        f"before it expired at {pending['expires_at']}; nothing ran and the request is still "
        "pending",
        request_id=request_id,
    )


def sync_runner(call: ProtectedCall, function: Callable[..., Any], name: str, options: dict[str, Any]) -> Callable[..., Any]:
    """The workflow-side function of a ``def`` protected step."""
    from dbos import DBOS

    def attempt(request_id: str | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Outcome:
        try:
            if call.consumed(request_id):
                value = call.protected(*args, **kwargs)
            else:
                assert request_id is not None
                with with_approval(request_id):
                    value = call.protected(*args, **kwargs)
        except ApprovalRequired as asked:
            return call.asked(asked)
        except DuplicateEffect as refused:
            return call.refused(refused)
        return {"value": value}

    def answer(request_id: str, received: Any) -> Any:
        return call.answer(request_id, received)

    attempt_step = DBOS.step(name=name, **options)(attempt)
    answer_step = DBOS.step(name=name + ".answer")(answer)  # DBOS steps are functions, not methods

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        call.check_in_workflow(DBOS)
        out = attempt_step(None, args, dict(kwargs))
        while "request" in out:
            pending = out["request"]
            request_id = pending["request_id"]
            DBOS.set_event(_wire.PENDING_EVENT, pending)
            while True:
                received = DBOS.recv(_wire.topic(request_id), timeout_seconds=_left(pending))
                if received is None:
                    raise _timeout(pending)
                said = answer_step(request_id, received)
                if not isinstance(said, dict):
                    break
                DBOS.set_event(_wire.REFUSED_EVENT, {"request_id": request_id, **said})
            out = attempt_step(request_id, args, dict(kwargs))
        return out["value"]

    return run


def async_runner(call: ProtectedCall, function: Callable[..., Any], name: str, options: dict[str, Any]) -> Callable[..., Any]:
    """The workflow-side coroutine function of an ``async def`` protected step; the store work
    of the steps runs in a worker thread, off the event loop."""
    from dbos import DBOS

    async def attempt(request_id: str | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Outcome:
        try:
            if await asyncio.to_thread(call.consumed, request_id):
                value = await call.protected(*args, **kwargs)
            else:
                assert request_id is not None
                with with_approval(request_id):
                    value = await call.protected(*args, **kwargs)
        except ApprovalRequired as asked:
            return await asyncio.to_thread(call.asked, asked)
        except DuplicateEffect as refused:
            return call.refused(refused)
        return {"value": value}

    async def answer(request_id: str, received: Any) -> Any:
        return await asyncio.to_thread(call.answer, request_id, received)  # copies the context

    attempt_step = DBOS.step(name=name, **options)(attempt)
    answer_step = DBOS.step(name=name + ".answer")(answer)

    @functools.wraps(function)
    async def run(*args: Any, **kwargs: Any) -> Any:
        call.check_in_workflow(DBOS)
        out = await attempt_step(None, args, dict(kwargs))
        while "request" in out:
            pending = out["request"]
            request_id = pending["request_id"]
            await DBOS.set_event_async(_wire.PENDING_EVENT, pending)
            while True:
                received = await DBOS.recv_async(_wire.topic(request_id), timeout_seconds=_left(pending))
                if received is None:
                    raise _timeout(pending)
                said = await answer_step(request_id, received)
                if not isinstance(said, dict):
                    break
                await DBOS.set_event_async(_wire.REFUSED_EVENT, {"request_id": request_id, **said})
            out = await attempt_step(request_id, args, dict(kwargs))
        return out["value"]

    return run
