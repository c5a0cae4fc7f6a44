"""``ctrlrun mcp-operator``: an MCP server (stdio) on which a human answers approval requests and
settles ambiguous effects from their own assistant, each write confirmed by MCP elicitation.

It makes the store calls and writes the events of ``ctrlrun approve``, ``deny`` and ``resolve``
(it shares their code), and never proposes or executes an action.
"""

# No ``from __future__ import annotations``: the SDK reads the ``Resolve(...)`` markers from the
# tools' evaluated annotations, and those name closures over the store.

import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import AcceptedElicitation, Context, Elicit, ElicitationResult, MCPServer, Resolve
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, Field

from .._time import format_ts, utc_now
from ..action import Action, canonical_bytes
from ..approvals.records import ApprovalRecord, check_answerable
from .. import operator
from ..operator.text import compact_json, safe
from ..effects.records import EffectRecord, EffectState, check_resolve
from ..errors import CTRLRunError
from ..evidence.receipt import Receipt
from ..store import StateStore

__all__ = ["OPERATOR_ANSWERER", "Confirmation", "build_server", "serve"]

#: who the store records as the approver or resolver of an answer given here
OPERATOR_ANSWERER = "mcp-operator:local"

Outcome = Literal["committed", "failed"]

_MEANING = {
    "committed": "the effect happened: a retry of it is a duplicate",
    "failed": "the effect provably did not happen: a retry may run",
}


class Confirmation(BaseModel):
    """Your answer: true makes this change, false changes nothing."""

    confirm: bool = Field(title="Confirm", description="true makes this change; false changes nothing")


@dataclass(frozen=True, slots=True)
class _NotAsked:
    """Why the human was not asked: the tool answers with this refusal and writes nothing."""

    text: str


def _can_confirm(ctx: Context[Any, Any]) -> bool:
    """Whether the client declared form elicitation (a bare ``elicitation: {}`` means form)."""
    capabilities = ctx.client_capabilities
    elicitation = capabilities.elicitation if capabilities is not None else None
    return elicitation is not None and (elicitation.form is not None or elicitation.url is None)


def _ask(question: str | _NotAsked, ctx: Context[Any, Any], command: str) -> Elicit[Confirmation] | _NotAsked:
    """The elicitation to send, or why none is sent (``command`` is the CLI's equivalent)."""
    if isinstance(question, _NotAsked):
        return question
    if not _can_confirm(ctx):
        return _NotAsked(
            "refused: this MCP client cannot ask you to confirm (it declares no form elicitation), "
            f"so nothing changed; answer from a terminal instead: {command}"
        )
    return Elicit(question, Confirmation)


def _lines(lines: Sequence[str]) -> str:
    """Lines joined after escaping each, so stored text cannot add or hide a line."""
    return "\n".join(safe(line) for line in lines)


def _principal(action: Action) -> str:
    principal = action.principal
    return f"agent {principal.agent}" + (f", user {principal.user}" if principal.user is not None else "")


def approval_question(record: ApprovalRecord | None, request_id: str, *, grant: bool, now: datetime) -> str | _NotAsked:
    """The confirmation for answering ``request_id``, rendered from the stored request; the
    store's own refusal when it could not be answered now."""
    try:
        kept = check_answerable(record, request_id, now)
    except CTRLRunError as exc:
        return _NotAsked(f"{exc}; nothing changed")
    if kept is not None:
        return _NotAsked(f"{kept.error}; nothing changed")
    assert record is not None  # check_answerable refuses an unknown request
    action = record.request.action
    verb = "Approve" if grant else "Deny"
    lines = [
        f"{verb} approval request {request_id} (recorded as {OPERATOR_ANSWERER})?",
        f"action: {action.name}",
        "arguments: " + canonical_bytes(action.canonical_arguments).decode("utf-8"),
        f"principal: {_principal(action)}",
        f"resource: {action.resource if action.resource is not None else '-'}",
        f"environment: {action.environment}",
        f"hash: {record.action_hash}",
        f"expires: {format_ts(record.expires_at)}",
    ]
    required = record.request.approvals_required
    if required > 1:
        lines.append(f"approvals: {len(record.approvers)} of {required} recorded")
    lines.append(f"Answer true to {verb.lower()} it; false, decline or cancel changes nothing.")
    return _lines(lines)


def resolve_question(record: EffectRecord | None, effect_key: str, outcome: Outcome, *,
                     action: str | None, now: datetime) -> str | _NotAsked:  # fmt: skip
    """The confirmation for settling ``effect_key`` as ``outcome``, rendered from the stored
    record (``action``: its action's name, when a receipt names it); the store's own refusal
    when it is not ambiguous."""
    try:
        check_resolve(record, effect_key, outcome, OPERATOR_ANSWERER, now)
    except CTRLRunError as exc:
        return _NotAsked(f"{exc}; nothing changed")
    assert record is not None  # check_resolve refuses a missing record
    lines = [
        f"Resolve effect {effect_key} as {outcome} (recorded as {OPERATOR_ANSWERER})?",
        f"meaning: {_MEANING[outcome]}",
        f"action: {action or '(no receipt names it)'} ({record.action_id})",
        f"state: {record.state}, attempt {record.attempt}, since {format_ts(record.updated_at)}",
    ]
    if record.error:
        lines.append(f"error: {record.error}")
    lines.append(f"Answer true to record it {outcome}; false, decline or cancel changes nothing.")
    return _lines(lines)


def _result(lines: Sequence[str], structured: Mapping[str, Any], *, error: bool = False) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=_lines(lines))],
        structured_content=dict(structured),
        is_error=error,
    )


def _refused(text: str) -> CallToolResult:
    return _result([text], {"changed": False, "error": text}, error=True)


def _unconfirmed(outcome: ElicitationResult[Confirmation], unchanged: str) -> CallToolResult | None:
    """None when the human confirmed; else the result saying why nothing was written."""
    if isinstance(outcome, AcceptedElicitation):
        data: object = outcome.data
        if isinstance(data, _NotAsked):
            return _refused(data.text)
        if isinstance(data, Confirmation) and data.confirm is True:
            return None
        answer = "answered false"
    else:
        answer = "declined" if outcome.action == "decline" else "cancelled"
    return _result([f"nothing changed: the confirmation was {answer}; {unchanged}"],
                   {"changed": False, "confirmation": answer})  # fmt: skip


def _request_document(record: ApprovalRecord) -> dict[str, Any]:
    action = record.request.action
    return {
        "request_id": record.approval_id,
        "action": action.name,
        "arguments": action.canonical_arguments,
        "agent": action.principal.agent,
        "user": action.principal.user,
        "resource": action.resource,
        "environment": action.environment,
        "action_hash": record.action_hash,
        "expires_at": format_ts(record.expires_at),
    }


def _action_names(store: StateStore, wanted: set[str]) -> dict[str, str]:
    """The action name of each wanted action id, as its receipts record it."""
    names: dict[str, str] = {}
    for receipt in store.receipts():
        if isinstance(receipt, Receipt) and receipt.action_id in wanted:
            names[receipt.action_id] = receipt.action
    return names


def _effect_document(record: EffectRecord, action: str | None) -> dict[str, Any]:
    return {
        "effect_key": record.effect_key,
        "action": action,
        "action_id": record.action_id,
        "attempt": record.attempt,
        "updated_at": format_ts(record.updated_at),
        "error": record.error,
    }


def _guarded(read: Callable[[], CallToolResult]) -> CallToolResult:
    """A store refusal as an ``isError`` result quoting it, instead of the SDK's generic text."""
    try:
        return read()
    except CTRLRunError as exc:
        return _refused(str(exc))


def build_server(store: StateStore, *, clock: Callable[[], datetime] = utc_now) -> MCPServer:
    """The operator's MCP server over ``store`` (opened by the caller, who closes it)."""
    server = MCPServer(
        "ctrlrun-operator",
        instructions=(
            "Lists ctrlrun approval requests and ambiguous effects, and answers them after the "
            "human confirms each answer in this client's own prompt."
        ),
        log_level="WARNING",
    )
    reading = ToolAnnotations(read_only_hint=True, open_world_hint=False)
    writing = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=False,
                              open_world_hint=False)  # fmt: skip

    def pending_approvals(limit: Annotated[int, Field(ge=1, le=200)] = 50) -> CallToolResult:
        """The approval requests waiting for a human, oldest first."""

        def read() -> CallToolResult:
            records = store.pending_approvals(limit + 1)
            shown = [_request_document(record) for record in records[:limit]]
            more = len(records) > limit
            head = f"{len(shown)} pending approval request(s), oldest first"
            if more:
                head += f"; more are waiting (limit {limit})"
            return _result([head, *(compact_json(d) for d in shown)], {"requests": shown, "more": more})

        return _guarded(read)

    def ambiguous_effects() -> CallToolResult:
        """The effects whose outcome is unknown (AMBIGUOUS), waiting for a human to settle them."""

        def read() -> CallToolResult:
            records = tuple(store.iter_effects(EffectState.AMBIGUOUS))
            names = _action_names(store, {r.action_id for r in records}) if records else {}
            shown = [_effect_document(r, names.get(r.action_id)) for r in records]
            head = f"{len(shown)} ambiguous effect(s)"
            return _result([head, *(compact_json(d) for d in shown)], {"effects": shown})

        return _guarded(read)

    def answerer(grant: bool) -> Callable[..., Any]:
        verb = "approve" if grant else "deny"

        def ask(request_id: str, ctx: Context[Any, Any]) -> Elicit[Confirmation] | _NotAsked:
            try:  # refused as every front-end refuses it, before the human is asked anything
                record = operator.check_answerable(store, request_id, OPERATOR_ANSWERER, now=clock())
            except CTRLRunError as exc:
                return _NotAsked(f"{exc}; nothing changed")
            question = approval_question(record, request_id, grant=grant, now=clock())
            return _ask(question, ctx, f"ctrlrun {verb} {shlex.quote(request_id)}")

        def answer(request_id: str,
                   confirmation: Annotated[ElicitationResult[Confirmation], Resolve(ask)]) -> CallToolResult:  # fmt: skip
            refused = _unconfirmed(confirmation, f"request {request_id} was not answered")
            if refused is not None:
                return refused
            try:
                given = operator.grant if grant else operator.deny
                answer = given(store, request_id, OPERATOR_ANSWERER)
            except CTRLRunError as exc:
                return _refused(str(exc))
            if not grant:
                return _result([f"denied {request_id}"], {"changed": True, "request_id": request_id,
                                                          "status": "denied"})  # fmt: skip
            approval, record = answer.approval, answer.record
            if approval is None:  # an approver threshold not met yet
                count, required = len(record.approvers), record.request.approvals_required
                return _result([f"recorded {request_id}: {count} of {required} approvals; not granted yet"],
                               {"changed": True, "request_id": request_id, "status": "pending"})  # fmt: skip
            expires = format_ts(approval.expires_at)
            return _result([f"granted {request_id} for {approval.action_hash}, expires {expires}"],
                           {"changed": True, "request_id": request_id, "status": "granted",
                            "action_hash": approval.action_hash, "expires_at": expires})  # fmt: skip

        answer.__name__ = verb
        return answer

    def ask_resolve(effect_key: str, outcome: Outcome, ctx: Context[Any, Any]) -> Elicit[Confirmation] | _NotAsked:
        try:
            record = store.get_effect(effect_key)
            names = _action_names(store, {record.action_id}) if record is not None else {}
        except CTRLRunError as exc:
            return _NotAsked(f"{exc}; nothing changed")
        action = names.get(record.action_id) if record is not None else None
        question = resolve_question(record, effect_key, outcome, action=action, now=clock())
        return _ask(question, ctx, f"ctrlrun resolve {shlex.quote(effect_key)} --{outcome}")

    def resolve(effect_key: str, outcome: Outcome,
                confirmation: Annotated[ElicitationResult[Confirmation], Resolve(ask_resolve)]) -> CallToolResult:  # fmt: skip
        """Settle an ambiguous effect as committed (it happened) or failed (it provably did not),
        after the human confirms."""
        refused = _unconfirmed(confirmation, f"effect {effect_key} is still ambiguous")
        if refused is not None:
            return refused
        try:
            operator.resolve(store, effect_key, EffectState(outcome), OPERATOR_ANSWERER)
        except CTRLRunError as exc:
            return _refused(str(exc))
        lines = [f"{effect_key} resolved {outcome} by {OPERATOR_ANSWERER}"]
        if outcome == "failed":
            lines.append("a retry of this effect is now permitted")
        return _result(lines, {"changed": True, "effect_key": effect_key, "state": outcome})

    server.add_tool(pending_approvals, annotations=reading)
    server.add_tool(ambiguous_effects, annotations=reading)
    server.add_tool(answerer(True), name="approve", annotations=writing,
                    description="Grant a pending approval request, after the human confirms.")  # fmt: skip
    server.add_tool(answerer(False), name="deny", annotations=writing,
                    description="Refuse a pending approval request, after the human confirms.")  # fmt: skip
    server.add_tool(resolve, annotations=writing)
    return server


def serve(store: StateStore, *, clock: Callable[[], datetime] = utc_now) -> None:
    """Serve the operator's tools on stdin/stdout until the host closes stdin."""
    build_server(store, clock=clock).run("stdio")
