"""``pending``: the approval requests waiting for a human, with the effect each would claim."""

from __future__ import annotations

import click

from .._time import format_ts
from ..action import canonical_bytes
from ..approvals.records import ApprovalRecord
from ..operator.pending import pending_document, policy_keys
from .options import check_paging, json_lines_option, paging_options
from .stores import Settings, open_operator_store, store_url_option
from .text import compact_json, reader_gone, say, say_prose, say_raw

__all__ = ["pending"]

def _note(line: str) -> None:
    say(line, err=True)


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
        key_of = policy_keys(store, settings.policy_path(), _note)
        rows = [(record, *key_of(record)) for record in records]
    for record, key, state in rows:
        if reader_gone():
            return
        if as_json:
            say_raw(compact_json(pending_document(record, key, state)))
        else:
            say(_pending_line(record, key, state))
