"""What every step of a protected call reads: the policy, the store, the clock, the sinks and the
rest of a Control's configuration, with the few store steps they all share. The steps take this,
never the ``Control`` (the front object users hold)."""

from __future__ import annotations

from datetime import timedelta
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, cast

from .._time import Clock
from ..action import Action
from ..errors import InvalidArgument
from ..evidence.receipt import EventSink, Receipt
from ..policy.decision import Evaluation
from .attempt import Attempt, fan_out
from .options import _Options, _positive, check_provider
from .steps import Steps, call

if TYPE_CHECKING:
    from ..approvals.records import ApprovalProvider
    from ..authority.resolve import Authority
    from ..identity import IdentityProvider
    from ..policy import Policy
    from ..store import StateStore
    from .options import Reconcile

__all__ = ["StraightPath", "Wiring"]


class StraightPath(Protocol):
    """The allowed call's straight path (``straight.Straight``), as the wiring holds it."""

    def run(self, action: Action, executor: Callable[[], Any], effect_key: str | None,
            options: _Options) -> tuple[Any, Evaluation | None]: ...  # fmt: skip


class Wiring:
    """One Control's configuration as its calls' steps read it (plain attributes: the allowed
    call reads several per call)."""

    __slots__ = (
        "policy", "store", "approvals", "clock", "approval_ttl", "lease", "suspend_timeout", "sinks",
        "identity", "environment", "policy_hash", "authority", "observing", "ceiling_warned", "straight",
    )  # fmt: skip

    def __init__(self, *, policy: Policy, store: StateStore, approvals: ApprovalProvider, clock: Clock,
                 approval_ttl: timedelta, lease: timedelta, suspend_timeout: timedelta,
                 sinks: tuple[EventSink, ...], identity: IdentityProvider | None, environment: str,
                 policy_hash: str, authority: Authority | None) -> None:  # fmt: skip
        self.policy = policy
        self.store = store
        self.approvals = approvals
        self.clock = clock
        self.approval_ttl = approval_ttl
        self.lease = lease
        self.suspend_timeout = suspend_timeout
        self.sinks = sinks
        self.identity = identity
        self.environment = environment
        self.policy_hash = policy_hash
        self.authority = authority
        self.observing = policy.mode == "observe"  # record every refusal, enforce none
        self.ceiling_warned: set[str] = set()  # actions warned of a ceiling without a key
        self.straight: StraightPath  # set by the Control once this is complete

    # -- a call's settings and its record -------------------------------------------------

    def check_environment(self, action: Action) -> None:
        """Refuse an action built for another environment than the one this Control runs."""
        if action.environment != self.environment:
            raise InvalidArgument(
                f"action {action.name!r} is for environment {action.environment!r} but this "
                f"Control runs {self.environment!r}; build the Action with "
                f"environment={self.environment!r}"
            )

    def options(
        self,
        action: Action,
        effect_key: str | None,
        *,
        lease: timedelta | None = None,
        reconcile: Reconcile | None = None,
        reconcile_eagerly: bool = False,
        preconditions: Any = None,
        task: str | None = None,
        hop: str | None = None,
        scope: Any = None,
    ) -> _Options:
        """One call's settings, checked: the key, the lease, the hooks, where it runs."""
        self.check_environment(action)
        if effect_key is not None and (
            not isinstance(effect_key, str) or effect_key == "" or effect_key.startswith("policy:")
        ):
            raise InvalidArgument(
                f"effect key {effect_key!r} for action {action.name!r} is not usable: it must be "
                "a non-empty string not starting with 'policy:' (reserved)"
            )
        if scope is not None:
            raise InvalidArgument(f"scope= for action {action.name!r} is not enforced by this version "
                                  "of ctrlrun; remove it rather than run without it")  # fmt: skip
        check_provider(preconditions, action.name)
        if reconcile_eagerly and reconcile is None:
            raise InvalidArgument(f"reconcile_eagerly=True for {action.name!r} needs reconcile=")
        lease = self.lease if lease is None else _positive(lease, "lease")
        return _Options(effect_key, lease, reconcile, reconcile_eagerly, task, hop, preconditions)

    def attempt(self, action: Action, effect_key: str | None, approval_id: str | None,
                task: str | None, hop: str | None) -> Attempt:  # fmt: skip
        """A new attempt's record: its events and receipt, stamped with this policy."""
        return Attempt(
            action=action, effect_key=effect_key, approval_id=approval_id, clock=self.clock,
            policy_hash=self.policy_hash, policy_version=self.policy.version, task=task, hop=hop,
        )  # fmt: skip

    # -- store steps every other step shares -------------------------------------------------

    def record(self, attempt: Attempt, receipt: Receipt | None) -> Steps[Receipt | None]:
        """Write the attempt's queued events (and ``receipt``) in one transaction; copy them out."""
        events, stored = yield call(self.store.record, events=attempt.take(), receipt=receipt)
        fan_out(self.sinks, events, stored)
        return cast("Receipt | None", stored)

    def approver_of(self, approval_id: str | None) -> Steps[str | None]:
        """Who granted ``approval_id`` (None without one)."""
        if not approval_id:
            return None
        record = yield call(self.store.get_approval, approval_id)
        return record.approver if record is not None else None

    def attempt_number(self, effect_key: str | None) -> Steps[int]:
        """The key's current attempt number (1 without a key or a record)."""
        if not effect_key:
            return 1
        record = yield call(self.store.get_effect, effect_key)
        return record.attempt if record is not None else 1
