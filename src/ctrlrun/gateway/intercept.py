"""One intercepted ``tools/call``: from the client's message to the answer the client gets.

The order is fixed: shape, principal, arguments, action, effect key, decision, schema
pre-flight, approval, then one forward through ``Control`` (execute = forward) classified only
from what the gateway observed. A refusal ends the call and nothing is forwarded. The Control
records every refusal of a decided call (its events and receipt); the gateway answers by itself
only what is no attempt yet (shape, principal, arguments), a failed schema pre-flight and an
identical request still pending, none of which leaves a receipt.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from ..control import ambient as _ambient
from ..control.steps import drive
from ..action import Action, Principal
from ..approvals.records import ApprovalStatus
from ..control.front import Control
from ..errors import (
    ActionDenied,
    AmbiguousEffect,
    ApprovalMismatch,
    ApprovalRequired,
    AuthorityDenied,
    CTRLRunError,
    DuplicateEffect,
    EffectKeyError,
    InvalidArgument,
    NotExecuted,
)
from ..policy import Decision, render_effect_key, render_resource
from ..evidence.receipt import Receipt
from ._answers import Answers
from ._rounds import Rounds, Settling
from .config import GatewayConfig
from .outcome import Forward, Reply, Verdict, classify
from .tools import Catalog, SchemaRefusal
from .wire import TOOL_NAME, float_pointer

__all__ = ["Forward", "Interceptor", "Reply"]

log = logging.getLogger("ctrlrun.gateway")

TOKEN_META = "com.ctrlrun/idempotency_token"


class _Upstream(Exception):
    """What the executor raises for an outcome other than ``committed``; carries the verdict,
    and Control hands it the receipt it recorded."""

    receipt: Receipt | None = None

    def __init__(self, verdict: Verdict, reply: Reply) -> None:
        self.verdict = verdict
        self.reply = reply


class _Failed(_Upstream, NotExecuted):
    def __init__(self, verdict: Verdict, reply: Reply) -> None:
        _Upstream.__init__(self, verdict, reply)
        NotExecuted.__init__(self, f"the upstream did not run the tool: {verdict.detail}")


class _Ambiguous(_Upstream):
    def __init__(self, verdict: Verdict, reply: Reply) -> None:
        _Upstream.__init__(self, verdict, reply)
        Exception.__init__(self, f"the upstream's outcome is unknown: {verdict.detail}")


class Interceptor:
    """Runs each ``tools/call`` through the Control's pipeline (execute = forward)."""

    def __init__(self, config: GatewayConfig, control: Control, catalog: Catalog) -> None:
        self._config = config
        self._control = control
        self._catalog = catalog
        self._observing = control.policy.mode == "observe"
        self._rounds = Rounds(config.input_timeout)
        self._warned_principal = False
        self._lock = threading.Lock()

    def call(
        self,
        message: dict[str, Any],
        *,
        principal: Principal | str | None,
        revision: str | None,
        forward: Forward,
        reply: Reply,
    ) -> None:
        """Handle one ``tools/call`` request (already strict-parsed): refuse it, or forward it
        once and classify what came back. Calls ``reply`` with the client's answer (at most once
        for the request, nothing when the client cancelled). ``principal`` is the configured or
        header principal, ``None`` when there is none, or a string saying why none is usable
        (an identity header sent twice). Blocks until the call is settled."""
        answers = Answers(message.get("id"), self._catalog.action_name)
        try:
            self._call(message, answers, principal, revision, forward, reply)
        except _Refused as refused:
            reply(refused.answer)

    def abort_holds(self) -> None:
        """Turn every call waiting for input ambiguous now (the transport is shutting down)."""
        rounds = getattr(self, "_rounds", None)  # a test double may not build one
        if rounds is not None:
            rounds.abort()

    # -- the steps -----------------------------------------------------------------------------

    def _call(self, message: dict[str, Any], answers: Answers, principal: Principal | str | None,
              revision: str | None, forward: Forward, reply: Reply) -> None:  # fmt: skip
        params = message.get("params")
        tool, arguments = _shape(params, answers)
        assert isinstance(params, dict)
        answers.tool = tool
        who = self._principal(principal, answers)
        pointer = float_pointer(arguments)
        if pointer is not None:
            raise _Refused(answers.unrepresentable(pointer))
        policy = self._control.policy
        name = self._catalog.action_name(tool)
        try:
            template = policy.resource_template(name)
            resource = render_resource(template, arguments) if template is not None else None
            action = Action(name, arguments, who, resource=resource, environment=self._control.environment)
        except (InvalidArgument, EffectKeyError, ValueError) as exc:
            raise _Refused(answers.invalid(f"Invalid params: {exc}")) from None
        answers.action_id = action.action_id
        effect_key: str | None = None
        effect = policy.effect_template(name)
        if effect is not None:
            try:
                effect_key = render_effect_key(effect, action._arguments_view(), action.resource)
            except EffectKeyError as exc:
                if not self._observing and "inputResponses" not in params:
                    drive(self._control.refuse_effect_key(action, exc))
                    raise _Refused(answers.denied("effect_key_error")) from None
        answers.effect_key = effect_key
        if "inputResponses" in params:
            self._rounds.continue_call(action, params, forward, reply, answers)
            return
        decision = self._control.evaluate(action).decision
        if decision is not Decision.DENY or self._observing:
            try:
                self._catalog.preflight(tool, action.canonical_arguments)
            except SchemaRefusal as exc:
                raise _Refused(answers.invalid(f"Invalid params: {exc}")) from None
        approval_id: str | None = None
        if decision is Decision.APPROVE and not self._observing:
            approval_id = self._before_asking(action, effect_key, answers)
        self._run(message, action, effect_key, approval_id, revision, forward, reply, answers)

    def _principal(self, principal: Principal | str | None, answers: Answers) -> Principal:
        if isinstance(principal, Principal):
            return principal
        with self._lock:
            warn, self._warned_principal = not self._warned_principal, True
        if warn:
            log.warning("a tools/call came without a principal (%s); it was refused", principal or "none configured")
        raise _Refused(answers.no_principal(principal))

    def _before_asking(self, action: Action, effect_key: str | None, answers: Answers) -> str | None:
        """The approval to present for an ``approve`` decision: a granted one to spend, or the
        denied request so that the Control records the denial. ``None``
        runs without one: the Control refuses a settled key with its ``blocked`` receipt, or asks
        a human. Only an identical request still pending is answered here, with no receipt:
        waiting for a human is not an outcome. Reads only."""
        store: Any = self._control.store
        digest = action.action_hash
        granted = store.find_granted_approval(digest)
        if granted is not None:
            return str(granted.approval_id)
        denied = store.find_denied_request(digest)
        if denied is not None:
            return str(denied.request_id)
        if effect_key is not None:
            record = store.get_effect(effect_key)
            if record is not None and record.state.value in ("committed", "ambiguous"):
                return None  # the Control refuses it, with its receipt, before it asks anyone
        now = self._control.clock()
        for record in store.approvals_for(digest):
            if record.status is ApprovalStatus.PENDING and record.request.expires_at > now:
                raise _Refused(answers.approval_required(record.approval_id, digest, record.request.expires_at))
        return None

    def _run(self, message: dict[str, Any], action: Action, effect_key: str | None, approval_id: str | None,
             revision: str | None, forward: Forward, reply: Reply, answers: Answers) -> None:  # fmt: skip
        flags = self._control.policy.mcp_options(action.name)
        seen: list[tuple[Verdict, Reply]] = []

        def executor() -> Any:
            request = _forwarded(message, action, effect_key is not None)
            verdict = classify(forward(request), revision=revision, not_executed_on_error=flags["not_executed_on_error"])
            target = reply
            if verdict.state == "waiting":
                verdict, target = self._rounds.hold(
                    action, verdict, reply, answers, revision=revision, flags=flags,
                    forward_request=lambda m: _forwarded(m, action, effect_key is not None),
                    max_rounds=self._config.max_input_rounds,
                )  # fmt: skip
            seen.append((verdict, target))
            if verdict.state == "committed":
                return verdict
            if verdict.state == "failed":
                raise _Failed(verdict, target)
            raise _Ambiguous(verdict, target)

        try:
            if approval_id is not None:
                with _ambient.with_approval(approval_id):
                    value, receipt = self._control.run(action, executor, effect_key)
            else:
                value, receipt = self._control.run(action, executor, effect_key)
        except _Upstream as outcome:
            self._relay(outcome.verdict, outcome.reply, outcome.receipt, answers, action)
            return
        except CTRLRunError as refusal:
            if seen:  # the tool was forwarded, its outcome could not be recorded
                verdict, target = seen[-1]
                log.error("the outcome of %s could not be recorded: %s", action.name, refusal)
                self._relay(Verdict("ambiguous", verdict.relay, verdict.detail, verdict.silent), target, None, answers, action)
                return
            reply(self._refusal(refusal, answers, approval_id))
            return
        assert isinstance(value, Verdict)
        self._relay(value, seen[-1][1], receipt, answers, action)

    def _relay(self, verdict: Verdict, reply: Reply, receipt: Receipt | None, answers: Answers, action: Action) -> None:
        if verdict.silent:
            if isinstance(reply, Settling):
                reply.settle()
            return
        if verdict.relay is None:
            if verdict.state == "failed":
                reply(answers.not_executed(receipt))
            else:
                reply(answers.upstream_ambiguous(receipt))
            return
        reply(answers.with_receipt(verdict.relay, receipt, verdict.state))

    def _refusal(self, refusal: CTRLRunError, answers: Answers, approval_id: str | None) -> dict[str, Any]:
        """The client's answer to a refusal the Control recorded; ``approval_id`` is the
        approval presented (a denied request answers ``-41003`` naming it)."""
        if isinstance(refusal, AuthorityDenied):
            return answers.unauthorized(refusal.reason, refusal.grant_id)
        if isinstance(refusal, ActionDenied):
            if refusal.reason == "approval_denied" and approval_id is not None:
                return answers.approval_denied(approval_id)
            return answers.denied(refusal.reason)
        if isinstance(refusal, ApprovalRequired):
            record = self._control.store.get_approval(refusal.request_id)
            expires = record.request.expires_at if record is not None else None
            return answers.approval_required(refusal.request_id, refusal.action_hash or "", expires)
        if isinstance(refusal, ApprovalMismatch):
            if refusal.reason == "denied" and refusal.approval_id:
                return answers.approval_denied(refusal.approval_id)
            return answers.blocked(refusal.reason)
        if isinstance(refusal, DuplicateEffect):
            return answers.duplicate(refusal.effect_key or answers.effect_key or "", refusal.state)
        if isinstance(refusal, AmbiguousEffect):
            return answers.ambiguous(refusal.effect_key or answers.effect_key or "")
        log.error("%s refused before anything was forwarded: %s", answers.action, refusal)
        return answers.internal(f"ctrlrun could not run the call, and nothing was forwarded: {refusal}")


class _Refused(Exception):
    def __init__(self, answer: dict[str, Any]) -> None:
        super().__init__(answer.get("error", {}).get("message", ""))
        self.answer = answer


def _shape(params: Any, answers: Answers) -> tuple[str, dict[str, Any]]:
    if not isinstance(params, dict):
        raise _Refused(answers.invalid("Invalid params: tools/call needs a params object"))
    name = params.get("name")
    if not isinstance(name, str) or TOOL_NAME.fullmatch(name) is None:
        raise _Refused(answers.invalid("Invalid params: the tool name must be 1-128 of A-Z a-z 0-9 . _ -"))
    arguments = params.get("arguments", {})
    if not isinstance(arguments, dict):
        raise _Refused(answers.invalid("Invalid params: arguments must be an object"))
    if "task" in params:
        raise _Refused(answers.invalid("Invalid params: task-augmented calls are not accepted by the ctrlrun gateway"))
    return name, arguments


def _forwarded(message: dict[str, Any], action: Action, holding: bool) -> dict[str, Any]:
    """The request as the upstream gets it: the canonical arguments (what was hashed, approved
    and reserved) and, when a key is held, the idempotency token; nothing else changes."""
    params = dict(message["params"])
    params["arguments"] = action.canonical_arguments
    if holding:
        meta = params.get("_meta")
        params["_meta"] = {**(meta if isinstance(meta, dict) else {}), TOKEN_META: _ambient.idempotency_token()}
    return {**message, "params": params}

