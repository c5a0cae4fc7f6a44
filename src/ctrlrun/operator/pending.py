"""The approval requests waiting for a human, as one document each (``pending --json``, the
console's ``/api/pending``), with the effect each would claim and that effect's state."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._time import format_ts
from ..approvals.records import ApprovalRecord
from ..effects.records import EffectState
from ..errors import CTRLRunError, EffectKeyError
from ..policy import Policy, render_effect_key
from ..evidence.receipt import EventType
from ..store import StateStore

__all__ = ["KeyOf", "effect_state", "pending_document", "policy_keys", "requested_key"]

#: (effect key or None, its state or None) for one request.
KeyOf = Callable[[ApprovalRecord], tuple[str | None, str | None]]


def effect_state(store: StateStore, key: str | None) -> str | None:
    """The key's current state (``new`` with no record yet); None without a key."""
    if key is None:
        return None
    record = store.get_effect(key)
    return EffectState.NEW.value if record is None else record.state.value


def requested_key(store: StateStore, request_id: str) -> str | None:
    """The effect key the request's ``APPROVAL_REQUESTED`` event recorded (None without one)."""
    for event in store.events_for(approval_id=request_id):
        if event.type is EventType.APPROVAL_REQUESTED and event.approval_id == request_id:
            return event.effect_key
    return None


def policy_keys(store: StateStore, path: Path, note: Callable[[str], None]) -> KeyOf:
    """How to find a request's effect key: rendered from the policy's template for its action; a
    policy that cannot be loaded is said through ``note`` and no keys are shown."""
    try:
        policy: Policy | None = Policy.from_file(path)
    except CTRLRunError as exc:
        note(f"note: effect keys are not shown: cannot load the policy {path} ({exc}); set "
             "CTRLRUN_CONFIG to the policy the agents run under")  # fmt: skip
        policy = None

    def key_of(record: ApprovalRecord) -> tuple[str | None, str | None]:
        action = record.request.action
        template = policy.effect_template(action.name) if policy is not None else None
        if template is None:
            return None, None
        try:
            key = render_effect_key(template, action.canonical_arguments, action.resource)
        except EffectKeyError:
            return None, None
        return key, effect_state(store, key)

    return key_of


def pending_document(record: ApprovalRecord, key: str | None, state: str | None) -> dict[str, Any]:
    """One pending request as JSON: who asks to do what, until when, and the effect it claims."""
    action = record.request.action
    return {
        "request_id": record.approval_id,
        "action_id": action.action_id,
        "action": action.name,
        "action_hash": record.action_hash,
        "arguments": action.canonical_arguments,
        "resource": action.resource,
        "environment": action.environment,
        "principal": {"agent": action.principal.agent, "user": action.principal.user},
        "created_at": format_ts(record.request.created_at),
        "expires_at": format_ts(record.expires_at),
        "effect_key": key,
        "effect_state": state,
    }
