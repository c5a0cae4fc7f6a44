"""``delegate``, ``revoke`` and ``inspect --grant``: hand part of a grant on, take it back, and
read what a grant's budgets have spent and who holds the rest."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import click

from ..store import open_default_store
from ..settings import policy_path
from .._time import format_ts
from ..action import Principal
from ..control.front import Control
from ..effects.records import EffectState
from ..errors import AuthorityEscalation, CTRLRunError, InvalidArgument
from ..policy import Policy
from ..evidence.receipt import JSONLEventSink
from ..store import open_store_url
from .commands_stats import observe_banner
from .options import json_lines_option
from .stores import Settings, hint_store_option, open_operator_store, select_store_url, store_url_option
from .text import compact_json, say, say_raw

__all__ = ["delegate", "inspect", "revoke", "window_text"]

CLI_REVOKER = "cli:local"


def _principal(value: str, option: str) -> Principal:
    agent, _, user = value.partition("/")
    if not agent.strip():
        raise click.UsageError(f"{option} needs AGENT[/USER] with a non-empty agent, got {value!r}")
    return Principal(agent, user or None)


@contextmanager
def _control(settings: Settings, store_url: str | None) -> Iterator[Control]:
    """The Control an agent would build from the policy file (its store created and migrated if
    absent, its JSONL copy of the evidence); ``--store-url`` replaces the store."""
    policy_file = policy_path()
    policy = Policy.from_file(policy_file)
    observe_banner(policy)
    if store_url is None:
        store, evidence = open_default_store(policy_file)
    else:
        url = select_store_url(store_url)
        store = open_store_url(url, clock=settings.clock)
        evidence = Path(url[len("sqlite://") :]).expanduser().absolute().parent if url.startswith("sqlite://") else None
    try:
        sinks = (JSONLEventSink(evidence),) if evidence is not None else ()
        yield Control(policy, store, sinks=sinks, clock=settings.clock)
    finally:
        store.close()


@click.command()
@click.option("--parent", "parent_id", required=True, metavar="ID", help="The grant (root id or dlg_ id) to delegate from.")
@click.option("--file", "grant_file", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The child grant: one grant in YAML, without id.")  # fmt: skip
@click.option("--as", "as_", required=True, metavar="AGENT[/USER]", help="Who delegates (asserted, recorded).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object for the new delegation.")
@store_url_option
@click.pass_obj
def delegate(settings: Settings, parent_id: str, grant_file: Path, as_: str, as_json: bool,
             store_url: str | None) -> None:  # fmt: skip
    """Record a delegation of part of PARENT's grant; it can never be wider than its parent."""
    from ..authority.resolve import grant_from_yaml

    by = _principal(as_, "--as")
    try:
        text = grant_file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"cannot read the grant file {grant_file}: {exc}; give a readable YAML file") from None
    grant = grant_from_yaml(text)
    with _control(settings, store_url) as control:
        try:
            made = control.delegate(parent_id, grant, by=by, created_via="cli")
        except AuthorityEscalation as exc:  # "<reason>: <message>", the reason said once
            message = str(exc).replace(f"refused: {exc.reason}: ", "refused: ")
            raise CTRLRunError(f"{exc.reason}: {message}") from None
    if as_json:
        say_raw(compact_json({
            "delegation_id": made.delegation_id, "parent_id": made.parent_id, "depth": made.depth,
            "created_by_agent": made.created_by.agent, "created_by_user": made.created_by.user,
            "created_via": made.created_via, "created_at": format_ts(made.created_at),
        }))  # fmt: skip
        return
    say(f"created {made.delegation_id}")
    say(f"parent {made.parent_id} at depth {made.depth}")
    say(f"revoke it with: ctrlrun revoke {made.delegation_id}{hint_store_option(store_url)}")


def _beneath(store: Any, root: str) -> list[Any]:
    """The delegations strictly beneath ``root``, at any depth, in creation order."""
    found: dict[str, Any] = {}
    frontier = [root]
    while frontier:
        children = [c for parent in frontier for c in store.delegations_for(parent)]
        frontier = [c.delegation_id for c in children if c.delegation_id not in found]
        found.update((c.delegation_id, c) for c in children)
    return sorted(found.values(), key=lambda r: (r.created_at, r.delegation_id))


@click.command()
@click.argument("delegation_id", required=False)
@click.option("--created-by", "created_by", metavar="AGENT[/USER]", help="Every delegation this principal made.")
@click.option("--under", "under", metavar="ID", help="Every delegation beneath this grant, at any depth.")
@click.option("--by", "by", default=CLI_REVOKER, show_default=True, help="Who revokes (recorded).")
@store_url_option
@click.pass_obj
def revoke(settings: Settings, delegation_id: str | None, created_by: str | None, under: str | None,
           by: str, store_url: str | None) -> None:  # fmt: skip
    """Revoke a delegation (or every one a selector matches): all beneath it is denied from the
    next evaluation."""
    chosen = [v for v in (delegation_id, created_by, under) if v is not None]
    if len(chosen) != 1:
        raise click.UsageError("give exactly one of DELEGATION_ID, --created-by or --under")
    if not by.strip():
        raise click.UsageError("--by needs a non-empty name")
    with _control(settings, store_url) as control:
        store = control.store
        if delegation_id is not None:
            record = store.get_delegation(delegation_id)
            if record is None:
                raise CTRLRunError(f"no delegation {delegation_id} in this store; nothing revoked")
            if control.revoke(delegation_id, by=by):
                say(f"revoked {delegation_id} by {by}")
                say("every delegation beneath it is denied from the next evaluation")
                say(_remaining(store, record, settings.clock()))
            else:
                again = store.get_delegation(delegation_id)
                at = again.revoked_at if again is not None else record.revoked_at
                say(f"{delegation_id} was already revoked at {format_ts(at) if at else '?'}")
            return
        records = store.delegations(include_revoked=True)
        if created_by is not None:
            who = _principal(created_by, "--created-by")
            matched = [
                r for r in records
                if r.created_by_agent == who.agent and (who.user is None or r.created_by_user == who.user)
            ]  # fmt: skip
            selector, value = "--created-by", created_by
        else:
            assert under is not None
            matched, selector, value = _beneath(store, under), "--under", under
        if not matched:
            raise CTRLRunError(f"no delegation matches {selector} {value}; nothing revoked")
        revoked = 0
        for record in matched:  # one at a time: a killed run can be run again
            if control.revoke(record.delegation_id, by=by):
                revoked += 1
                say(f"revoked {record.delegation_id} by {by}")
        already = len(matched) - revoked
        say(f"revoked {revoked} of {len(matched)} matching {selector} {value}; {already} already revoked")
        say("every delegation beneath them is denied from the next evaluation")


def _remaining(store: Any, revoked: Any, now: Any) -> str:
    """How many live delegations still hand a grant to the revoked one's subject, named."""
    from ..authority.resolve import read_delegation

    subject = read_delegation(revoked).grant
    who = "/".join(p for p in (subject.agent, subject.user) if p) or "?"
    every = {r.delegation_id: r for r in store.delegations(include_revoked=True)}

    def alive(record: Any) -> bool:  # neither it nor a delegation above it revoked
        while record is not None:
            if record.revoked_at is not None:
                return False
            record = every.get(record.parent_id)
        return True

    live = []
    for record in every.values():
        grant = read_delegation(record).grant
        if (grant.agent, grant.user) == (subject.agent, subject.user) and alive(record) and (
            grant.expires_at is None or grant.expires_at > now
        ):
            live.append(record.delegation_id)
    if not live:
        return f"no live delegation to {who} remains (grants in the policy file are not counted)"
    named = ", ".join(live[:5]) + (", …" if len(live) > 5 else "")
    return (f"{len(live)} live delegation{'s' if len(live) != 1 else ''} to {who} remain{'s' if len(live) == 1 else ''}: "
            f"{named} (revoke each to take {who}'s delegated authority away)")  # fmt: skip


def window_text(seconds: int) -> str:
    """A window as people say it: the largest of day, hour, minute that divides it, else seconds."""
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds % size == 0:
            count = seconds // size
            return unit if count == 1 else f"{count} {unit}s"
    return f"{seconds}s"


def _budgets_of(control: Control, grant_id: str) -> Any:
    """The budgets of a root grant (from the policy) or of a delegation (from the store)."""
    from ..authority.resolve import read_delegation

    authority = control.authority
    if authority is None:
        raise InvalidArgument(f"the policy {control.policy.source} has no authority: section; no grant {grant_id}")
    root = authority.root(grant_id)
    if root is not None:
        return root.budgets or ()
    record = control.store.get_delegation(grant_id)
    if record is None:
        raise CTRLRunError(f"no grant {grant_id}: not in the policy's authority section nor a stored delegation")
    return read_delegation(record).grant.budgets or ()


@click.command()
@click.argument("ident", metavar="[ID]", required=False)
@click.option("--grant", "grant_id", metavar="ID", help="The grant (root id or dlg_ id).")
@json_lines_option("each part of the story (the action, the request, the effect, each receipt)")
@store_url_option
@click.pass_obj
def inspect(settings: Settings, ident: str | None, grant_id: str | None, as_json: bool,
            store_url: str | None) -> None:  # fmt: skip
    """One action's story by ID (an act_, apr_ or ctr_ id, or an effect key), or with --grant
    what a grant's budgets have consumed and which effects hold it."""
    if (ident is None) == (grant_id is None):
        raise click.UsageError("give exactly one of ID or --grant ID")
    if ident is not None:
        from .inspecting import inspect_story, print_story

        with open_operator_store(settings, store_url, read_only=True) as store:
            documents = inspect_story(store, ident)
        print_story(documents, as_json)
        return
    _inspect_grant(settings, grant_id, as_json, store_url)


def _inspect_grant(settings: Settings, grant_id: Any, as_json: bool, store_url: str | None) -> None:
    """``inspect --grant``: the budgets' consumption in their windows and who holds it."""
    policy = Policy.from_file(policy_path())
    observe_banner(policy)
    now = settings.clock()
    hint = hint_store_option(store_url)
    with open_operator_store(settings, store_url, read_only=True) as store:
        control = Control(policy, store, clock=settings.clock)
        budgets = _budgets_of(control, grant_id)
        lines: list[dict[str, Any]] = []
        for budget in budgets:
            rows = [
                r for r in store.consumptions(grant_id=grant_id, metric=budget.metric,
                                              since=now - timedelta(seconds=budget.window))
                if r.released_at is None
            ]  # fmt: skip
            holders = []
            for row in rows:
                record = store.get_effect(row.effect_key)
                state = record.state if record is not None else EffectState.NEW
                if state is not EffectState.COMMITTED:
                    holders.append({"effect_key": row.effect_key, "amount": row.amount, "state": str(state)})
            lines.append({
                "metric": budget.metric, "limit": budget.limit, "window": budget.window,
                "consumed": sum(r.amount for r in rows), "held": sum(h["amount"] for h in holders),
                "holders": holders,
            })  # fmt: skip
    if as_json:
        say_raw(compact_json({"grant_id": grant_id, "budgets": lines}))
        return
    say(f"grant {grant_id}")
    if not lines:
        say("  no budgets")
    for line in lines:
        say(f"  {line['metric']}: {line['consumed']} of {line['limit']} per "
            f"{window_text(line['window'])}, {line['held']} held")  # fmt: skip
        for holder in line["holders"]:
            say(f"    {holder['amount']} held by {holder['effect_key']} ({holder['state']})")
            if holder["state"] == EffectState.AMBIGUOUS.value:
                say(f"      ctrlrun resolve {holder['effect_key']} --committed{hint}  # or --failed")
