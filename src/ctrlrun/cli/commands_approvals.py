"""``approve``, ``deny`` and ``pending``: a human answers approval requests and lists open ones."""

from __future__ import annotations

import json
from typing import Any

import click

from .._time import format_ts
from ..action import canonical_bytes
from ..approvals import ApprovalRecord, ApprovalStatus
from .._default import policy_path as settings_policy_path
from ..edits import edited_arguments, grant_with_edits, parse_assignments
from ..errors import ApprovalMismatch, CTRLRunError
from ..policy import Policy
from ..answers import answer_events
from .stores import Settings, open_operator_store, store_url_option
from .text import compact_json, say, say_raw

__all__ = ["approve", "deny", "pending"]

CLI_ANSWERER = "cli:local"


def _refusal(request_id: str, before: ApprovalRecord | None, exc: ApprovalMismatch) -> CTRLRunError:
    """The operator's wording for a grant or deny the store refused."""
    if exc.reason == "unknown":
        return CTRLRunError(f"no approval request {request_id} (`ctrlrun pending` lists open requests)")
    if exc.reason == "expired" and before is not None and before.status is ApprovalStatus.PENDING:
        return CTRLRunError(
            f"approval request {request_id} expired at {format_ts(before.expires_at)} before it "
            "was answered; it is now marked expired and nothing was granted (the agent must ask again)"
        )
    return CTRLRunError(f"approval request {request_id} is already {exc.reason}; a request is answered once")


@click.command()
@click.argument("request_id")
@click.option("--set", "assignments", multiple=True, metavar="NAME=VALUE",
              help="Approve with this argument changed (repeatable; VALUE is JSON or text). "
                   "The edited action is checked against the policy again.")  # fmt: skip
@click.option("--arguments", "arguments_json", metavar="JSON", default=None,
              help="Approve with these arguments instead (a JSON object); --set applies on top.")
@store_url_option
@click.pass_obj
def approve(settings: Settings, request_id: str, assignments: tuple[str, ...],
            arguments_json: str | None, store_url: str | None) -> None:  # fmt: skip
    """Grant a pending approval request (recorded as cli:local), as asked or with edits."""
    with open_operator_store(settings, store_url) as store:
        before = store.get_approval(request_id)
        if assignments or arguments_json is not None:
            _approve_with_edits(settings, store, request_id, before, assignments, arguments_json)
            return
        try:
            approval = store.grant_approval(request_id, CLI_ANSWERER, events=answer_events(CLI_ANSWERER))
        except ApprovalMismatch as exc:
            raise _refusal(request_id, before, exc) from None
        record = store.get_approval(request_id) or before
        if approval is None:  # a threshold of several approvers is not met yet
            required = record.request.approvals_required if record is not None else "?"
            count = len(record.approvers) if record is not None else "?"
            say(f"recorded {request_id}: {count} of {required} approvals")
            return
        say(f"granted {request_id} for {approval.action_hash}")
        say(f"expires {format_ts(approval.expires_at)}")


def _approve_with_edits(settings: Settings, store: Any, request_id: str,
                        before: ApprovalRecord | None, assignments: tuple[str, ...],
                        arguments_json: str | None) -> None:  # fmt: skip
    """Grant with edited arguments, re-checked by the policy the agents run under."""
    if before is None:
        raise _refusal(request_id, before, ApprovalMismatch(reason="unknown"))
    replace_all = None
    if arguments_json is not None:
        try:
            replace_all = json.loads(arguments_json)
        except ValueError as exc:
            raise click.BadParameter(f"not JSON ({exc})", param_hint="--arguments") from None
    arguments = edited_arguments(before, replace_all, parse_assignments(assignments))
    policy = Policy.from_file(settings_policy_path())
    try:
        approval, record = grant_with_edits(store, request_id, CLI_ANSWERER, arguments, policy=policy,
                                            events=answer_events(CLI_ANSWERER))  # fmt: skip
    except ApprovalMismatch as exc:
        raise _refusal(request_id, before, exc) from None
    say(f"granted {request_id} with edits for {approval.action_hash}")
    say(f"was {approval.edited_from}")
    for name, change in (approval.edit_diff or {}).items():
        old = compact_json(change["from"]) if "from" in change else "(absent)"
        new = compact_json(change["to"]) if "to" in change else "(absent)"
        say(f"changed {name}: {old} → {new}")
    say(f"expires {format_ts(approval.expires_at)}")


@click.command()
@click.argument("request_id")
@store_url_option
@click.pass_obj
def deny(settings: Settings, request_id: str, store_url: str | None) -> None:
    """Refuse a pending approval request (recorded as cli:local)."""
    with open_operator_store(settings, store_url) as store:
        before = store.get_approval(request_id)
        try:
            store.deny_approval(request_id, CLI_ANSWERER, events=answer_events(CLI_ANSWERER))
        except ApprovalMismatch as exc:
            raise _refusal(request_id, before, exc) from None
        say(f"denied {request_id}")


def _pending_document(record: ApprovalRecord) -> dict[str, Any]:
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
    }


def _pending_line(record: ApprovalRecord) -> str:
    action = record.request.action
    who = action.principal.agent
    if action.principal.user is not None:
        who += "/" + action.principal.user
    arguments = canonical_bytes(action.canonical_arguments).decode("utf-8")
    return (
        f"{record.approval_id}  {action.name}  {who}  {record.action_hash}  "
        f"expires {format_ts(record.expires_at)}  {arguments}"
    )


@click.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@store_url_option
@click.pass_obj
def pending(settings: Settings, as_json: bool, store_url: str | None) -> None:
    """List approval requests waiting for a human, oldest first."""
    with open_operator_store(settings, store_url) as store:
        records = store.pending_approvals()
    if not records:
        say("no pending requests")
        return
    for record in records:
        if as_json:
            say_raw(compact_json(_pending_document(record)))
        else:
            say(_pending_line(record))
