"""``Control``: the front object a user holds. It checks its configuration once, keeps it as the
wiring every step reads, and sends each call through the pipeline (``pipeline.run``) or its
straight path."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Unpack

from .._time import Clock, utc_now
from ..action import Action, Principal
from ..approvals.records import DEFAULT_APPROVAL_TTL, ApprovalProvider, LocalApprovalProvider
from ..effects.records import DEFAULT_LEASE
from ..errors import ActionDenied, CTRLRunError, IdentityError, InvalidArgument, PolicyError
from ..evidence.receipt import EventSink, JSONLEventSink, Receipt
from ..identity import IdentityProvider
from ..policy.decision import Decision, Evaluation
from ..store import StateStore
from . import ambient as _ambient
from .attempt import describe
from .authorize import authority_of
from .options import CallOptions, ReadOnly, Reconcile, ReconcileOutcome, _positive, _resolve_environment
from .pipeline import refuse_effect_key, run
from .steps import Steps, drive, drive_async
from .straight import Straight
from .wiring import Wiring

if TYPE_CHECKING:
    from ..authority.resolve import Authority, Delegation, Grant  # noqa: F401 (a quoted annotation)
    from ..policy import Policy

__all__ = ["Control", "ReconcileOutcome"]

log = logging.getLogger("ctrlrun")


class Control:
    """Decides, approves, reserves, runs and records protected calls for one policy and store."""

    def __init__(
        self,
        policy: Policy,
        store: StateStore,
        approvals: ApprovalProvider | None = None,
        *,
        clock: Clock = utc_now,
        approval_ttl: timedelta = DEFAULT_APPROVAL_TTL,
        lease: timedelta = DEFAULT_LEASE,
        sinks: Sequence[EventSink] = (),
        suspend_timeout: timedelta = timedelta(minutes=5),
        identity: IdentityProvider | None = None,
        authority: Any = None,
        environment: str | None = None,
        approver_identity: Any = None,
        require_approved_policy: bool = False,
        upstream: str | None = None,
        anchor: Any = None,
        anchor_every: int | None = None,
    ) -> None:
        from ..policy import Policy  # the engine (YAML, pydantic) loads with the first Control

        if not isinstance(policy, Policy):
            raise InvalidArgument("Control needs a loaded Policy (Policy.from_file())")
        missing = policy.unenforced_features()
        if missing:
            raise PolicyError(
                f"{policy.source}: {', '.join(missing)} is not enforced by this version of "
                "ctrlrun; remove it from the policy rather than run without it"
            )
        later = {
            "approver_identity": approver_identity,
            "require_approved_policy": require_approved_policy or None,
            "upstream": upstream,
        }
        for name, value in later.items():
            if value is not None:
                raise InvalidArgument(
                    f"Control({name}=...) is not enforced by this version of ctrlrun; leave it unset"
                )
        approval_ttl = _positive(approval_ttl, "Control(approval_ttl=...)")
        lease = _positive(lease, "Control(lease=...)")
        sinks = tuple(sinks)
        if anchor is not None or anchor_every is not None:
            if anchor is None or anchor_every is None:
                raise InvalidArgument("Control(anchor=..., anchor_every=N) go together: give both or neither")
            from ..evidence.anchoring import AnchorEvery

            sinks = (*sinks, AnchorEvery(store, anchor, anchor_every))
        environment = _resolve_environment(environment, policy)
        policy_hash = policy.runtime_hash(environment)
        enforced = authority_of(policy.authority, authority)
        if authority is not None and enforced is not None:  # the hash names what is enforced
            policy_hash = policy.runtime_hash(environment, authority=enforced.hash_member())
        #: the configuration every step of a call reads (``ctrlrun.control.wiring``)
        self.wiring = Wiring(
            policy=policy, store=store, clock=clock, approval_ttl=approval_ttl, lease=lease,
            approvals=approvals if approvals is not None else LocalApprovalProvider(store, clock=clock),
            suspend_timeout=suspend_timeout, sinks=sinks, identity=identity, environment=environment,
            policy_hash=policy_hash, authority=enforced,
        )  # fmt: skip
        self.wiring.straight = Straight(self.wiring)

    # -- construction from files ---------------------------------------------------------

    @classmethod
    def from_file(cls, path: str | os.PathLike[str] | None = None, *, environment: str | None = None) -> Control:
        """The default wiring: the policy file, its store and a JSONL copy of the evidence."""
        from ..settings import policy_path
        from ..store import open_default_store
        from ..policy import Policy

        policy = Policy.from_file(policy_path(path))
        store, evidence_dir = open_default_store(policy_path(path))
        sinks = (JSONLEventSink(evidence_dir),) if evidence_dir is not None else ()
        return cls(policy, store, sinks=sinks, environment=environment)

    # -- read-only properties ------------------------------------------------------------

    policy = ReadOnly["Policy"]("wiring.policy")
    store = ReadOnly[StateStore]("wiring.store")
    approvals = ReadOnly[ApprovalProvider]("wiring.approvals")
    sinks = ReadOnly[tuple[EventSink, ...]]("wiring.sinks")
    lease = ReadOnly[timedelta]("wiring.lease")
    identity = ReadOnly[IdentityProvider | None]("wiring.identity")
    environment = ReadOnly[str]("wiring.environment")
    clock = ReadOnly[Clock]("wiring.clock")
    policy_hash = ReadOnly[str]("wiring.policy_hash")
    approval_ttl = ReadOnly[timedelta]("wiring.approval_ttl")
    authority = ReadOnly["Authority | None"]("wiring.authority")
    approver_identity = ReadOnly[None]("_unbuilt")
    require_approved_policy = ReadOnly[bool]("_no")
    _unbuilt, _no = None, False

    # -- public steps ----------------------------------------------------------------------

    def resolve_principal(self, action_name: str) -> Principal:
        """The principal for a call: the identity provider's, else the active ``context()``."""
        identity = self.wiring.identity
        if identity is not None:
            try:
                principal = identity.principal(action_name)
            except CTRLRunError:
                raise
            except Exception as exc:
                raise IdentityError(
                    f"identity provider {type(identity).__name__} failed for action "
                    f"{action_name!r}: {describe(exc)}"
                ) from exc
            if principal is not None and not isinstance(principal, Principal):
                raise IdentityError(
                    f"identity provider returned {principal!r} for {action_name!r}, not a Principal"
                )
        else:
            hint = _ambient.current_hint()
            principal = None
            if hint:
                principal = _PRINCIPALS.get(hint)
                if principal is None:  # a Principal is immutable: one per context is shared
                    principal = Principal(*hint)
                    if len(_PRINCIPALS) > 1024:
                        _PRINCIPALS.clear()
                    _PRINCIPALS[hint] = principal
        if principal is None:
            log.warning("action %r has no principal; wrap the call in ctrlrun.context()", action_name)
            raise ActionDenied(
                f"action {action_name!r} denied: no principal; call it inside "
                "ctrlrun.context(agent=...)",
                reason="no_principal",
            )
        return principal

    def evaluate(self, action: Action, *, task: str | None = None, hop: str | None = None) -> Evaluation:
        """The decision for ``action``, authority and policy combined (the stricter wins); writes
        nothing. An authority denial answers ``deny`` with the authority's reason. An action of
        another environment is refused (``InvalidArgument``), as ``execute`` refuses it."""
        wiring = self.wiring
        wiring.check_environment(action)
        expired = action.principal.expires_at
        if expired is not None and wiring.clock() > expired:
            return Evaluation(Decision.DENY, "principal_expired")
        if wiring.authority is not None:
            from ..authority.resolve import resolve

            try:
                records = wiring.store.delegations(include_revoked=True)
            except InvalidArgument:  # a row the store cannot read: fail closed
                return Evaluation(Decision.DENY, "authority_unreadable")
            resolution = resolve(
                wiring.authority, records, action=action, environment=wiring.environment,
                task=task, now=wiring.clock(),
            )  # fmt: skip
            if not resolution.passed:
                return Evaluation(Decision.DENY, resolution.reason)
        return wiring.policy.evaluate(action)

    def delegate(self, parent_id: str, grant: Grant, *, by: Principal, created_via: str = "api") -> Delegation:
        """Hand part of ``parent_id``'s grant to another principal; never wider than the parent.
        A refusal raises ``AuthorityEscalation`` naming the reason (and the dimension)."""
        from .delegating import delegate

        return delegate(self.wiring, parent_id, grant, by=by, created_via=created_via)

    def revoke(self, delegation_id: str, *, by: str | None = None) -> bool:
        """Revoke a delegation (and so everything beneath it); ``False`` if it already was."""
        from .delegating import revoke

        return revoke(self.wiring, delegation_id, by=by)

    def execute(
        self,
        action: Action,
        executor: Callable[[], Any],
        effect_key: str | None = None,
        *,
        lease: timedelta | None = None,
        reconcile: Reconcile | None = None,
        reconcile_eagerly: bool = False,
        preconditions: Any = None,
        task: str | None = None,
        hop: str | None = None,
        scope: Any = None,
    ) -> Receipt:
        """Run ``executor`` for a pre-built action through the whole pipeline; returns the receipt."""
        return self.run(
            action, executor, effect_key, lease=lease, reconcile=reconcile,
            reconcile_eagerly=reconcile_eagerly, preconditions=preconditions, task=task,
            hop=hop, scope=scope,
        )[1]  # fmt: skip

    def run(
        self, action: Action, executor: Callable[[], Any], effect_key: str | None = None, **settings: Unpack[CallOptions]
    ) -> tuple[Any, Receipt]:
        """Like ``execute``, but returns the executor's value with the terminal receipt."""
        return drive(self.pipeline(action, executor, effect_key, **settings))

    async def arun(
        self, action: Action, executor: Callable[[], Any], effect_key: str | None = None, **settings: Unpack[CallOptions]
    ) -> tuple[Any, Receipt]:
        """``run`` for an event loop: ``executor()`` may return an awaitable; store work runs in a
        worker thread, so the loop never waits on a lock."""
        return await drive_async(self.pipeline(action, executor, effect_key, **settings))

    def straight(
        self, action: Action, executor: Callable[[], Any], effect_key: str | None = None, **settings: Unpack[CallOptions]
    ) -> tuple[Any, Evaluation | None]:
        """Run an allowed call without the pipeline's steps: ``(value, None)``, or
        ``(GIVE_WAY, evaluation)`` when it must take the pipeline (``@protect`` then drives it)."""
        wiring = self.wiring
        options = wiring.options(action, effect_key, **settings)
        return wiring.straight.run(action, executor, options.effect_key, options)

    def refuse_effect_key(self, action: Action, error: Exception) -> Steps[None]:
        """Record an effect key that cannot be rendered (refused before policy: a denied receipt).

        A pipeline step: drive it with ``ctrlrun.control.steps.drive`` (``@protect`` does this).
        """
        return refuse_effect_key(self.wiring, action, error)

    def pipeline(
        self, action: Action, executor: Callable[[], Any], effect_key: str | None = None,
        *, evaluation: Evaluation | None = None, **settings: Unpack[CallOptions],
    ) -> Steps[tuple[Any, Receipt]]:  # fmt: skip
        """normalize → decide → approve → reserve → execute → resolve → record.

        A generator yielding the work it needs done (see ``ctrlrun.control.steps``); it returns
        the executor's value and the terminal receipt, or raises the refusal. ``evaluation`` is
        the policy's decision when the caller has it already (the straight path that gave way).
        """
        wiring = self.wiring
        options = wiring.options(action, effect_key, **settings)
        return run(wiring, action, executor, options, _ambient.presented_approval(), evaluation)


_PRINCIPALS: dict[tuple[str, str | None], Principal] = {}
