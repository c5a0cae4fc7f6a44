"""``ctrlrun stats``: what the receipts of a window say the policy did, or would have done.

In observe mode each observed receipt counts by the first refusal enforce mode would have raised
(``would_have.blocked_reason``); in enforce mode the denied receipts count by reason.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

import click

from .._locations import policy_path
from .._time import format_ts, parse_ts
from ..errors import InvalidArgument
from ..policy import Policy
from ..receipt import Receipt
from .stores import Settings, open_operator_store, store_url_option
from .text import compact_json, say, say_raw

__all__ = ["observe_banner", "parse_since", "stats", "tally"]

BANNER = "OBSERVE MODE — nothing is enforced"
_RELATIVE = re.compile(r"([1-9][0-9]*)([mhd])")
_UNITS = {"m": "minutes", "h": "hours", "d": "days"}
#: blocked reasons that enforce mode would have recorded as a ``denied`` receipt
_DENIED_PREFIXES = ("rule[", "authority_", "budget_")
_DENIED = frozenset({"principal_expired", "no_authority", "decision", "unknown_action",
                     "no_matching_rule", "approval_denied"})  # fmt: skip


def observe_banner(policy: Policy) -> None:
    """Say on stderr, first, that nothing is enforced when the policy observes."""
    if policy.mode == "observe":
        say(BANNER, err=True)


def parse_since(value: str, now: datetime) -> datetime:
    """``--since``: an ISO 8601 time with an offset, or ``<n>m``, ``<n>h``, ``<n>d`` before now."""
    relative = _RELATIVE.fullmatch(value.strip())
    if relative:
        return now - timedelta(**{_UNITS[relative.group(2)]: int(relative.group(1))})
    try:
        moment = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        moment = None
    if moment is None or moment.utcoffset() is None:
        raise click.BadParameter(
            f"{value!r} is not a time: give an ISO 8601 time with an offset "
            "(2026-12-01T00:00:00Z) or a span before now (30m, 12h, 7d)",
            param_hint="'--since'",
        )
    return moment


def _denied_reason(reason: str) -> bool:
    return reason in _DENIED or reason.startswith(_DENIED_PREFIXES)


def tally(receipts: Iterable[Receipt], *, mode: str, since: datetime | None, ledger_rows: int) -> dict[str, Any]:
    """The stats document (``ctrlrun.stats/v1``) for the receipts finished at or after ``since``."""
    chosen = [r for r in receipts if since is None or parse_ts(r.finished_at) >= since]
    denied: dict[str, int] = {}
    blocked: dict[str, int] = {}
    approval = ambiguous = 0
    for receipt in chosen:
        if receipt.result == "observed":
            reason = (receipt.would_have or {}).get("blocked_reason")
            ambiguous += receipt.execution == "ambiguous"
            if reason is None:
                continue
            if reason == "approval_required":
                approval += 1
            elif _denied_reason(reason):
                denied[reason] = denied.get(reason, 0) + 1
            else:
                blocked[reason] = blocked.get(reason, 0) + 1
        elif receipt.result == "denied":
            denied[receipt.decision_reason] = denied.get(receipt.decision_reason, 0) + 1
        elif receipt.result == "blocked":
            blocked["blocked"] = blocked.get("blocked", 0) + 1
        elif receipt.result == "ambiguous":
            ambiguous += 1
    finished = sorted(r.finished_at for r in chosen)
    return {
        "schema": "ctrlrun.stats/v1",
        "mode": mode,
        "since": None if since is None else format_ts(since),
        "from": finished[0] if finished else None,
        "to": finished[-1] if finished else None,
        "actions": len(chosen),
        "ledger_rows": ledger_rows,
        "would_have_been_denied": sum(denied.values()),
        "denied_by_reason": dict(sorted(denied.items())),
        "would_have_needed_approval": approval,
        "would_have_been_blocked": sum(blocked.values()),
        "blocked_by_reason": dict(sorted(blocked.items())) if mode == "observe" else {},
        "ambiguous_outcomes": ambiguous,
    }


def _line(label: str, count: int, indent: str = "") -> str:
    return f"{indent}{label}".ljust(35) + str(count)


def _say_table(document: dict[str, Any]) -> None:
    observing = document["mode"] == "observe"
    span = f"{document['from']} .. {document['to']}" if document["from"] else "no receipts in the window"
    say(f"CTRLRun — {span}   ({document['mode']} mode)")
    say()
    say(_line("actions", document["actions"]))
    say(_line("would have been denied" if observing else "denied", document["would_have_been_denied"]))
    for reason, count in document["denied_by_reason"].items():
        say(_line(reason, count, "   "))
    if observing:
        say(_line("would have needed approval", document["would_have_needed_approval"]))
    say(_line("would have been blocked" if observing else "blocked", document["would_have_been_blocked"]))
    for reason, count in document["blocked_by_reason"].items():
        say(_line(reason, count, "   "))
    say(_line("ambiguous outcomes", document["ambiguous_outcomes"]))
    say(_line("budget ledger rows", document["ledger_rows"]))
    say()
    say("actions awaiting a human have no receipt yet and are not counted (ctrlrun pending lists them)")
    if not observing:
        say("blocked receipts are not broken down by reason in enforce mode; ctrlrun receipts shows each")


@click.command()
@click.option("--since", "since", metavar="TIME", help="Only receipts finished at or after TIME (ISO 8601, or 30m, 12h, 7d ago).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object (schema ctrlrun.stats/v1).")
@store_url_option
@click.pass_obj
def stats(settings: Settings, since: str | None, as_json: bool, store_url: str | None) -> None:
    """Count what the policy did (enforce) or would have done (observe) in the local store's receipts."""
    policy = Policy.from_file(policy_path())
    observe_banner(policy)
    start = parse_since(since, settings.clock()) if since is not None else None
    with open_operator_store(settings, store_url, read_only=True) as store:
        receipts = [r for r in store.receipts() if isinstance(r, Receipt)]
        try:
            ledger_rows = len(store.consumptions())
        except InvalidArgument:
            ledger_rows = 0
    document = tally(receipts, mode=policy.mode, since=start, ledger_rows=ledger_rows)
    if as_json:
        say_raw(compact_json(document))
    else:
        _say_table(document)
