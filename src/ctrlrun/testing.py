"""Helpers for testing your own protected functions: a settable clock, an in-memory ``Control``,
answers to its requests and reads of what it recorded (``import ctrlrun`` does not load this)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ctrlrun.errors import InvalidArgument, StoreError

if TYPE_CHECKING:
    from ctrlrun import (
        ApprovalProvider,
        ApprovalRecord,
        ApprovalRequired,
        Control,
        Event,
        Policy,
        Receipt,
        StateStore,
    )

__all__ = [
    "DEFAULT_APPROVER",
    "START",
    "Clock",
    "control",
    "deny",
    "events",
    "grant",
    "pending",
    "receipts",
]

#: Where a new ``Clock`` starts when given no time: 2026-11-30 09:00 UTC.
START = datetime(2026, 11, 30, 9, 0, tzinfo=timezone.utc)

#: Who answers when a helper is not told: recorded on the answer and on the receipts it allows.
DEFAULT_APPROVER = "test:approver"


class Clock:
    """A clock that moves only when told, for any ``clock=``: calling it returns the aware UTC
    ``datetime`` it shows (a naive time is refused with ``InvalidArgument``, a ``ValueError``)."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = self._checked(START if start is None else start)

    def __call__(self) -> datetime:
        return self._now

    @property
    def now(self) -> datetime:
        """The time the clock shows; assigning it sets the clock, as ``set`` does."""
        return self._now

    @now.setter
    def now(self, moment: datetime) -> None:
        self._now = self._checked(moment)

    def set(self, moment: datetime) -> datetime:
        """Show ``moment`` from now on (an aware ``datetime``) and return it."""
        self._now = self._checked(moment)
        return self._now

    def advance(self, delta: timedelta | None = None, **kwargs: float) -> datetime:
        """Move on by ``delta`` or by ``timedelta(**kwargs)`` (negative moves back); returns the new time."""
        if delta is not None and kwargs:
            raise InvalidArgument("advance() takes a timedelta or timedelta keywords, not both")
        step = timedelta(**kwargs) if delta is None else delta
        if not isinstance(step, timedelta):
            raise InvalidArgument(f"advance() needs a timedelta, got {step!r}")
        self._now = self._now + step
        return self._now

    def _checked(self, moment: datetime) -> datetime:
        if not isinstance(moment, datetime):
            raise InvalidArgument(f"{type(self).__name__} needs a datetime, got {moment!r}")
        if moment.utcoffset() is None:
            raise InvalidArgument(
                f"{type(self).__name__} needs an aware datetime, got the naive {moment!r}; "
                "add tzinfo=timezone.utc"
            )
        return moment if moment.tzinfo is timezone.utc else moment.astimezone(timezone.utc)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._now.isoformat()})"


def control(
    policy: Policy | Mapping[str, Any] | str | os.PathLike[str],
    *,
    clock: Callable[[], datetime] | None = None,
    agent: str | None = None,
    user: str | None = None,
    answers: Iterable[str] | None = None,
    approver: str = DEFAULT_APPROVER,
    approvals: ApprovalProvider | Callable[[StateStore], ApprovalProvider] | None = None,
    **options: Any,
) -> Control:
    """A ``Control`` over a fresh ``InMemoryStateStore``, both on ``clock`` (a new ``Clock`` if not
    given), for ``policy`` as a ``Policy``, a mapping, YAML text (``str``) or a path (``os.PathLike``).
    ``agent`` and ``user`` fix the principal, ``answers`` script the approver of ``wait=True`` calls
    (none left: ``ApprovalTimeout`` at once, never a hang) unless ``approvals`` (a provider, or a
    function of the store making one) replaces it, and other keywords go to ``Control``."""
    from ctrlrun import (
        ApprovalProvider, Control, InMemoryStateStore, ScriptedApprovalProvider, StaticIdentityProvider,
    )  # fmt: skip

    loaded = _policy(policy)
    ticking: Callable[[], datetime] = Clock() if clock is None else clock
    if not callable(ticking):
        raise InvalidArgument(f"clock must be a callable returning a datetime, got {clock!r}")
    if agent is not None:
        if "identity" in options:
            raise InvalidArgument("give agent= or identity=, not both")
        options["identity"] = StaticIdentityProvider(agent, user)
    elif user is not None:
        raise InvalidArgument("user= needs agent= (the principal's agent)")
    if approvals is not None and answers is not None:
        raise InvalidArgument("give answers= or approvals=, not both")
    store = InMemoryStateStore(clock=ticking)
    provider: ApprovalProvider
    if approvals is None:
        provider = ScriptedApprovalProvider(
            store, () if answers is None else answers, approver=approver, clock=ticking
        )
    elif isinstance(approvals, ApprovalProvider) and not isinstance(approvals, type):
        provider = approvals
    else:  # a function of the store (a provider class among them)
        provider = approvals(store)
    return Control(loaded, store, provider, clock=ticking, **options)


def grant(
    control: Control,
    request: str | ApprovalRequired | ApprovalRecord,
    *,
    approver: str = DEFAULT_APPROVER,
    arguments: Mapping[str, Any] | None = None,
) -> ApprovalRecord:
    """Grant ``request`` (an id, the ``ApprovalRequired`` raised, or a record from ``pending``) as
    ``ctrlrun approve`` does, with ``arguments`` as edits if given; returns its record after it."""
    return _answer(control, request, approver, granted=True, arguments=arguments)


def deny(
    control: Control, request: str | ApprovalRequired | ApprovalRecord, *, approver: str = DEFAULT_APPROVER
) -> ApprovalRecord:
    """Deny ``request`` (as for ``grant``) as ``ctrlrun deny`` does; returns its record after it."""
    return _answer(control, request, approver, granted=False, arguments=None)


def pending(control: Control) -> tuple[ApprovalRecord, ...]:
    """The requests still waiting for an answer (not answered, not expired by the store's clock),
    oldest first."""
    return control.store.pending_approvals()


def receipts(control: Control) -> tuple[Receipt, ...]:
    """Every receipt the Control's store holds, in chain order."""
    from ctrlrun import Receipt

    found: list[Receipt] = []
    for receipt in control.store.receipts():
        if not isinstance(receipt, Receipt):
            raise StoreError(f"a stored receipt cannot be read: {receipt!r}")
        found.append(receipt)
    return tuple(found)


def events(control: Control) -> tuple[Event, ...]:
    """Every event the Control's store holds, in the order written."""
    store = control.store
    if not isinstance(store, _ListsEvents):
        raise InvalidArgument(f"{type(store).__name__} cannot list its events (it has no events())")
    return store.events()


@runtime_checkable
class _ListsEvents(Protocol):
    def events(self) -> tuple[Event, ...]: ...


def _policy(policy: Policy | Mapping[str, Any] | str | os.PathLike[str]) -> Policy:
    from ctrlrun import Policy

    if isinstance(policy, Policy):
        return policy
    if isinstance(policy, str):
        return Policy.from_yaml(policy)
    if isinstance(policy, os.PathLike):
        return Policy.from_file(policy)
    if isinstance(policy, Mapping):
        import yaml

        text = yaml.safe_dump(_plain(policy), sort_keys=False, allow_unicode=True)
        return Policy.from_yaml(text, source="<mapping>")
    raise InvalidArgument(
        "policy must be a Policy, a mapping, YAML text (str) or a path (os.PathLike), "
        f"got {type(policy).__name__}"
    )


def _plain(value: Any) -> Any:
    """``value`` as the plain dicts, lists and scalars YAML writes (tuples become lists)."""
    if isinstance(value, Mapping):
        return {_plain(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, str) and type(value) is not str:  # a str enum: its value
        return str.__str__(value)
    return value


def _request_id(request: str | ApprovalRequired | ApprovalRecord) -> str:
    from ctrlrun import ApprovalRecord, ApprovalRequired

    if isinstance(request, str):
        return request
    if isinstance(request, ApprovalRequired):
        return request.request_id
    if isinstance(request, ApprovalRecord):
        return request.approval_id
    raise InvalidArgument(
        f"give a request id, an ApprovalRequired or an ApprovalRecord, got {type(request).__name__}"
    )


def _answer(
    control: Control,
    request: str | ApprovalRequired | ApprovalRecord,
    approver: str,
    *,
    granted: bool,
    arguments: Mapping[str, Any] | None,
) -> ApprovalRecord:
    """The operator library's answer (what ``ctrlrun approve`` and ``deny`` write); a refusal is its
    ``AnswerRefused``, an ``ApprovalMismatch`` whose ``reason`` names why."""
    from ctrlrun import operator

    request_id = _request_id(request)
    store = control.store
    if arguments is not None:
        answer = operator.edit(store, request_id, approver, arguments, policy=control.policy, allow_new=True)
    elif granted:
        answer = operator.grant(store, request_id, approver)
    else:
        answer = operator.deny(store, request_id, approver)
    return answer.record


def _record(control: Control, request_id: str) -> ApprovalRecord:
    record = control.store.get_approval(request_id)
    if record is None:  # pragma: no cover - the store answered for this request a moment ago
        raise StoreError(f"approval request {request_id} vanished from the store after its answer")
    return record
