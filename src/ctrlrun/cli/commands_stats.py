"""``ctrlrun stats``: what the receipts of a window say the policy did, or would have done.

Each observed receipt counts by the first refusal enforce mode would have raised
(``would_have.blocked_reason``); each enforced one by what it was (denied by reason, blocked,
ambiguous). The two are counted apart: a store keeps both kinds after a switch of mode.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

import click

from ..settings import policy_path
from .._time import format_ts, parse_ts
from ..errors import InvalidArgument
from ..policy import Policy
from ..evidence.receipt import Receipt
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
    """The stats document (``ctrlrun.stats/v1``) for the receipts finished at or after ``since``.

    Observed receipts and enforced ones are counted apart whatever the policy's mode is now (a
    store keeps both after a switch): the ``would_have_*`` keys and their ``*_by_reason`` count
    observed receipts only; ``enforced`` counts what was really denied and blocked;
    ``ambiguous_outcomes`` counts both."""
    denied: dict[str, int] = {}
    blocked: dict[str, int] = {}
    enforced_denied: dict[str, int] = {}
    approval = ambiguous = enforced_ambiguous = enforced_blocked = observed = actions = 0
    first = last = None
    for receipt in receipts:
        if since is not None and parse_ts(receipt.finished_at) < since:
            continue
        actions += 1
        first = receipt.finished_at if first is None or receipt.finished_at < first else first
        last = receipt.finished_at if last is None or receipt.finished_at > last else last
        if receipt.result == "observed":
            observed += 1
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
            enforced_denied[receipt.decision_reason] = enforced_denied.get(receipt.decision_reason, 0) + 1
        elif receipt.result == "blocked":
            enforced_blocked += 1
        elif receipt.result == "ambiguous":
            enforced_ambiguous += 1
    return {
        "schema": "ctrlrun.stats/v1",
        "mode": mode,
        "since": None if since is None else format_ts(since),
        "from": first,
        "to": last,
        "actions": actions,
        "ledger_rows": ledger_rows,
        "would_have_been_denied": sum(denied.values()),
        "denied_by_reason": dict(sorted(denied.items())),
        "would_have_needed_approval": approval,
        "would_have_been_blocked": sum(blocked.values()),
        "blocked_by_reason": dict(sorted(blocked.items())),
        "ambiguous_outcomes": ambiguous + enforced_ambiguous,
        "observed": {"actions": observed, "ambiguous_outcomes": ambiguous},
        "enforced": {
            "actions": actions - observed,
            "denied": sum(enforced_denied.values()),
            "denied_by_reason": dict(sorted(enforced_denied.items())),
            "blocked": enforced_blocked,
            "ambiguous_outcomes": enforced_ambiguous,
        },
    }


def _line(label: str, count: int, indent: str = "") -> str:
    return f"{indent}{label}".ljust(35) + str(count)


def _say_reasons(counts: dict[str, int]) -> None:
    for reason, count in counts.items():
        say(_line(reason, count, "   "))


def _say_observed(document: dict[str, Any]) -> None:
    say(_line("would have been denied", document["would_have_been_denied"]))
    _say_reasons(document["denied_by_reason"])
    say(_line("would have needed approval", document["would_have_needed_approval"]))
    say(_line("would have been blocked", document["would_have_been_blocked"]))
    _say_reasons(document["blocked_by_reason"])


def _say_enforced(document: dict[str, Any]) -> None:
    enforced = document["enforced"]
    say(_line("denied", enforced["denied"]))
    _say_reasons(enforced["denied_by_reason"])
    say(_line("blocked", enforced["blocked"]))


def _say_table(document: dict[str, Any]) -> None:
    """The current mode's counts first; the other kind's receipts (written before a switch of
    mode) in a section of their own, never added to them."""
    observing = document["mode"] == "observe"
    observed, enforced = document["observed"]["actions"], document["enforced"]["actions"]
    mixed = observed > 0 and enforced > 0
    span = f"{document['from']} .. {document['to']}" if document["from"] else "no receipts in the window"
    say(f"CTRLRun — {span}   ({document['mode']} mode)")
    say()
    say(_line("actions", document["actions"]))
    if mixed:
        say(_line("enforced", enforced, "   "))
        say(_line("observed", observed, "   "))
    (_say_observed if observing else _say_enforced)(document)
    say(_line("ambiguous outcomes", document["ambiguous_outcomes"]))
    say(_line("budget ledger rows", document["ledger_rows"]))
    other_count = enforced if observing else observed
    if other_count:
        say()
        if observing:
            say(f"enforced before the switch to observe ({other_count} actions):")
            _say_enforced(document)
        else:
            say(f"observed before the switch to enforce ({other_count} actions; nothing was enforced on them):")
            _say_observed(document)
    say()
    say("actions awaiting a human have no receipt yet and are not counted (ctrlrun pending lists them)")
    if not observing or enforced:
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
        receipts = (r for r in store.iter_receipts() if isinstance(r, Receipt))
        try:
            ledger_rows = len(store.consumptions())
        except InvalidArgument:
            ledger_rows = 0
        document = tally(receipts, mode=policy.mode, since=start, ledger_rows=ledger_rows)
    if as_json:
        say_raw(compact_json(document))
    else:
        _say_table(document)
