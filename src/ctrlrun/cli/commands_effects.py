"""``resolve`` and ``effects``: a human settles an ambiguous effect, and lists effect records."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import click

from .. import operator
from .._time import format_ts
from ..authority.ledger import Consumption
from ..effects.records import EffectRecord, EffectState
from ..store import StateStore
from .commands_approvals import CLI_ANSWERER
from .options import check_paging, json_lines_option, more_hint, paging_options
from .stores import Settings, open_operator_store, store_url_option
from .text import compact_json, reader_gone, say, say_prose, say_raw

__all__ = ["DEFAULT_LIMIT", "effects", "resolve", "resolve_ambiguous"]

DEFAULT_LIMIT = 100  # effects a listing prints without --limit or --all


@click.command()
@click.argument("effect_key")
@click.option("--committed", is_flag=True, help="The effect happened: a retry is a duplicate.")
@click.option("--failed", is_flag=True, help="The effect provably did not happen: a retry may run.")
@store_url_option
@click.pass_obj
def resolve(settings: Settings, effect_key: str, committed: bool, failed: bool,
            store_url: str | None) -> None:  # fmt: skip
    """Settle an AMBIGUOUS effect as --committed or --failed (recorded as cli:local)."""
    if committed == failed:
        raise click.UsageError("give exactly one of --committed or --failed")
    state = EffectState.COMMITTED if committed else EffectState.FAILED
    with open_operator_store(settings, store_url) as store:
        resolve_ambiguous(store, effect_key, state, CLI_ANSWERER)
        say(f"{effect_key} resolved {state} by {CLI_ANSWERER}")
        if state is EffectState.FAILED:
            say("a retry of this effect is now permitted")


def resolve_ambiguous(store: StateStore, effect_key: str, state: EffectState,
                      resolver: str) -> EffectRecord:  # fmt: skip
    """Settle an ambiguous effect as ``state``, by a human named ``resolver`` (the operator
    library's resolve)."""
    return operator.resolve(store, effect_key, state, resolver)


def _lease_lapsed(record: EffectRecord, now: datetime) -> bool:
    live_states = (EffectState.RESERVED, EffectState.EXECUTING)
    lease = record.lease_expires_at
    return record.state in live_states and lease is not None and now > lease


def _effect_line(record: EffectRecord, now: datetime) -> str:
    line = (
        f"{record.effect_key}  {record.state}  attempt {record.attempt}  "
        f"{record.action_id}  {format_ts(record.updated_at)}"
    )
    if _lease_lapsed(record, now):
        line += "  (lease expired)"
    if record.resolved_by:
        line += f"  resolved by {record.resolved_by}"
    return line


def _effect_document(record: EffectRecord, now: datetime) -> dict[str, Any]:
    lease = record.lease_expires_at
    return {
        "effect_key": record.effect_key,
        "state": record.state.value,
        "attempt": record.attempt,
        "action_id": record.action_id,
        "action_hash": record.action_hash,
        "created_at": format_ts(record.created_at),
        "updated_at": format_ts(record.updated_at),
        "lease_expires_at": None if lease is None else format_ts(lease),
        "lease_expired": _lease_lapsed(record, now),
        "resolved_by": record.resolved_by,
        "error": record.error,
        "result_exact": record.result_exact,
    }


@click.command()
@click.option("--state", "state", type=click.Choice([s.value for s in EffectState]),
              help="Only effects in this state.")  # fmt: skip
@click.option("--key-prefix", "key_prefix", metavar="P", help="Only keys starting with P (literally).")
@paging_options("a page of 100")
@json_lines_option("each effect record")
@store_url_option
@click.pass_obj
def effects(settings: Settings, state: str | None, key_prefix: str | None, as_json: bool,
            limit: int | None, every: bool, store_url: str | None) -> None:  # fmt: skip
    """List effect records in creation order, a page of 100 unless --limit or --all."""
    check_paging(limit, every)
    now = settings.clock()
    # the default page reads one more row, to say on stderr that there are more
    page = None if every else (limit if limit is not None else DEFAULT_LIMIT + 1)
    with open_operator_store(settings, store_url, read_only=True) as store:
        if state == EffectState.NEW.value:
            records: Any = iter(())
        else:
            records = store.iter_effects(state, key_prefix, page)
        printed = 0
        for record in records:
            if reader_gone():
                return
            if printed == DEFAULT_LIMIT and page == DEFAULT_LIMIT + 1:
                more_hint(DEFAULT_LIMIT)
                break
            printed += 1
            _print_effect(store, record, now, as_json)
    if not printed:
        if key_prefix:
            empty = f"no effects{'' if state is None else ' ' + state} with keys starting {key_prefix!r}"
        else:
            empty = "no effects yet" if state is None else f"no effects are {state}"
        say_prose(empty, as_json=as_json)


def _print_effect(store: Any, record: EffectRecord, now: datetime, as_json: bool) -> None:
    """One effect's line (or JSON document), with the budget charges it holds."""
    charges = [c for c in store.consumptions(effect_key=record.effect_key) if c.released_at is None]
    if as_json:
        document = _effect_document(record, now)
        document["budget_charges"] = [
            {"grant_id": c.grant_id, "metric": c.metric, "amount": c.amount} for c in charges
        ]
        say_raw(compact_json(document))
    else:
        say(_effect_line(record, now) + _charges_text(record, charges))


def _charges_text(record: EffectRecord, charges: list[Consumption]) -> str:
    """``  spent 90000 amount on g`` for a committed record, else ``  holds …``; nothing if none."""
    if not charges:
        return ""
    word = "spent" if record.state is EffectState.COMMITTED else "holds"
    return f"  {word} " + ", ".join(f"{c.amount} {c.metric} on {c.grant_id}" for c in charges)
