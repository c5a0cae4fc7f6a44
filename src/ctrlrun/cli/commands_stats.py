"""``ctrlrun stats``: what the receipts of a window say the policy did, or would have done
(counted by ``ctrlrun.operator.stats``), as a table or one JSON object."""

from __future__ import annotations

from typing import Any

import click

from ..settings import policy_path
from ..errors import InvalidArgument
from ..policy import Policy
from ..evidence.receipt import Receipt
from ..operator.stats import parse_since, tally
from .stores import Settings, open_operator_store, store_url_option
from .text import compact_json, say, say_raw

__all__ = ["observe_banner", "stats"]

BANNER = "OBSERVE MODE — nothing is enforced"
def observe_banner(policy: Policy) -> None:
    """Say on stderr, first, that nothing is enforced when the policy observes."""
    if policy.mode == "observe":
        say(BANNER, err=True)


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
    try:
        start = parse_since(since, settings.clock()) if since is not None else None
    except InvalidArgument as exc:
        raise click.BadParameter(str(exc), param_hint="'--since'") from None
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
