"""Approval requests and records, the pure answer/consume rules, and the shipped providers."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable, cast

from .._time import format_precise, parse_ts, utc_now
from ..action import Action, canonical_bytes, new_id
from ..effects.records import check_line_text
from ..errors import ActionDenied, ApprovalMismatch, ApprovalTimeout, InvalidArgument

__all__ = [
    "DEFAULT_APPROVAL_TTL",
    "Approval",
    "ApprovalProvider",
    "ApprovalRecord",
    "ApprovalRequest",
    "ApprovalStatus",
    "ExpireThenRefuse",
    "LocalApprovalProvider",
    "ScriptedApprovalProvider",
    "VerifiedApprover",
    "apply_consume",
    "apply_deny",
    "apply_grant",
    "build_request",
    "check_answerable",
    "check_consumable",
]

DEFAULT_APPROVAL_TTL = timedelta(minutes=15)


class ApprovalStatus(StrEnum):
    """Where an approval request stands; ``denied``, ``expired`` and ``consumed`` are terminal."""

    PENDING = "pending"
    GRANTED = "granted"
    DENIED = "denied"
    EXPIRED = "expired"
    CONSUMED = "consumed"


def _aware(value: Any, what: str) -> datetime:
    if not isinstance(value, datetime) or value.utcoffset() is None:
        raise InvalidArgument(f"{what} must be a timezone-aware datetime, got {value!r}")
    return value


def _text(value: Any, what: str, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{what} must be a non-empty string, got {value!r}")


def _roles(value: Any, what: str) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise InvalidArgument(f"{what} must be a list of strings, got {value!r}")
    roles = tuple(value)
    for role in roles:
        _text(role, f"{what} entry")
    return roles


@dataclass(frozen=True, slots=True)
class VerifiedApprover:
    """A human the granting surface authenticated (claim values are never stored)."""

    agent: str
    user: str | None
    issuer: str | None
    granted_at: datetime
    entitled: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _text(self.agent, "approver agent")
        _text(self.user, "approver user", optional=True)
        _text(self.issuer, "approver issuer", optional=True)
        _aware(self.granted_at, "approver granted_at")
        object.__setattr__(self, "entitled", _roles(self.entitled, "approver entitled"))

    def to_dict(self) -> dict[str, Any]:
        return {
            "agent": self.agent,
            "user": self.user,
            "issuer": self.issuer,
            "entitled": list(self.entitled),
            "granted_at": format_precise(self.granted_at),
        }

    @classmethod
    def from_dict(cls, document: Any) -> VerifiedApprover:
        if not isinstance(document, dict):
            raise InvalidArgument(f"a verified approver must be an object, got {document!r}")
        try:
            return cls(
                agent=document["agent"],
                user=document.get("user"),
                issuer=document.get("issuer"),
                granted_at=parse_ts(document["granted_at"]),
                entitled=tuple(document.get("entitled") or ()),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidArgument(f"unreadable verified approver {document!r}: {exc}") from None


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """What a human is asked to approve, captured when the request is made."""

    request_id: str
    action_hash: str
    action: Action
    created_at: datetime
    expires_at: datetime
    policy_hash: str | None = None
    precondition_fingerprint: str | None = None
    required_roles: tuple[str, ...] = ()
    approvals_required: int = 1

    def __post_init__(self) -> None:
        _text(self.request_id, "request_id")
        _text(self.action_hash, "action_hash")
        if not isinstance(self.action, Action):
            raise InvalidArgument(f"an approval request needs an Action, got {self.action!r}")
        _aware(self.created_at, "created_at")
        _aware(self.expires_at, "expires_at")
        if self.expires_at <= self.created_at:
            raise InvalidArgument(
                f"approval request {self.request_id}: expires_at must be after created_at"
            )
        _text(self.policy_hash, "policy_hash", optional=True)
        _text(self.precondition_fingerprint, "precondition_fingerprint", optional=True)
        object.__setattr__(self, "required_roles", _roles(self.required_roles, "required_roles"))
        required = self.approvals_required
        if isinstance(required, bool) or not isinstance(required, int) or required < 1:
            raise InvalidArgument(f"approvals_required must be an int >= 1, got {required!r}")


@dataclass(frozen=True, slots=True)
class Approval:
    """A granted approval: what a presenter needs to spend it (its expiry is the request's)."""

    approval_id: str
    action_hash: str
    approver: str | None
    granted_at: datetime
    expires_at: datetime
    edited_from: str | None = None
    edit_diff: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class ApprovalRecord:
    """A stored request and what became of it."""

    request: ApprovalRequest
    status: ApprovalStatus = ApprovalStatus.PENDING
    approver: str | None = None
    granted_at: datetime | None = None
    consumed_at: datetime | None = None
    approvers: tuple[VerifiedApprover, ...] = field(default=())
    edited_action: Action | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", ApprovalStatus(self.status))
        object.__setattr__(self, "approvers", tuple(self.approvers))

    @property
    def approval_id(self) -> str:
        return self.request.request_id

    @property
    def action_hash(self) -> str:
        """The hash this approval is bound to: the edited action's after an edited grant."""
        if self.edited_action is not None:
            return self.edited_action.action_hash
        return self.request.action_hash

    @property
    def edited_from(self) -> str | None:
        """The original request's hash when the human approved edited arguments, else None."""
        return self.request.action_hash if self.edited_action is not None else None

    @property
    def edit_diff(self) -> dict[str, Any] | None:
        """What the human changed: ``{argument: {"from": old, "to": new}}`` (a side is absent
        when the argument was added or removed), or None without an edit."""
        if self.edited_action is None:
            return None
        return argument_diff(
            self.request.action.canonical_arguments, self.edited_action.canonical_arguments
        )

    @property
    def approved_arguments(self) -> dict[str, Any]:
        """The arguments the human approved (the edited ones after an edit)."""
        action = self.edited_action if self.edited_action is not None else self.request.action
        return action.canonical_arguments

    @property
    def expires_at(self) -> datetime:
        return self.request.expires_at

    def as_approval(self) -> Approval:
        """The ``Approval`` this record grants; an ungranted record refuses."""
        granted = (ApprovalStatus.GRANTED, ApprovalStatus.CONSUMED)
        if self.status not in granted:
            raise InvalidArgument(f"approval {self.approval_id} is {self.status}, not granted")
        if self.granted_at is None:
            raise InvalidArgument(
                f"approval {self.approval_id} is {self.status} but records no grant time: the "
                "record was altered outside ctrlrun (run `ctrlrun receipts --verify-chain`)"
            )
        return Approval(
            self.approval_id,
            self.action_hash,
            self.approver,
            self.granted_at,
            self.expires_at,
            self.edited_from,
            self.edit_diff,
        )


def argument_diff(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """Per changed argument ``{"from": old, "to": new}``; an added one has only ``to``, a
    removed one only ``from``."""
    diff: dict[str, Any] = {}
    for name in sorted(set(before) | set(after)):
        if name in before and name in after and canonical_bytes(before[name]) == canonical_bytes(
            after[name]
        ):
            continue
        change: dict[str, Any] = {}
        if name in before:
            change["from"] = before[name]
        if name in after:
            change["to"] = after[name]
        diff[name] = change
    return diff


def build_request(
    action: Action,
    ttl: timedelta | None,
    now: datetime,
    *,
    policy_hash: str | None = None,
    precondition_fingerprint: str | None = None,
    required_roles: Sequence[str] = (),
    approvals_required: int = 1,
) -> ApprovalRequest:
    """A new ``pending``-to-be request for ``action``, expiring ``ttl`` after ``now``."""
    ttl = DEFAULT_APPROVAL_TTL if ttl is None else ttl
    if not isinstance(ttl, timedelta) or ttl <= timedelta(0):
        raise InvalidArgument(f"approval ttl must be a positive timedelta, got {ttl!r}")
    if not isinstance(action, Action):
        raise InvalidArgument(f"an approval request needs an Action, got {action!r}")
    _aware(now, "now")
    return ApprovalRequest(
        request_id=new_id("apr"),
        action_hash=action.action_hash,
        action=action,
        created_at=now,
        expires_at=now + ttl,
        policy_hash=policy_hash,
        precondition_fingerprint=precondition_fingerprint,
        required_roles=tuple(required_roles),
        approvals_required=approvals_required,
    )


@dataclass(frozen=True, slots=True)
class ExpireThenRefuse:
    """A kept write: store ``write`` (marked expired) in place of ``expected``, then raise."""

    expected: ApprovalRecord
    write: ApprovalRecord
    error: ApprovalMismatch


def _expire(record: ApprovalRecord) -> ExpireThenRefuse:
    error = ApprovalMismatch(
        f"approval {record.approval_id} expired at {format_precise(record.expires_at)}; "
        "ask for a new approval",
        reason="expired",
        approval_id=record.approval_id,
    )
    return ExpireThenRefuse(record, replace(record, status=ApprovalStatus.EXPIRED), error)


def _unknown(approval_id: str) -> ApprovalMismatch:
    return ApprovalMismatch(
        f"approval {approval_id} is unknown to this store (`ctrlrun pending` lists open requests)",
        reason="unknown",
        approval_id=approval_id,
    )


def check_answerable(
    record: ApprovalRecord | None, approval_id: str, now: datetime
) -> ExpireThenRefuse | None:
    """May ``record`` be answered now? ``None`` = yes; raises, or returns the kept expiry."""
    if record is None:
        raise _unknown(approval_id)
    if record.status is not ApprovalStatus.PENDING:
        raise ApprovalMismatch(
            f"approval {approval_id} is already {record.status}; a request is answered once",
            reason=record.status.value,
            approval_id=approval_id,
        )
    if now > record.expires_at:
        return _expire(record)
    return None


def check_consumable(
    record: ApprovalRecord | None,
    approval_id: str,
    action_hash: str,
    now: datetime,
    *,
    action_id: str | None = None,
) -> ExpireThenRefuse | None:
    """May ``record`` be spent by the action hashing to ``action_hash``? Same contract as above."""
    if record is None:
        raise _unknown(approval_id)
    if record.action_hash != action_hash and record.edited_from == action_hash:
        raise ApprovalMismatch(
            f"approval {approval_id} was granted with edits: the human approved "
            f"{record.approved_arguments}, not the original arguments; re-issue the call with "
            "exactly those (the exception's approved_arguments) under the same approval",
            reason="edited",
            approval_id=approval_id,
            approved_arguments=record.approved_arguments,
        )
    if record.action_hash != action_hash:
        raise ApprovalMismatch(
            f"approval {approval_id} was requested for {record.action_hash}, "
            f"not for this action ({action_hash}); changed arguments need a new approval",
            reason="mismatch",
            approval_id=approval_id,
        )
    if record.status is ApprovalStatus.DENIED:
        raise ActionDenied(
            f"approval {approval_id} was denied by {record.approver or 'an approver'}",
            reason="approval_denied",
            action_id=action_id,
        )
    if record.status is not ApprovalStatus.GRANTED:
        raise ApprovalMismatch(
            f"approval {approval_id} is {record.status}, not granted",
            reason=record.status.value,
            approval_id=approval_id,
        )
    if now > record.expires_at:
        return _expire(record)
    return None


def _with_verified(
    approvers: tuple[VerifiedApprover, ...], verified: VerifiedApprover | None
) -> tuple[VerifiedApprover, ...]:
    if verified is None:
        return approvers
    if not isinstance(verified, VerifiedApprover):
        raise InvalidArgument(f"verified must be a VerifiedApprover, got {verified!r}")
    same = (verified.agent, verified.user)
    return tuple(a for a in approvers if (a.agent, a.user) != same) + (verified,)


def apply_grant(
    record: ApprovalRecord,
    approver: str,
    now: datetime,
    verified: VerifiedApprover | None = None,
    *,
    edited_action: Action | None = None,
) -> ApprovalRecord:
    """The record after one grant: ``granted`` once the threshold is met, else still ``pending``.

    With ``edited_action`` the grant binds the edited action's hash; the request keeps the original.
    """
    check_line_text(approver, "approver")
    if edited_action is not None:
        check_edit(record.request.action, edited_action)
    approvers = _with_verified(record.approvers, verified)
    required = record.request.approvals_required
    if required > 1 and len(approvers) < required:
        return replace(record, approvers=approvers)
    return replace(
        record,
        status=ApprovalStatus.GRANTED,
        approver=approver,
        granted_at=now,
        approvers=approvers,
        edited_action=edited_action,
    )


def check_edit(original: Action, edited: Action) -> None:
    """An edit may change the arguments only, and must change them."""
    same = (original.name, original.principal.agent, original.principal.user, original.resource,
            original.environment)  # fmt: skip
    other = (edited.name, edited.principal.agent, edited.principal.user, edited.resource,
             edited.environment)  # fmt: skip
    if same != other:
        raise InvalidArgument(
            "an edited approval may change the arguments only, not the action, principal, "
            "resource or environment"
        )
    if edited.action_hash == original.action_hash:
        raise InvalidArgument(
            "the edited arguments are the ones requested; approve the request without edits"
        )


def apply_deny(
    record: ApprovalRecord, approver: str, now: datetime, verified: VerifiedApprover | None = None
) -> ApprovalRecord:
    """The record after a denial."""
    check_line_text(approver, "approver")
    approvers = _with_verified(record.approvers, verified)
    return replace(record, status=ApprovalStatus.DENIED, approver=approver, approvers=approvers)


def apply_consume(record: ApprovalRecord, now: datetime) -> ApprovalRecord:
    """The record after it was spent."""
    return replace(record, status=ApprovalStatus.CONSUMED, consumed_at=now)


# --------------------------------------------------------------------------- providers


@runtime_checkable
class ApprovalProvider(Protocol):
    """Creates approval requests and waits for their answer (``None`` = denied).

    ``Control`` passes ``precondition_fingerprint=`` only for a call with ``preconditions=``.
    """

    def request(
        self, action: Action, ttl: timedelta | None, *, policy_hash: str | None = None,
        precondition_fingerprint: str | None = None,
    ) -> ApprovalRequest: ...

    def wait(self, request_id: str, timeout: timedelta | float | None) -> Approval | None: ...


def _as_timedelta(value: timedelta | float | None, what: str) -> timedelta | None:
    if value is None or isinstance(value, timedelta):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return timedelta(seconds=value)
    raise InvalidArgument(f"{what} must be a timedelta or seconds, got {value!r}")


def _settled(record: ApprovalRecord) -> tuple[bool, Approval | None]:
    if record.status is ApprovalStatus.GRANTED:
        return True, record.as_approval()
    if record.status is ApprovalStatus.PENDING:
        return False, None
    return True, None


class _StoreProvider:
    def __init__(self, store: Any, clock: Callable[[], datetime]) -> None:
        self.store = store
        self.clock = clock

    def request(
        self, action: Action, ttl: timedelta | None = None, *, policy_hash: str | None = None,
        precondition_fingerprint: str | None = None,
    ) -> ApprovalRequest:
        """Store a new ``pending`` request for ``action`` (with the fingerprint of the state the
        human is asked about, if any) and return it."""
        request = build_request(action, ttl, self.clock(), policy_hash=policy_hash,
                                precondition_fingerprint=precondition_fingerprint)  # fmt: skip
        self.store.put_approval_request(request)
        return request

    def _record(self, request_id: str) -> ApprovalRecord:
        record = self.store.get_approval(request_id)
        if record is None:
            raise _unknown(request_id)
        return cast(ApprovalRecord, record)


class LocalApprovalProvider(_StoreProvider):
    """Polls the store while a human runs ``ctrlrun approve|deny <id>``."""

    def __init__(
        self,
        store: Any,
        *,
        clock: Callable[[], datetime] = utc_now,
        poll_interval: timedelta | float = timedelta(seconds=0.5),
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(store, clock)
        interval = _as_timedelta(poll_interval, "poll_interval")
        if interval is None or interval <= timedelta(0):
            raise InvalidArgument(f"poll_interval must be positive, got {poll_interval!r}")
        self.poll_interval = interval
        self.sleep = sleep

    def wait(self, request_id: str, timeout: timedelta | float | None = None) -> Approval | None:
        """The approval once granted, ``None`` once denied; ``ApprovalTimeout`` when too late."""
        limit = _as_timedelta(timeout, "timeout")
        deadline = None if limit is None else self.clock() + limit
        while True:
            record = self._record(request_id)
            done, approval = _settled(record)
            if done:
                return approval
            now = self.clock()
            if now > record.expires_at or (deadline is not None and now >= deadline):
                raise ApprovalTimeout(request_id=request_id)
            end = record.expires_at if deadline is None else min(deadline, record.expires_at)
            pause = min(self.poll_interval, end - now)
            self.sleep(max(pause.total_seconds(), 0.001))


_SCRIPT_STEPS = frozenset({"pending", "grant", "deny"})


class ScriptedApprovalProvider(_StoreProvider):
    """For tests: each poll takes the next script step (``pending``, ``grant`` or ``deny``)."""

    def __init__(
        self,
        store: Any,
        script: Iterable[str],
        *,
        approver: str = "cli:scripted",
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        super().__init__(store, clock)
        steps = [script] if isinstance(script, str) else list(script)
        for step in steps:
            if step not in _SCRIPT_STEPS:
                raise InvalidArgument(
                    f"script steps are 'pending', 'grant' or 'deny', got {step!r}"
                )
        self.approver = check_line_text(approver, "approver")
        self._steps = iter(steps)

    def wait(self, request_id: str, timeout: timedelta | float | None = None) -> Approval | None:
        """Play script steps until the request is answered; an exhausted script times out."""
        _as_timedelta(timeout, "timeout")
        while True:
            record = self._record(request_id)
            done, approval = _settled(record)
            if done:
                return approval
            if self.clock() > record.expires_at:
                raise ApprovalTimeout(request_id=request_id)
            step = next(self._steps, None)
            if step is None:
                raise ApprovalTimeout(request_id=request_id)
            if step == "grant":
                granted = self.store.grant_approval(request_id, self.approver)
                if granted is not None:
                    return cast(Approval, granted)
            elif step == "deny":
                self.store.deny_approval(request_id, self.approver)
                return None
