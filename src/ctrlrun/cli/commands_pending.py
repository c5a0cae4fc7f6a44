"""``pending``: the approval requests waiting for a human, with the effect each would claim."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from .._locations import policy_path
from .._time import format_ts
from ..action import canonical_bytes
from ..approvals import ApprovalRecord
from ..effect import EffectState
from ..errors import CTRLRunError, EffectKeyError
from ..policy import Policy, render_effect_key
from ..store import StateStore
from .options import check_paging, json_lines_option, paging_options
from .stores import Settings, open_operator_store, store_url_option
from .text import compact_json, reader_gone, say, say_prose, say_raw

__all__ = ["pending"]

#: (effect key or None, its state or None) for one request.
KeyOf = Callable[[ApprovalRecord], tuple[str | None, str | None]]


def _effect_keys(store: StateStore) -> KeyOf:
    """How to find a request's effect key: rendered from the policy's template for its action."""
    path = policy_path()
    try:
        policy: Policy | None = Policy.from_file(path)
    except CTRLRunError as exc:
        say(f"note: effect keys are not shown: cannot load the policy {path} ({exc}); set "
            "CTRLRUN_CONFIG to the policy the agents run under", err=True)  # fmt: skip
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
        effect = store.get_effect(key)
        return key, (EffectState.NEW.value if effect is None else effect.state.value)

    return key_of


def _pending_document(record: ApprovalRecord, key: str | None, state: str | None) -> dict[str, Any]:
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


def _pending_line(record: ApprovalRecord, key: str | None, state: str | None) -> str:
    action = record.request.action
    who = action.principal.agent
    if action.principal.user is not None:
        who += "/" + action.principal.user
    arguments = canonical_bytes(action.canonical_arguments).decode("utf-8")
    return (
        f"{record.approval_id}  {action.name}  {who}  {record.action_hash}  "
        f"expires {format_ts(record.expires_at)}  {key or '-'}  {state or '-'}  {arguments}"
    )


@click.command()
@json_lines_option("each pending request")
@paging_options("every pending request is printed")
@store_url_option
@click.pass_obj
def pending(settings: Settings, as_json: bool, limit: int | None, every: bool, store_url: str | None) -> None:
    """List approval requests waiting for a human, oldest first, with each one's effect state."""
    check_paging(limit, every)
    with open_operator_store(settings, store_url, read_only=True) as store:
        records = store.pending_approvals(limit=limit)
        if not records:
            say_prose("no pending requests", as_json=as_json)
            return
        key_of = _effect_keys(store)
        rows = [(record, *key_of(record)) for record in records]
    for record, key, state in rows:
        if reader_gone():
            return
        if as_json:
            say_raw(compact_json(_pending_document(record, key, state)))
        else:
            say(_pending_line(record, key, state))
