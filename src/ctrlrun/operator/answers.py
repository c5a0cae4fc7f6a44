"""A human's answers: grant, deny, grant with edits, and resolve an ambiguous effect. Each checks
the same things in the same order and writes its event in the answer's own transaction, whoever
answers (the CLI, the console, the MCP operator); a refusal is an ``AnswerRefused`` naming why."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .._time import format_ts
from ..approvals.answers import answer_events, resolve_events
from ..approvals.records import Approval, ApprovalRecord, ApprovalStatus
from ..approvals.edits import grant_with_edits
from ..effects.records import EffectRecord, EffectState
from ..errors import ApprovalMismatch, CTRLRunError, InvalidArgument
from ..policy import Policy
from ..evidence.receipt import Event, EventType
from ..store import StateStore

__all__ = ["Answer", "AnswerRefused", "Decision", "ResolveRefused", "check_answerable", "decision_of", "deny", "edit", "grant", "resolve"]

_ANSWERS = (EventType.APPROVAL_GRANTED, EventType.APPROVAL_DENIED, EventType.APPROVAL_EDITED)


class AnswerRefused(ApprovalMismatch):
    """An answer to a request that was refused; nothing was written.

    ``code`` (also ``reason``) says why: ``unknown``, ``self_approval``, ``expired``, the status of
    a request answered already (``granted``, ``denied``, ``consumed``) or ``unknown_argument``;
    ``subject`` is the request id, ``record`` what the store held then (None for an unknown one)."""

    def __init__(self, message: str, *, code: str, subject: str, record: Any = None,
                 expired_now: bool = False, names: Sequence[str] = ()) -> None:  # fmt: skip
        super().__init__(message, reason=code, approval_id=subject)
        self.code = code
        self.subject = subject
        self.record = record
        self.expired_now = expired_now  # the answer found it pending and it expired on the spot
        self.names = tuple(names)


class ResolveRefused(CTRLRunError):
    """A resolve that was refused; nothing changed. ``code`` is ``bad_state``, ``unknown``, or the
    state of an effect that is not ambiguous (then ``record`` is that effect)."""

    def __init__(self, message: str, *, code: str, subject: str, record: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.subject = subject
        self.record = record


@dataclass(frozen=True, slots=True)
class Answer:
    """What an answer did: ``approval`` is the grant (None for a denial, and for a grant still short
    of its approver threshold); ``record`` the request after it."""

    request_id: str
    record: ApprovalRecord
    approval: Approval | None

    @property
    def threshold_pending(self) -> bool:
        """A grant was recorded, but more approvers must still grant before the call may run."""
        return self.approval is None and self.record.status is ApprovalStatus.PENDING


@dataclass(frozen=True, slots=True)
class Decision:
    """Who answered a request that is no longer pending, and when; ``act`` is ``approved`` or
    ``denied`` (empty when nobody answered it, e.g. it expired)."""

    status: str
    by: str | None
    at: str | None
    act: str = ""

    def made_by(self, viewer: str | None) -> bool:
        """Whether ``viewer`` (an approver such as ``console:ada``) made the deciding act."""
        return viewer is not None and bool(self.act) and self.by == viewer

    def sentence(self, viewer: str | None = None) -> str:
        """The decision in words; to ``viewer`` their own act reads ``you approved this at …``, so
        nobody is told that they themselves decided it before."""
        from .text import safe

        if self.made_by(viewer):
            text = f"you {self.act} this"
        else:
            text = f"already {self.status}"
            if self.by:
                text += f" by {safe(self.by)}"
        if self.at:
            text += f" at {self.at}"
        return text


def _act(event_type: EventType | None, status: ApprovalStatus) -> str:
    """``approved`` or ``denied``: what the answering approver did."""
    if event_type is EventType.APPROVAL_DENIED or (event_type is None and status is ApprovalStatus.DENIED):
        return "denied"
    if event_type is not None or status in (ApprovalStatus.GRANTED, ApprovalStatus.CONSUMED):
        return "approved"
    return ""


def decision_of(store: StateStore, record: ApprovalRecord) -> Decision:
    """The answer that closed ``record``, from its answer event (else the record itself)."""
    answers = [e for e in store.events_for(approval_id=record.approval_id) if e.type in _ANSWERS]
    if answers:
        last: Event = answers[-1]
        approver = last.data.get("approver")
        by = approver if isinstance(approver, str) else record.approver
        return Decision(record.status.value, by, last.ts, _act(last.type, record.status))
    at = format_ts(record.granted_at) if record.granted_at is not None else None
    if record.status is ApprovalStatus.EXPIRED:
        return Decision(record.status.value, record.approver, format_ts(record.expires_at))
    return Decision(record.status.value, record.approver, at, _act(None, record.status) if record.approver else "")


def _unknown(request_id: str) -> AnswerRefused:
    return AnswerRefused(f"no approval request {request_id} (`ctrlrun pending` lists open requests)",
                         code="unknown", subject=request_id)  # fmt: skip


def _closed(record: ApprovalRecord) -> AnswerRefused:
    request_id = record.approval_id
    return AnswerRefused(f"approval request {request_id} is already {record.status.value}; a request is "
                         "answered once", code=record.status.value, subject=request_id, record=record)  # fmt: skip


def check_answerable(store: StateStore, request_id: str, answerer: str, *, user: str | None = None,
                     now: datetime | None = None) -> ApprovalRecord:  # fmt: skip
    """The pending request, or the refusal: unknown, self-approval, answered already, expired.
    Writes nothing.

    ``user`` is the answering person's own user name when the surface knows it (the four-eyes
    rule: nobody answers their own request). ``now`` refuses a request past its expiry, for a
    surface that asks its human to confirm first (the MCP operator); an answer itself leaves
    expiry to the store, which marks the request expired by its own clock."""
    record = store.get_approval(request_id)
    if record is None:
        raise _unknown(request_id)
    if user is not None and record.request.action.principal.user == user:
        raise AnswerRefused(f"self_approval: {answerer} asked for {request_id} and cannot answer it; "
                            "another approver must decide it (nothing was written)", code="self_approval",
                            subject=request_id, record=record)  # fmt: skip
    if record.status is not ApprovalStatus.PENDING:
        raise _closed(record)
    if now is not None and now > record.expires_at:
        raise AnswerRefused(f"approval request {request_id} expired at {format_ts(record.expires_at)} before it "
                            "was answered; nothing was granted (the agent must ask again)", code="expired",
                            subject=request_id, record=record)  # fmt: skip
    return record


def _mismatch(store: StateStore, request_id: str, before: ApprovalRecord, exc: ApprovalMismatch) -> AnswerRefused:
    """The store refused the answer: another approver was first, or the request expired meanwhile."""
    after = store.get_approval(request_id)
    if exc.reason == "expired" and before.status is ApprovalStatus.PENDING:
        return AnswerRefused(
            f"approval request {request_id} expired at {format_ts(before.expires_at)} before it "
            "was answered; it is now marked expired and nothing was granted (the agent must ask again)",
            code="expired", subject=request_id, record=after or before, expired_now=True,
        )
    if after is not None and after.status is not ApprovalStatus.PENDING:
        return _closed(after)
    return AnswerRefused(f"approval request {request_id} is already {exc.reason}; a request is answered once",
                         code=exc.reason or "refused", subject=request_id, record=after or before)  # fmt: skip


def grant(store: StateStore, request_id: str, answerer: str, *, via: str | None = None,
          user: str | None = None) -> Answer:  # fmt: skip
    """Grant ``request_id`` as ``answerer`` (``via`` is kept in the answer's event)."""
    before = check_answerable(store, request_id, answerer, user=user)
    extra: dict[str, Any] = {"via": via} if via is not None else {}
    try:
        approval = store.grant_approval(request_id, answerer, events=answer_events(answerer, **extra))
    except ApprovalMismatch as exc:
        raise _mismatch(store, request_id, before, exc) from None
    return Answer(request_id, store.get_approval(request_id) or before, approval)


def deny(store: StateStore, request_id: str, answerer: str, *, reason: str = "", via: str | None = None,
          user: str | None = None) -> Answer:  # fmt: skip
    """Refuse ``request_id`` as ``answerer``, keeping a non-blank ``reason`` in the denial's event."""
    before = check_answerable(store, request_id, answerer, user=user)
    extra: dict[str, Any] = {"reason": reason} if reason.strip() else {}
    if via is not None:
        extra["via"] = via
    try:
        store.deny_approval(request_id, answerer, events=answer_events(answerer, **extra))
    except ApprovalMismatch as exc:
        raise _mismatch(store, request_id, before, exc) from None
    return Answer(request_id, store.get_approval(request_id) or before, None)


def edit(store: StateStore, request_id: str, answerer: str, arguments: Mapping[str, Any], *,
         policy: Policy | Callable[[], Policy], allow_new: bool = False, via: str | None = None,
         user: str | None = None) -> Answer:  # fmt: skip
    """Grant ``request_id`` with ``arguments`` instead, re-checked by ``policy`` (the agents' own)
    and bound to the edited action's hash (``policy`` may be a loader, called once the request is
    known to be answerable). A name the request lacks is refused unless ``allow_new``; a policy
    ``deny`` raises ``ActionDenied``; the request then stays pending."""
    before = check_answerable(store, request_id, answerer, user=user)
    known = before.request.action.canonical_arguments
    new = sorted(name for name in arguments if name not in known)
    if new and not allow_new:
        raise AnswerRefused(
            f"approval request {request_id} ({before.request.action.name}) has no argument "
            f"{', '.join(repr(name) for name in new)}; its arguments are {', '.join(sorted(known)) or '(none)'}",
            code="unknown_argument", subject=request_id, record=before, names=new,
        )
    if not isinstance(policy, Policy):
        policy = policy()
    extra: dict[str, Any] = {"via": via} if via is not None else {}
    try:
        approval, record = grant_with_edits(store, request_id, answerer, arguments, policy=policy,
                                            events=answer_events(answerer, **extra))  # fmt: skip
    except ApprovalMismatch as exc:
        raise _mismatch(store, request_id, before, exc) from None
    return Answer(request_id, record, approval)


def resolve(store: StateStore, effect_key: str, state: EffectState | str, resolver: str, *,
            via: str | None = None) -> EffectRecord:  # fmt: skip
    """Settle an ambiguous effect as ``committed`` or ``failed``, by a human named ``resolver``,
    writing its ``EFFECT_RESOLVED`` event with it."""
    try:
        wanted = EffectState(state)
    except ValueError:
        wanted = None
    if wanted not in (EffectState.COMMITTED, EffectState.FAILED):
        raise ResolveRefused(f"resolve an effect as committed or failed, not {state!r}", code="bad_state",
                            subject=effect_key)  # fmt: skip
    assert wanted is not None
    extra: dict[str, Any] = {"via": via} if via is not None else {}
    try:
        return store.resolve_effect(effect_key, wanted, resolver, events=resolve_events(resolver, "human", **extra))
    except InvalidArgument as exc:
        current = store.get_effect(effect_key)
        if current is None:
            raise ResolveRefused(f"no effect {effect_key} in this store (`ctrlrun effects` lists them); nothing "
                                "changed", code="unknown", subject=effect_key) from None  # fmt: skip
        if current.state is not EffectState.AMBIGUOUS:
            raise ResolveRefused(f"effect {effect_key} is {current.state}, not ambiguous: only an ambiguous "
                                "effect is resolved; nothing changed", code=current.state.value,
                                subject=effect_key, record=current) from None  # fmt: skip
        raise exc from None
