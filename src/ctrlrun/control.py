"""Control: the seven steps of a protected call, top to bottom."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Unpack, cast

from . import _ambient
from ._settings import CallOptions, ReadOnly, Reconcile, ReconcileOutcome, _Options, _positive, _resolve_environment  # noqa: F401
from ._starting import start
from ._observing import note, note_if, observe_approval, observe_asking, observe_budgets, observe_start
from ._ceiling import ceiling_of, refuse_early, refuse_reserved
from ._authorize import authority_of, authorize, measure
from ._attempt import Attempt, describe, fan_out, message_of, storable
from ._outcomes import outcome_unrecorded
from ._preconditions import check_provider, request_fingerprint
from ._reconciling import reconcile
from ._refusals import refuse_before_asking
from ._steps import Steps, call, drive, drive_async, run_function, unwrap
from ._straight import Straight
from ._time import Clock, format_ts, utc_now
from .action import Action, Principal
from .approvals import DEFAULT_APPROVAL_TTL, ApprovalProvider, LocalApprovalProvider
from .effect import DEFAULT_LEASE, EffectState
from .errors import (
    ActionDenied,
    AmbiguousEffect,
    AmbiguousWrite,
    ApprovalRequired,
    CTRLRunError,
    DuplicateEffect,
    IdentityError,
    InvalidArgument,
    NotExecuted,
    PolicyError,
)
from .identity import IdentityProvider
from .policy.decision import Decision, Evaluation
from .receipt import EventSink, EventType, JSONLEventSink, Receipt
from .store import StateStore

if TYPE_CHECKING:
    from .authority import Authority, Delegation, Grant
    from .policy import Policy

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
        from .policy import Policy  # the engine (YAML, pydantic) loads with the first Control

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
        self._policy = policy
        self._store = store
        self._clock = clock
        self._approval_ttl = _positive(approval_ttl, "Control(approval_ttl=...)")
        self._lease = _positive(lease, "Control(lease=...)")
        self._suspend_timeout = suspend_timeout
        self._sinks = tuple(sinks)
        if anchor is not None or anchor_every is not None:
            if anchor is None or anchor_every is None:
                raise InvalidArgument("Control(anchor=..., anchor_every=N) go together: give both or neither")
            from ._anchoring import AnchorEvery

            self._sinks = (*self._sinks, AnchorEvery(store, anchor, anchor_every))
        self._identity = identity
        self._environment = _resolve_environment(environment, policy)
        self._policy_hash = policy.runtime_hash(self._environment)
        self._approvals = approvals if approvals is not None else LocalApprovalProvider(
            store, clock=clock
        )
        self._authority = authority_of(policy.authority, authority)
        self._observing = policy.mode == "observe"  # record every refusal, enforce none
        self._ceiling_warned: set[str] = set()  # actions warned of a ceiling without a key
        if authority is not None and self._authority is not None:  # the hash names what is enforced
            self._policy_hash = policy.runtime_hash(self._environment, authority=self._authority.hash_member())
        self._straight = Straight(self)

    # -- construction from files ---------------------------------------------------------

    @classmethod
    def from_file(cls, path: str | os.PathLike[str] | None = None, *, environment: str | None = None) -> Control:
        """The default wiring: the policy file, its store and a JSONL copy of the evidence."""
        from ._locations import open_default_store, policy_path
        from .policy import Policy

        policy = Policy.from_file(policy_path(path))
        store, evidence_dir = open_default_store(policy_path(path))
        sinks = (JSONLEventSink(evidence_dir),) if evidence_dir is not None else ()
        return cls(policy, store, sinks=sinks, environment=environment)

    # -- read-only properties ------------------------------------------------------------

    policy = ReadOnly["Policy"]("_policy")
    store = ReadOnly[StateStore]("_store")
    approvals = ReadOnly[ApprovalProvider]("_approvals")
    sinks = ReadOnly[tuple[EventSink, ...]]("_sinks")
    lease = ReadOnly[timedelta]("_lease")
    identity = ReadOnly[IdentityProvider | None]("_identity")
    environment = ReadOnly[str]("_environment")
    clock = ReadOnly[Clock]("_clock")
    policy_hash = ReadOnly[str]("_policy_hash")
    approval_ttl = ReadOnly[timedelta]("_approval_ttl")
    authority = ReadOnly["Authority | None"]("_authority")
    approver_identity = ReadOnly[None]("_unbuilt")
    require_approved_policy = ReadOnly[bool]("_no")
    _unbuilt, _no = None, False

    # -- public steps ----------------------------------------------------------------------

    def resolve_principal(self, action_name: str) -> Principal:
        """The principal for a call: the identity provider's, else the active ``context()``."""
        if self._identity is not None:
            try:
                principal = self._identity.principal(action_name)
            except CTRLRunError:
                raise
            except Exception as exc:
                raise IdentityError(
                    f"identity provider {type(self._identity).__name__} failed for action "
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
        self._check_environment(action)
        expired = action.principal.expires_at
        if expired is not None and self._clock() > expired:
            return Evaluation(Decision.DENY, "principal_expired")
        if self._authority is not None:
            from .authority import resolve

            try:
                records = self._store.delegations(include_revoked=True)
            except InvalidArgument:  # a row the store cannot read: fail closed
                return Evaluation(Decision.DENY, "authority_unreadable")
            resolution = resolve(
                self._authority, records, action=action, environment=self._environment,
                task=task, now=self._clock(),
            )  # fmt: skip
            if not resolution.passed:
                return Evaluation(Decision.DENY, resolution.reason)
        return self._policy.evaluate(action)

    def delegate(self, parent_id: str, grant: Grant, *, by: Principal, created_via: str = "api") -> Delegation:
        """Hand part of ``parent_id``'s grant to another principal; never wider than the parent.
        A refusal raises ``AuthorityEscalation`` naming the reason (and the dimension)."""
        from ._delegating import delegate

        return delegate(self, parent_id, grant, by=by, created_via=created_via)

    def revoke(self, delegation_id: str, *, by: str | None = None) -> bool:
        """Revoke a delegation (and so everything beneath it); ``False`` if it already was."""
        from ._delegating import revoke

        return revoke(self, delegation_id, by=by)

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
        options = self._options(action, effect_key, **settings)
        return self._straight.run(action, executor, options.effect_key, options)

    def refuse_effect_key(self, action: Action, error: Exception) -> Steps[None]:
        """Record an effect key that cannot be rendered (refused before policy: a denied receipt).

        A pipeline step: drive it with ``ctrlrun._steps.drive`` (``@protect`` does this).
        """
        attempt = self._attempt(action, None, _ambient.presented_approval(), None, None)
        attempt.reason = "effect_key_error"
        attempt.event(EventType.ACTION_PROPOSED, action_hash=action.action_hash)
        attempt.event(EventType.ACTION_DENIED, reason="effect_key_error")
        yield from self._record(attempt, attempt.receipt("denied", storable(str(error))))

    # -- the pipeline ----------------------------------------------------------------------

    def pipeline(
        self, action: Action, executor: Callable[[], Any], effect_key: str | None = None,
        *, evaluation: Evaluation | None = None, **settings: Unpack[CallOptions],
    ) -> Steps[tuple[Any, Receipt]]:  # fmt: skip
        """normalize → decide → approve → reserve → execute → resolve → record.

        A generator yielding the work it needs done (see ``ctrlrun._steps``); it returns the
        executor's value and the terminal receipt, or raises the refusal. ``evaluation`` is the
        policy's decision when the caller has it already (the straight path that gave way).
        """
        options = self._options(action, effect_key, **settings)
        approval_id = _ambient.presented_approval()
        attempt = self._attempt(action, options.effect_key, approval_id, options.task, options.hop)

        # normalize
        attempt.event(EventType.ACTION_PROPOSED, action_hash=action.action_hash)

        # decide (observing, each refusal is noted and the call goes on: ``_observing``)
        observing = attempt.observing = self._observing
        expired = action.principal.expires_at
        if expired is not None and self._clock() > expired:
            if observing:
                note(attempt, "principal_expired")
            else:
                attempt.decision, attempt.reason = str(Decision.DENY), "principal_expired"
                attempt.event(EventType.ACTION_DENIED, reason="principal_expired")
                yield from self._record(attempt, attempt.receipt("denied"))
                raise ActionDenied(
                    f"action {action.name!r} denied: the principal {action.principal.agent!r} "
                    f"expired at {format_ts(expired)}; renew its credential before calling again",
                    reason="principal_expired",
                    action_id=action.action_id,
                )
        resolution = (yield from authorize(self, attempt)) if self._authority is not None else None
        if resolution is not None and not resolution.passed:  # observed: the policy is not asked
            evaluation = Evaluation(Decision.DENY, resolution.reason)
        else:
            if evaluation is None:
                evaluation = self._policy.evaluate(action)
            attempt.decision = str(evaluation.decision)
            attempt.reason = evaluation.reason
            attempt.controls = tuple(evaluation.controls)
            attempt.event(EventType.POLICY_EVALUATED, decision=attempt.decision, reason=attempt.reason)
        if evaluation.decision is Decision.DENY and not note_if(attempt, evaluation.reason):
            attempt.event(EventType.ACTION_DENIED, reason=evaluation.reason)
            yield from self._record(attempt, attempt.receipt("denied"))
            raise ActionDenied(
                denial_message(self._policy, action.name, evaluation.reason),
                reason=evaluation.reason,
                action_id=action.action_id,
            )

        ceiling = ceiling_of(self, attempt)
        yield from refuse_early(self, attempt, ceiling)
        charges = yield from measure(self, attempt, resolution)

        # approve (observing, nobody is asked and nothing is spent)
        consume = evaluation.decision is Decision.APPROVE
        if consume and approval_id is None:
            if observing:
                yield from observe_asking(self, attempt, options)
            else:
                yield from refuse_before_asking(self, attempt, options.lease)
                yield from self._request_approval(attempt, options)
        elif consume and observing:
            assert approval_id is not None
            yield from observe_approval(self, attempt, approval_id, options)

        # reserve (the approval is spent in the same transaction)
        if observing:
            reservation = yield from observe_start(self, attempt, options)
            yield from observe_budgets(self, attempt, charges)
        else:
            reservation = yield from self._start(attempt, options, approval_id if consume else None, charges, ceiling)
        if reservation is not None and ceiling is not None and reservation.attempt > ceiling:
            yield from refuse_reserved(self, attempt, reservation, ceiling)  # raises unless observing
        if not consume and approval_id is not None and not observing:
            yield from self._close_unneeded_approval(attempt, approval_id)

        # execute, resolve, record
        return (yield from self._execute(attempt, options, executor, reservation))

    def _options(
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
        self._check_environment(action)
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
        lease = self._lease if lease is None else _positive(lease, "lease")
        return _Options(effect_key, lease, reconcile, reconcile_eagerly, task, hop, preconditions)

    def _check_environment(self, action: Action) -> None:
        if action.environment != self._environment:
            raise InvalidArgument(
                f"action {action.name!r} is for environment {action.environment!r} but this "
                f"Control runs {self._environment!r}; build the Action with "
                f"environment={self._environment!r}"
            )

    def _attempt(
        self, action: Action, effect_key: str | None, approval_id: str | None,
        task: str | None, hop: str | None,
    ) -> Attempt:  # fmt: skip
        return Attempt(
            action=action,
            effect_key=effect_key,
            approval_id=approval_id,
            clock=self._clock,
            policy_hash=self._policy_hash,
            policy_version=self._policy.version,
            task=task,
            hop=hop,
        )

    def _request_approval(self, attempt: Attempt, options: _Options) -> Steps[None]:
        action = attempt.action
        fingerprinted = yield from request_fingerprint(self, attempt, options.preconditions)
        request = yield call(self._approvals.request, action, self._approval_ttl,
                             policy_hash=self._policy_hash, **fingerprinted)  # fmt: skip
        attempt.event(
            EventType.APPROVAL_REQUESTED,
            approval_id=request.request_id,
            action_hash=action.action_hash,
            expires_at=format_ts(request.expires_at),
        )
        yield from self._record(attempt, None)
        raise ApprovalRequired(
            request_id=request.request_id,
            action_id=action.action_id,
            action_hash=action.action_hash,
        )

    def _start(
        self, attempt: Attempt, options: _Options, approval_id: str | None, charges: Sequence[Any] = (),
        ceiling: int | None = None,
    ) -> Steps[Any]:
        """Consume the approval, reserve the key and take the budget charges in one store
        transaction; record refusals."""
        return (yield from start(self, attempt, options, approval_id, charges, ceiling))

    def _execute(
        self, attempt: Attempt, options: _Options, executor: Callable[[], Any], reservation: Any
    ) -> Steps[tuple[Any, Receipt]]:
        key = options.effect_key if attempt.holding else None
        number = reservation.attempt if reservation is not None else 1
        with _ambient.holding_effect(key, number):
            try:
                value = yield run_function(executor)
            except BaseException as caught:
                exc = unwrap(caught)
                yield from self._raised(attempt, options, exc)
                if exc is caught:
                    raise
                raise exc from None  # a GeneratorExit, carried in: the caller gets it back
        receipt = yield from self._finish(attempt, EffectState.COMMITTED, value, None, "returned")
        assert receipt is not None  # a refused outcome raised
        return value, receipt

    def _raised(self, attempt: Attempt, options: _Options, exc: BaseException) -> Steps[None]:
        """Record what a function that raised leaves behind; the caller re-raises ``exc``."""
        # The function's own exception always goes on; what became of its outcome in the store
        # (not written, or refused because the key was resolved meanwhile) rides on it as a note.
        if isinstance(exc, NotExecuted):
            error = storable(message_of(exc) or describe(exc))
            try:
                failed = yield from self._finish(attempt, EffectState.FAILED, None, error, "raised NotExecuted")
            except (AmbiguousWrite, AmbiguousEffect, DuplicateEffect, InvalidArgument) as unrecorded:
                exc.add_note(_outcome_note(attempt, unrecorded))
                return
            _hand_receipt(exc, failed)
            return
        try:
            wrote = yield from self._finish(
                attempt, EffectState.AMBIGUOUS, None, describe(exc), "raised " + type(exc).__name__,
            )  # fmt: skip
        except (AmbiguousWrite, AmbiguousEffect, DuplicateEffect, InvalidArgument) as unrecorded:
            exc.add_note(_outcome_note(attempt, unrecorded))
            return
        _hand_receipt(exc, wrote)
        if (wrote and options.reconcile_eagerly and isinstance(exc, Exception) and options.effect_key
                and not attempt.observing):  # fmt: skip
            yield from self._reconcile(attempt, options, "eager")
            if attempt.pending:
                yield from self._record(attempt, None)

    def _finish(self, attempt: Attempt, outcome: EffectState, value: Any, error: str | None,
                did: str, *, ran: bool = True) -> Steps[Receipt | None]:  # fmt: skip
        """Write the outcome, its event and the receipt in one transaction (the store retries
        it); one it never confirms raises ``AmbiguousWrite`` saying that the function ``ran``."""
        event_type = {
            EffectState.COMMITTED: EventType.EXECUTION_COMMITTED,
            EffectState.FAILED: EventType.EXECUTION_FAILED,
            EffectState.AMBIGUOUS: EventType.EXECUTION_AMBIGUOUS,
        }[outcome]
        attempt.event(event_type, **({} if error is None else {"error": error}))
        receipt = attempt.receipt(outcome.value, error)
        if not attempt.holding:  # observed, its reservation refused: no record to move
            return (yield from self._record(attempt, receipt))
        try:
            events, stored = yield call(
                self._store.finish_attempt,
                effect_key=attempt.effect_key,
                action_id=attempt.action.action_id,
                outcome=outcome if attempt.effect_key else None,
                result=value,
                error=error,
                events=attempt.take(),
                receipt=receipt,
                return_events=bool(self._sinks),
            )
        except (AmbiguousEffect, DuplicateEffect, InvalidArgument) as refusal:
            if not attempt.effect_key:
                raise
            attempt.pending.clear()
            yield from self._unrecorded(attempt, did, refusal)
            raise refusal from None
        except CTRLRunError as failed:
            if not ran:
                raise
            raise outcome_unrecorded(attempt, did, failed) from None
        fan_out(self._sinks, events, stored)
        return cast("Receipt | None", stored)

    def _unrecorded(self, attempt: Attempt, did: str, refusal: CTRLRunError) -> Steps[None]:
        """The store refused the outcome of a function that ran: record it ambiguous."""
        message = storable(f"the function {did}, but its outcome could not be recorded: {refusal}")
        attempt.event(EventType.EXECUTION_AMBIGUOUS, error=message)
        yield from self._record(attempt, attempt.receipt("ambiguous", message))

    # -- refusals --------------------------------------------------------------------------

    def _close_unneeded_approval(self, attempt: Attempt, approval_id: str) -> Steps[None]:
        """An allowed action presenting a matching grant closes it; any failure is ignored."""
        try:
            approval = yield call(self._store.consume_approval, approval_id, attempt.action.action_hash)
            attempt.spent(approval)
        except CTRLRunError as exc:
            log.info("presented approval %s left as it was: %s", approval_id, exc)

    # -- reconcile -------------------------------------------------------------------------

    def _reconcile(self, attempt: Attempt, options: _Options, trigger: str) -> Steps[str]:
        """Ask the hook what became of an ambiguous effect; move the record if it knows."""
        return (yield from reconcile(self._store, attempt, options, trigger))

    # -- store helpers ---------------------------------------------------------------------

    def _record(self, attempt: Attempt, receipt: Receipt | None) -> Steps[Receipt | None]:
        events, stored = yield call(self._store.record, events=attempt.take(), receipt=receipt)
        fan_out(self._sinks, events, stored)
        return cast("Receipt | None", stored)

    def _approver_of(self, approval_id: str | None) -> Steps[str | None]:
        if not approval_id:
            return None
        record = yield call(self._store.get_approval, approval_id)
        return record.approver if record is not None else None

    def _attempt_number(self, effect_key: str | None) -> Steps[int]:
        if not effect_key:
            return 1
        record = yield call(self._store.get_effect, effect_key)
        return record.attempt if record is not None else 1


_PRINCIPALS: dict[tuple[str, str | None], Principal] = {}


def denial_message(policy: Policy, name: str, reason: str) -> str:
    """What a policy denial says; an action the policy does not name says which file was read
    and the nearest name it does have (a typo in the decorator or in the policy)."""
    if reason != "unknown_action":
        return f"action {name!r} denied by policy ({reason})"
    import difflib

    known = policy.actions
    nearest = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f" (did you mean {nearest[0]!r}?)." if nearest else (
        f"; it names {', '.join(repr(a) for a in known[:5])}{', …' if len(known) > 5 else ''}."
        if known else "; it names no action.")  # fmt: skip
    return (f"action {name!r} denied by policy (unknown_action): {policy.source} has no entry "
            f"for it under actions{hint} Fix the name, or add the action to the policy")  # fmt: skip


def _outcome_note(attempt: Attempt, unrecorded: CTRLRunError) -> str:
    """The note a function's exception carries when the store did not take its outcome."""
    if isinstance(unrecorded, AmbiguousWrite):
        return str(unrecorded)
    key = attempt.effect_key
    return (f"ctrlrun: effect {key!r} was settled by someone else while the function ran, so this "
            f"attempt's outcome was recorded as ambiguous beside it, not on the key: {unrecorded}")


def _hand_receipt(exc: BaseException, receipt: Receipt | None) -> None:
    """An executor's exception that declares ``receipt = None`` gets the receipt recorded for it
    (the MCP gateway names it in its answer)."""
    if receipt is not None and getattr(exc, "receipt", 0) is None:
        setattr(exc, "receipt", receipt)
