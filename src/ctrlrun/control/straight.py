"""The allowed call's straight path: ``pipeline.run`` for its commonest case, without steps.

A synchronous call that the policy allows and that presents no approval needs only two store
writes (*start*: the key reserved into ``executing`` with its events; *finish*: the outcome, its
event and the receipt) around the function. This runs exactly those, with the events built as
rows and the receipt as one document, and gives way to the pipeline for everything else: another
decision, a refused reservation (the pipeline records the refusal, the start wrote nothing), a
function that raises or an outcome the store refuses (the pipeline's own steps record them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import ambient as _ambient
from .attempt import Attempt, fan_out
from .steps import GIVE_WAY, drive
from .._time import format_ts
from ..action import _CANONICAL_JSON, Action, Principal, _json_opt, _json_str, new_id
from ..effects.records import EffectState
from .outcomes import lost_start, outcome_unrecorded, raised, unrecorded
from ..errors import AmbiguousEffect, AmbiguousWrite, CTRLRunError, DuplicateEffect, InvalidArgument
from ..policy import Decision, Evaluation
from ..evidence.drafts import ReceiptDraft, Writer, receipt_formats
from ..evidence.receipt import _COMPACT_JSON, RECEIPT_SCHEMA
from ..store.codec import dumps

if TYPE_CHECKING:
    from .options import _Options
    from .wiring import Wiring

__all__ = ["GIVE_WAY", "Straight"]


_NO_PLACE = '{"task":null,"hop":null}'


class _Decided:
    """What one policy outcome contributes to every allowed call: its event data, the receipt's
    constant keys, and the receipt's formats with those written, per protected function."""

    __slots__ = ("evaluated", "constants", "sites")

    def __init__(self, wiring: Wiring, evaluation: Evaluation) -> None:
        decision = str(evaluation.decision)
        self.evaluated = dumps(
            {"decision": decision, "reason": evaluation.reason}, "POLICY_EVALUATED event data"
        )
        self.constants: dict[str, Any] = {
            "schema": RECEIPT_SCHEMA, "environment": wiring.environment, "decision": decision,
            "decision_reason": evaluation.reason, "approval_id": None, "approver": None,
            "result": "committed", "execution": None, "would_have": None, "error": None,
            "policy_hash": wiring.policy_hash, "policy_version": wiring.policy.version,
            "controls": list(evaluation.controls), "precondition_at_request": None,
            "precondition_at_recheck": None, "approvers": [], "authority_grant_id": None,
            "scope_hash": None, "budget_charges": [], "edited_from": None, "edit_diff": None,
        }  # fmt: skip
        #: the formats with the action's name written too, and each of resource, task and hop
        #: that is null, by (name, which are null): what one protected function's calls share
        self.sites: dict[tuple[str, bool, bool, bool], tuple[Writer, Writer]] = {}

    def site_formats(self, site: tuple[str, bool, bool, bool]) -> tuple[Writer, Writer]:
        formats = self.sites.get(site)
        if formats is None:
            name, no_resource, no_task, no_hop = site
            constants = {**self.constants, "action": name}
            constants.update((k, None) for k, null in
                             (("resource", no_resource), ("task", no_task), ("hop", no_hop)) if null)  # fmt: skip
            if len(self.sites) >= 1024:
                self.sites.clear()
            formats = self.sites[site] = receipt_formats(constants)
        return formats


def _principal_texts(principal: Principal) -> tuple[str, str]:
    """The principal's receipt form as JSON: in its own key order, and sorted."""
    document = principal.to_dict()
    return _COMPACT_JSON.encode(document), _CANONICAL_JSON.encode(document)


class Straight:
    """One Control's straight path, with what it keeps per policy outcome."""

    def __init__(self, wiring: Wiring) -> None:
        self.wiring = wiring
        self._decided: dict[tuple[str, tuple[str, ...]], _Decided] = {}
        self._principals: dict[tuple[str, str | None], tuple[str, str]] = {}
        policy = wiring.policy
        self._ceilinged = frozenset(n for n in policy.actions if policy.max_attempts(n) is not None)

    def run(
        self,
        action: Action,
        executor: Callable[[], Any],
        effect_key: str | None,
        options: _Options,
    ) -> tuple[Any, Evaluation | None]:
        """``(value, None)`` once the call ran and is recorded, or ``(GIVE_WAY, evaluation)``
        when it must take the pipeline (nothing written but a refusal's kept write)."""
        wiring = self.wiring
        if action.principal.expires_at is not None or wiring.authority is not None or wiring.observing:
            return GIVE_WAY, None  # the pipeline judges an expiring principal, authority, observing
        if action.name in self._ceilinged:
            return GIVE_WAY, None  # the pipeline counts attempts against the ceiling
        evaluation = wiring.policy.evaluate(action)
        if evaluation.decision is not Decision.ALLOW or _ambient._approval.get() is not None:
            return GIVE_WAY, evaluation
        decided = self._decided.get((evaluation.reason, evaluation.controls))
        if decided is None:
            decided = _Decided(wiring, evaluation)
            self._decided[(evaluation.reason, evaluation.controls)] = decided
        store, sinks, clock = wiring.store, wiring.sinks, wiring.clock
        action_id, action_hash = action.action_id, action.action_hash
        started_at = format_ts(clock())
        task, hop = options.task, options.hop
        place = _NO_PLACE if task is None and hop is None else dumps(
            {"task": task, "hop": hop}, "EXECUTION_STARTED event data"
        )  # fmt: skip

        def started(approval: Any, reservation: Any) -> list[Any]:
            rows = [
                (started_at, "ACTION_PROPOSED", action_id, effect_key, None,
                 '{"action_hash":"' + action_hash + '"}'),
                (started_at, "POLICY_EVALUATED", action_id, effect_key, None, decided.evaluated),
            ]  # fmt: skip
            if reservation is not None:
                rows.append((started_at, "EFFECT_RESERVED", action_id, effect_key, None,
                             '{"attempt":%d,"lease_expires_at":"%s"}'
                             % (reservation.attempt, format_ts(reservation.lease_expires_at))))  # fmt: skip
            rows.append((started_at, "EXECUTION_STARTED", action_id, effect_key, None, place))
            return rows

        try:
            _, reservation, stored = store.start_attempt(
                action_id=action_id, effect_key=effect_key, lease=options.lease,
                action_hash=action_hash, events=started, return_events=bool(sinks),
            )  # fmt: skip
        except (DuplicateEffect, AmbiguousEffect):
            return GIVE_WAY, evaluation  # refused, nothing written but a kept write
        except AmbiguousWrite as lost:
            attempt = self._attempt(action, effect_key, options, evaluation, started_at, 1)
            raise drive(lost_start(wiring, attempt, lost)) from None
        if sinks:
            fan_out(sinks, stored, None)
        number = reservation.attempt if reservation is not None else 1
        holding = _ambient.hold(effect_key, number)
        try:
            value = executor()
        except BaseException as exc:
            try:  # recorded while the key is still held, as in the pipeline
                attempt = self._attempt(action, effect_key, options, evaluation, started_at, number)
                drive(raised(wiring, attempt, options, exc))
            finally:
                _ambient.release(holding)
            raise
        _ambient.release(holding)
        finished_at = format_ts(clock())
        principal = action.principal
        texts = self._principals.get((principal.agent, principal.user))
        if texts is None or principal.claims or principal.issuer or principal.expires_at:
            texts = _principal_texts(principal)
            if not (principal.claims or principal.issuer or principal.expires_at):
                if len(self._principals) > 1024:
                    self._principals.clear()
                self._principals[(principal.agent, principal.user)] = texts
        receipt_id = new_id("ctr")
        resource = action.resource
        values = {
            "receipt_id": '"' + receipt_id + '"', "action_id": _json_str(action_id),
            "action_hash": '"' + action_hash + '"', "principal": texts[0],
            "principal_sorted": texts[1], "arguments": action._arguments_json,
            "effect_key": _json_opt(effect_key), "attempt": str(number),
            "started_at": '"' + started_at + '"', "finished_at": '"' + finished_at + '"',
        }  # fmt: skip
        if resource is not None:
            values["resource"] = _json_str(resource)
        if task is not None:
            values["task"] = _json_str(task)
        if hop is not None:
            values["hop"] = _json_str(hop)
        formats = decided.site_formats((action.name, resource is None, task is None, hop is None))
        draft = ReceiptDraft(
            values, formats, receipt_id=receipt_id, action_id=action_id,
            effect_key=effect_key, result="committed", finished_at=finished_at,
        )  # fmt: skip
        try:
            events, _ = store.finish_attempt(
                effect_key=effect_key, action_id=action_id,
                outcome=EffectState.COMMITTED if effect_key is not None else None, result=value,
                events=((finished_at, "EXECUTION_COMMITTED", action_id, effect_key, None, "{}"),),
                receipt=draft, return_events=bool(sinks),
            )  # fmt: skip
        except (AmbiguousEffect, DuplicateEffect, InvalidArgument) as refusal:
            if effect_key is None:
                raise
            attempt = self._attempt(action, effect_key, options, evaluation, started_at, number)
            drive(unrecorded(wiring, attempt, "returned", refusal))
            raise refusal from None
        except CTRLRunError as failed:  # the store never took it, retried until its deadline
            attempt = self._attempt(action, effect_key, options, evaluation, started_at, number)
            raise outcome_unrecorded(attempt, "returned", failed) from None
        if sinks:
            fan_out(sinks, events, draft.receipt())
        return value, None

    def _attempt(
        self, action: Action, effect_key: str | None, options: _Options, evaluation: Evaluation,
        started_at: str, number: int,
    ) -> Attempt:  # fmt: skip
        """The pipeline's record of this attempt so far, for the steps that take over."""
        wiring = self.wiring
        attempt = Attempt(
            action=action, effect_key=effect_key, approval_id=None, clock=wiring.clock,
            policy_hash=wiring.policy_hash, policy_version=wiring.policy.version,
            task=options.task, hop=options.hop,
        )  # fmt: skip
        attempt.started_at = started_at
        attempt.decision = str(evaluation.decision)
        attempt.reason = evaluation.reason
        attempt.controls = tuple(evaluation.controls)
        attempt.attempt = number
        return attempt

