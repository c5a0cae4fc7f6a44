"""Framework adapters' core: ask the human through an agent framework's own interrupt.

An adapter implements ``FrameworkInterrupt``; the operator wires it as
``InterruptApprovalProvider(store, interrupt)`` into a ``Control``. Policy, principal, hash
binding, reservation and receipts stay in ``Control``: the provider only records the human's
answer with the same store calls ``ctrlrun approve`` / ``ctrlrun deny`` make (06 §1).
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, runtime_checkable, cast

from .control.options import ReadOnly
from ._time import utc_now
from .action import Action, check_value, freeze, thaw
from .approvals.records import (
    DEFAULT_APPROVAL_TTL,
    Approval,
    ApprovalRecord,
    ApprovalRequest,
    ApprovalStatus,
    build_request,
)
from .effects.records import EffectState, check_line_text, plan_reservation
from .errors import ApprovalMismatch, ApprovalTimeout, CTRLRunError, EffectKeyError, InvalidArgument
from .policy import Decision, render_effect_key, render_resource

__all__ = [
    "OBSERVE_BANNER",
    "ApprovalAnswer",
    "ApprovalNotAsked",
    "FrameworkInterrupt",
    "InterruptApprovalProvider",
    "PendingApproval",
    "banner",
    "needs_approval",
    "observing",
]

log = logging.getLogger("ctrlrun")

OBSERVE_BANNER = "OBSERVE MODE - nothing is enforced"

_ANSWERED = frozenset({ApprovalStatus.DENIED, ApprovalStatus.CONSUMED, ApprovalStatus.EXPIRED})


class ApprovalNotAsked(CTRLRunError, RuntimeError):
    """The framework holds no human answer for this exact request; nothing was granted or denied.

    The request stays ``pending`` (``ctrlrun approve`` can still answer it), nothing is reserved
    and the protected function does not run.
    """


# --------------------------------------------------------------------------- the payload


def _utc(moment: Any, what: str) -> datetime:
    if not isinstance(moment, datetime) or moment.utcoffset() is None:
        raise InvalidArgument(
            f"PendingApproval {what} must be a timezone-aware datetime, got {moment!r}"
        )
    return moment.astimezone(UTC)


def _text(value: Any, what: str, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str) or not value:
        kind = "a non-empty string or None" if optional else "a non-empty string"
        raise InvalidArgument(f"PendingApproval {what} must be {kind}, got {value!r}")


@dataclass(frozen=True)
class PendingApproval:
    """What a framework interrupt is handed: a JSON-safe value, never a handle.

    ``to_dict()`` is the payload a framework checkpoints (exactly 11 keys, JSON types only).
    """

    request_id: str
    action_id: str
    action: str
    action_hash: str
    arguments: Mapping[str, Any]
    resource: str | None
    environment: str
    agent: str
    user: str | None
    created_at: datetime
    expires_at: datetime

    def __post_init__(self) -> None:
        for what in ("request_id", "action_id", "action", "action_hash", "environment", "agent"):
            _text(getattr(self, what), what)
        _text(self.resource, "resource", optional=True)
        _text(self.user, "user", optional=True)
        if not isinstance(self.arguments, Mapping):
            raise InvalidArgument(
                f"PendingApproval arguments must be a mapping, got {type(self.arguments).__name__}"
            )
        check_value(self.arguments, "PendingApproval arguments")
        object.__setattr__(self, "arguments", freeze(self.arguments))
        object.__setattr__(self, "created_at", _utc(self.created_at, "created_at"))
        object.__setattr__(self, "expires_at", _utc(self.expires_at, "expires_at"))

    @classmethod
    def of(cls, record: ApprovalRecord | ApprovalRequest) -> PendingApproval:
        """The payload for a stored request (an ``ApprovalRecord`` or its ``ApprovalRequest``)."""
        request = record.request if isinstance(record, ApprovalRecord) else record
        if not isinstance(request, ApprovalRequest):
            raise InvalidArgument(
                f"PendingApproval.of needs an ApprovalRecord or ApprovalRequest, got {record!r}"
            )
        action = request.action
        return cls(
            request_id=request.request_id,
            action_id=action.action_id,
            action=action.name,
            action_hash=request.action_hash,
            arguments=action.canonical_arguments,
            resource=action.resource,
            environment=action.environment,
            agent=action.principal.agent,
            user=action.principal.user,
            created_at=request.created_at,
            expires_at=request.expires_at,
        )

    def to_dict(self) -> dict[str, Any]:
        """The checkpointable payload: ``json.loads(json.dumps(d)) == d``."""
        return {
            "request_id": self.request_id,
            "action_id": self.action_id,
            "action": self.action,
            "action_hash": self.action_hash,
            "arguments": thaw(self.arguments),
            "resource": self.resource,
            "environment": self.environment,
            "agent": self.agent,
            "user": self.user,
            "created_at": self.created_at.isoformat(),
            "expires_at": self.expires_at.isoformat(),
        }


# --------------------------------------------------------------------------- the answer


def _check_answer_fields(granted: Any, approver: Any, approved_arguments: Any) -> None:
    if type(granted) is not bool:
        raise InvalidArgument(
            f"ApprovalAnswer granted must be True or False, got {granted!r} "
            f"({type(granted).__name__}); a truthy value is never a grant"
        )
    if not isinstance(approver, str) or not approver.strip():
        raise InvalidArgument(
            f"ApprovalAnswer approver must be a non-blank string naming who answered (or the "
            f"channel, e.g. 'langgraph:interrupt'), got {approver!r}"
        )
    check_line_text(approver, "ApprovalAnswer approver")
    if approved_arguments is not None and not isinstance(approved_arguments, Mapping):
        raise InvalidArgument(
            "ApprovalAnswer approved_arguments must be a mapping of the arguments the human "
            f"answered against, or None; got {type(approved_arguments).__name__}"
        )


def _check_edit_fields(granted: Any, edited_arguments: Any) -> None:
    if edited_arguments is None:
        return
    if not isinstance(edited_arguments, Mapping):
        raise InvalidArgument(
            "ApprovalAnswer edited_arguments must be a mapping of the arguments the human "
            f"approved instead, or None; got {type(edited_arguments).__name__}"
        )
    if granted is not True:
        raise InvalidArgument("ApprovalAnswer edited_arguments go with a grant, not a refusal")


@dataclass(frozen=True)
class ApprovalAnswer:
    """A human's verdict as the framework recorded it.

    ``granted`` is a real ``bool``; ``approver`` names the person, or the channel when the
    framework does not identify one; ``approved_arguments`` are the arguments the human answered
    against, taken from the framework's own record (``None`` when it has none);
    ``edited_arguments``, on a grant, are the arguments the human approved instead (an edit).
    """

    granted: bool
    approver: str
    approved_arguments: Mapping[str, Any] | None = None
    edited_arguments: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        _check_answer_fields(self.granted, self.approver, self.approved_arguments)
        _check_edit_fields(self.granted, self.edited_arguments)
        if self.approved_arguments is not None:
            object.__setattr__(self, "approved_arguments", freeze(self.approved_arguments))
        if self.edited_arguments is not None:
            object.__setattr__(self, "edited_arguments", freeze(self.edited_arguments))


# --------------------------------------------------------------------------- the protocol


@runtime_checkable
class FrameworkInterrupt(Protocol):
    """What an adapter implements: put ``pending`` to a human, return the answer."""

    framework: str
    carries_approved_arguments: bool

    def interrupt(self, pending: PendingApproval) -> ApprovalAnswer: ...


_ABSENT = object()


class InterruptApprovalProvider:
    """An ``ApprovalProvider`` whose ``wait()`` asks through a framework's interrupt."""

    def __init__(
        self,
        store: Any,
        interrupt: FrameworkInterrupt,
        *,
        clock: Callable[[], datetime] = utc_now,
        policy: Any = None,
    ) -> None:
        framework = getattr(interrupt, "framework", _ABSENT)
        if not isinstance(framework, str) or not framework.strip():
            raise InvalidArgument(
                f"InterruptApprovalProvider: interrupt.framework must be a non-empty string "
                f"naming the framework, got {('<absent>' if framework is _ABSENT else framework)!r}"
            )
        carries = getattr(interrupt, "carries_approved_arguments", _ABSENT)
        if type(carries) is not bool:
            raise InvalidArgument(
                "InterruptApprovalProvider: interrupt.carries_approved_arguments must be True "
                "(the framework returns the arguments the human saw: prevention) or False "
                "(attribution); got "
                + ("<absent>" if carries is _ABSENT else repr(carries))
            )
        if not callable(getattr(interrupt, "interrupt", None)):
            raise InvalidArgument(
                "InterruptApprovalProvider: interrupt.interrupt(pending) must be callable"
            )
        if not callable(clock):
            raise InvalidArgument("InterruptApprovalProvider: clock must be callable")
        for method in ("get_approval", "put_approval_request", "grant_approval", "deny_approval"):
            if not callable(getattr(store, method, None)):
                raise InvalidArgument(
                    f"InterruptApprovalProvider needs a ctrlrun StateStore (no {method}()); "
                    f"got {type(store).__name__}"
                )
        self._store = store
        self._interrupt = interrupt
        self._clock = clock
        self._policy = policy

    store = ReadOnly[Any]("_store")
    interrupt = ReadOnly[FrameworkInterrupt]("_interrupt")
    clock = ReadOnly[Callable[[], datetime]]("_clock")

    @property
    def framework(self) -> str:
        return self._interrupt.framework

    @property
    def carries_approved_arguments(self) -> bool:
        return self._interrupt.carries_approved_arguments

    def request(
        self,
        action: Action,
        ttl: timedelta | None = DEFAULT_APPROVAL_TTL,
        *,
        policy_hash: str | None = None,
        precondition_fingerprint: str | None = None,
    ) -> ApprovalRequest:
        """Store a new ``pending`` request for ``action`` and return it (``Control`` calls this)."""
        request = build_request(action, ttl, self._clock(), policy_hash=policy_hash,
                                precondition_fingerprint=precondition_fingerprint)  # fmt: skip
        self._store.put_approval_request(request)
        return request

    def wait(self, request_id: str, timeout: timedelta | float | None = None) -> Approval | None:
        """Ask through the interrupt; the approval once granted, ``None`` once refused."""
        limit = _as_timedelta(timeout)
        record = self._store.get_approval(request_id)
        if record is None:
            raise ApprovalMismatch(
                f"approval {request_id} is unknown to this store (`ctrlrun pending` lists open "
                "requests)",
                reason="unknown",
                approval_id=request_id,
            )
        if record.status is ApprovalStatus.GRANTED:
            return cast(Approval, record.as_approval())  # answered out of band (`ctrlrun approve`)
        if record.status in _ANSWERED:
            return None

        started = self._clock()
        timeout_at = None if limit is None else started + limit

        def past(now: datetime) -> bool:
            return now > record.expires_at or (timeout_at is not None and now >= timeout_at)

        if past(started):
            raise ApprovalTimeout(request_id=request_id)

        pending = PendingApproval.of(record)
        answer = self._interrupt.interrupt(pending)  # exceptions propagate untouched

        if not isinstance(answer, ApprovalAnswer):
            raise InvalidArgument(
                f"{self.framework} interrupt returned {answer!r}, not a ctrlrun ApprovalAnswer; "
                "nothing was recorded"
            )
        # A frozen dataclass can still be forged; check the fields again before any write.
        _check_answer_fields(answer.granted, answer.approver, answer.approved_arguments)
        edits = getattr(answer, "edited_arguments", None)
        _check_edit_fields(answer.granted, edits)
        if edits is not None and self._policy is None:
            raise InvalidArgument(
                f"the {self.framework} answer approves edited arguments, but this "
                "InterruptApprovalProvider has no policy to re-check them; build it with "
                "policy=<the Control's Policy>. Nothing was recorded"
            )
        if answer.granted and self.carries_approved_arguments:
            self._check_binding(record, pending, answer)

        if past(self._clock()):
            raise ApprovalTimeout(
                f"approval request {request_id} expired before the {self.framework} answer "
                "arrived; nothing was recorded and the request is still pending",
                request_id=request_id,
            )
        # the operator library's answer: what `ctrlrun approve` and `deny` write, in one transaction
        from .operator import answers

        if not answer.granted:
            answers.deny(self._store, request_id, answer.approver)
            return None
        if edits is not None:
            assert self._policy is not None  # refused above without one
            edited = answers.edit(self._store, request_id, answer.approver, thaw(edits), policy=self._policy,
                                  allow_new=True)  # fmt: skip
            return edited.approval
        approval = answers.grant(self._store, request_id, answer.approver).approval
        if approval is None:  # recorded, but below a multi-approver threshold
            raise ApprovalTimeout(
                f"approval request {request_id} needs more approvers; the grant by "
                f"{answer.approver} was recorded",
                request_id=request_id,
            )
        return approval

    def _check_binding(
        self, record: ApprovalRecord, pending: PendingApproval, answer: ApprovalAnswer
    ) -> None:
        """Prevention: the arguments the human answered against must hash to the pending action."""
        request_id = pending.request_id
        if answer.approved_arguments is None:
            raise ApprovalMismatch(
                f"approval {request_id}: the {self.framework} answer carries no arguments, so it "
                "cannot be bound to the action it approves; answer with the arguments shown. "
                "Nothing was recorded and the request is still pending",
                reason="mismatch",
                approval_id=request_id,
            )
        answered = record.request.action.replace(arguments=answer.approved_arguments)
        if answered.action_hash != pending.action_hash:
            raise ApprovalMismatch(
                f"approval {request_id}: the arguments the human answered against hash to "
                f"{answered.action_hash}, not to the pending action {pending.action_hash}; "
                "nothing was recorded and the request is still pending",
                reason="mismatch",
                approval_id=request_id,
            )


def _as_timedelta(value: timedelta | float | None) -> timedelta | None:
    if value is None or isinstance(value, timedelta):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return timedelta(seconds=value)
    raise InvalidArgument(f"timeout must be a timedelta, seconds or None, got {value!r}")


# --------------------------------------------------------------------------- helpers


def needs_approval(
    control: Any,
    action: str,
    arguments: Mapping[str, Any],
    *,
    resource: str | None = None,
    effect: str | None = None,
    task: str | None = None,
    hop: str | None = None,
) -> bool:
    """``True`` iff ``control`` would ask a human for this call; writes nothing.

    For frameworks that decide before invoking a tool. A **deny** is ``False`` on purpose: the
    tool then runs into ``Control.execute``, which refuses it with a receipt. So is an approve
    that ``Control`` refuses before asking anyone: its effect key (``effect``, a
    template over ``arguments``, else the policy's ``effect:``) cannot be reserved now, so no
    human is asked about a call that cannot run. Identity errors propagate.
    """
    if not isinstance(action, str) or not action.strip():
        raise InvalidArgument(f"needs_approval needs a non-empty action name, got {action!r}")
    if not isinstance(arguments, Mapping):
        raise InvalidArgument(
            f"needs_approval({action!r}): arguments must be a mapping, got "
            f"{type(arguments).__name__}"
        )
    if effect is not None and (not isinstance(effect, str) or not effect):
        raise InvalidArgument(
            f"needs_approval({action!r}): effect= must be a non-empty template, got {effect!r}"
        )
    principal = control.resolve_principal(action)
    template = resource if resource is not None else control.policy.resource_template(action)
    rendered = render_resource(template, arguments) if template is not None else None
    proposal = Action(action, arguments, principal, rendered, environment=control.environment)
    evaluation = control.evaluate(proposal, task=task, hop=hop)
    if evaluation.decision is not Decision.APPROVE:
        return False
    return not _refused_before_asking(control, proposal, effect)


def _refused_before_asking(control: Any, action: Action, effect: str | None = None) -> bool:
    """Whether ``control`` would refuse this approve-decided ``action`` before asking a human.

    It would when the effect key (``effect``, else the policy's template) cannot be rendered, or
    when its record, judged now by the reservation table, is ``committed``, ``ambiguous``, held
    under a live lease or ``executing`` under a lapsed one, or ``failed`` with its next attempt
    over ``max_attempts``. Reads one effect record and writes nothing: the refusal itself, with
    its events and receipt, is ``Control``'s when the call is made.
    """
    template = effect if effect is not None else control.policy.effect_template(action.name)
    if template is None:
        return False  # no key: nothing to judge
    try:
        key = render_effect_key(template, action.canonical_arguments, action.resource)
        record = control.store.get_effect(key)
        if record is None:
            return False
        plan = plan_reservation(
            record, key, action.action_id, control.lease, control.clock(),
            state=EffectState.EXECUTING, action_hash=action.action_hash,
        )  # fmt: skip
    except (EffectKeyError, InvalidArgument):  # Control refuses such a key before asking anyone
        return True
    if plan.kind in ("refuse", "keep_then_refuse"):
        return True
    from .control.ceiling import over_ceiling

    ceiling = control.policy.max_attempts(action.name)
    return record.state is EffectState.FAILED and over_ceiling(record.attempt + 1, ceiling)


_bannered: weakref.WeakSet[Any] = weakref.WeakSet()
_bannered_strong: list[Any] = []  # controls that cannot be weakly referenced
_banner_lock = threading.Lock()


def observing(control: Any) -> bool:
    """Whether ``control`` runs in observe mode (decisions logged, nothing enforced)."""
    mode = getattr(control, "mode", None)
    if mode is None:
        mode = getattr(getattr(control, "policy", None), "mode", None)
    return mode == "observe"


def banner(control: Any) -> None:
    """Log the observe-mode warning once per ``control`` (observe mode only)."""
    if not observing(control):
        return
    with _banner_lock:
        try:
            if control in _bannered:
                return
            _bannered.add(control)
        except TypeError:
            if any(seen is control for seen in _bannered_strong):
                return
            _bannered_strong.append(control)
    log.warning("%s: ctrlrun records what it would decide but refuses nothing", OBSERVE_BANNER)
