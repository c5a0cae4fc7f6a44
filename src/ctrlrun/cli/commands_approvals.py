"""``approve`` and ``deny``: a human answers an approval request, as asked or with edits."""

from __future__ import annotations

import json
from typing import Any

import click

from .. import operator
from .._time import format_ts
from ..approvals.records import Approval, ApprovalRecord
from ..approvals.edits import edited_arguments, parse_assignments
from ..errors import InvalidArgument
from ..policy import Policy
from ..store import StateStore
from .stores import Settings, open_operator_store, store_url_option
from .text import compact_json, say

__all__ = ["CLI_ANSWERER", "answer_request", "approve", "deny"]

CLI_ANSWERER = "cli:local"


def answer_request(store: StateStore, request_id: str, answerer: str, *,
                   grant: bool) -> tuple[Approval | None, ApprovalRecord | None]:  # fmt: skip
    """Grant (or deny) ``request_id`` as ``answerer``; the operator library's answer, as the CLI
    and ``ctrlrun mcp-operator`` report it (the grant, and the record after it)."""
    answer = operator.grant(store, request_id, answerer) if grant else operator.deny(store, request_id, answerer)
    return answer.approval, answer.record


def _assignments(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> dict[str, Any]:
    """``--set NAME=VALUE`` options, parsed; a malformed one is a usage error."""
    try:
        return parse_assignments(value)
    except InvalidArgument as exc:
        raise click.BadParameter(str(exc)) from None


def _replacement(ctx: click.Context, param: click.Parameter, value: str | None) -> dict[str, Any] | None:
    """``--arguments JSON``, parsed; anything but a JSON object is a usage error."""
    if value is None:
        return None
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON ({exc})") from None
    if not isinstance(parsed, dict):
        raise click.BadParameter(
            f"give a JSON object of argument names to values, not a JSON {type(parsed).__name__}, "
            "e.g. --arguments '{\"amount\": 40000}'"
        )
    return parsed


@click.command()
@click.argument("request_id")
@click.option("--set", "assignments", multiple=True, metavar="NAME=VALUE", callback=_assignments,
              help="Approve with this argument changed (repeatable; VALUE is JSON or text). "
                   "The edited action is checked against the policy again.")  # fmt: skip
@click.option("--arguments", "replace_all", metavar="JSON", default=None, callback=_replacement,
              help="Approve with these arguments instead (a JSON object); --set applies on top.")
@click.option("--allow-new-arguments", "allow_new", is_flag=True,
              help="Let --set and --arguments add names the request's arguments do not have.")
@store_url_option
@click.pass_obj
def approve(settings: Settings, request_id: str, assignments: dict[str, Any],
            replace_all: dict[str, Any] | None, allow_new: bool,
            store_url: str | None) -> None:  # fmt: skip
    """Grant a pending approval request (recorded as cli:local), as asked or with edits."""
    with open_operator_store(settings, store_url) as store:
        if assignments or replace_all is not None:
            before = store.get_approval(request_id)
            _approve_with_edits(settings, store, request_id, before, assignments, replace_all, allow_new)
            return
        approval, record = answer_request(store, request_id, CLI_ANSWERER, grant=True)
        if approval is None:  # a threshold of several approvers is not met yet
            required = record.request.approvals_required if record is not None else "?"
            count = len(record.approvers) if record is not None else "?"
            say(f"recorded {request_id}: {count} of {required} approvals")
            return
        say(f"granted {request_id} for {approval.action_hash}")
        say(f"expires {format_ts(approval.expires_at)}")


def _approve_with_edits(settings: Settings, store: Any, request_id: str,
                        before: ApprovalRecord | None, assignments: dict[str, Any],
                        replace_all: dict[str, Any] | None, allow_new: bool) -> None:  # fmt: skip
    """Grant with edited arguments, re-checked by the policy the agents run under."""
    if before is None:
        operator.grant(store, request_id, CLI_ANSWERER)  # refused: no such request
        return
    arguments = edited_arguments(before, replace_all, assignments)
    try:
        answer = operator.edit(store, request_id, CLI_ANSWERER, arguments, allow_new=allow_new,
                               policy=lambda: Policy.from_file(settings.policy_path()))  # fmt: skip
    except operator.AnswerRefused as exc:
        if exc.code != "unknown_argument":
            raise
        raise InvalidArgument(f"{exc}. Fix the name, or pass --allow-new-arguments to add it; nothing was granted") from None
    approval = answer.approval
    assert approval is not None
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
        answer_request(store, request_id, CLI_ANSWERER, grant=False)
        say(f"denied {request_id}")
