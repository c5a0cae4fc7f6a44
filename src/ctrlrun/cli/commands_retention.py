"""``prune`` and ``hold``: delete a verified prefix of the receipt chain behind a checkpoint,
and keep ranges of it from every prune until a person releases them."""

from __future__ import annotations

from typing import Any

import click

from ..errors import CTRLRunError, InvalidArgument
from ..evidence.retention import Hold, PruneRefused, parse_duration
from ..evidence.store import EvidenceStore
from .options import json_lines_option
from .stores import Settings, open_operator_store, store_url_option
from .text import compact_json, say, say_raw

__all__ = ["hold", "load_object", "prune", "shown_time"]

UNAVAILABLE = 3  # the exit code of an anchor that could not be made


def load_object(spec: str, what: str = "--provider") -> Any:
    """``MODULE:ATTR`` imported from ``sys.path`` (so ``PYTHONPATH`` reaches the operator's own
    module), then from the current directory: the object itself."""
    import os
    import sys
    from importlib import import_module

    module, sep, attribute = spec.partition(":")
    if not sep or not module or not attribute:
        raise InvalidArgument(f"{what} {spec!r} is not MODULE:ATTR (e.g. myanchors:PROVIDER)")
    try:
        try:
            loaded = import_module(module)
        except ModuleNotFoundError as missing:
            here = os.getcwd()
            if missing.name != module.split(".")[0] or here in sys.path:
                raise
            sys.path.append(here)  # what `python -m` would have found
            loaded = import_module(module)
    except Exception as exc:  # the operator's module: any error is theirs to read
        raise InvalidArgument(f"{what} {spec!r}: cannot import {module!r} ({type(exc).__name__}: {exc}); "
                              "is it on PYTHONPATH?") from None  # fmt: skip
    found = loaded
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise InvalidArgument(f"{what} {spec!r}: module {module!r} has no attribute {attribute!r}")
        found = getattr(found, part)
    return found


def _evidence(store: Any) -> EvidenceStore:
    if not isinstance(store, EvidenceStore):
        raise InvalidArgument(f"{type(store).__name__} keeps no checkpoint or holds; use a ctrlrun store")
    return store


@click.command()
@click.option("--through", "through", type=click.IntRange(min=1), required=True, help="Delete receipts 1..SEQ (never the head).")
@click.option("--older-than", "older_than", required=True, metavar="DURATION",
              help="Refuse while a budget charge of a pruned receipt is newer than this (90d, 12h, 30m, 45s).")
@click.option("--by", "by", required=True, help="Who prunes (recorded).")
@click.option("--reason", "reason", required=True, help="Why (recorded).")
@click.option("--provider", "provider", metavar="MODULE:ATTR", help="Anchor the checkpoint here first.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
@store_url_option
@click.pass_obj
def prune(settings: Settings, through: int, older_than: str, by: str, reason: str,
          provider: str | None, as_json: bool, store_url: str | None) -> None:  # fmt: skip
    """Delete the receipts through SEQ in batches behind a checkpoint; the chain verifies across the gap."""
    try:
        age = parse_duration(older_than)
    except InvalidArgument as bad:
        raise click.BadParameter(str(bad), param_hint="'--older-than'") from None
    anchoring = load_object(provider) if provider else None
    with open_operator_store(settings, store_url) as opened:
        evidence = _evidence(opened)
        try:
            result = evidence.prune(through, older_than=age, by=by, reason=reason,
                                 anchor=_anchor(anchoring) if anchoring is not None else None)  # fmt: skip
        except PruneRefused as refused:
            if as_json:
                say_raw(compact_json({"ok": False, "status": "refused", "reason": refused.reason,
                                      "seq": refused.seq, "error": str(refused)}))  # fmt: skip
                raise click.exceptions.Exit(1) from None
            raise
        except _Unavailable as lost:
            if as_json:
                say_raw(compact_json({"ok": False, "status": "unavailable", "reason": "anchor",
                                      "seq": None, "error": str(lost)}))  # fmt: skip
            else:
                say(f"Error: unavailable: {lost}; nothing was deleted", err=True)
            raise click.exceptions.Exit(UNAVAILABLE) from None
    if as_json:
        say_raw(compact_json({"ok": True, "status": "pruned", **result.to_dict()}))
        return
    say(f"pruned seq {result.first}..{result.through}: {result.deleted} receipts in "
        f"{result.batches} batch{'es' * (result.batches != 1)}")  # fmt: skip
    say(f"checkpoint seq {result.checkpoint.seq} {result.checkpoint.hash}")
    say(f"recorded as receipt {result.receipt_id} (action ctrlrun.retention.prune)")


class _Unavailable(CTRLRunError):
    """The checkpoint's anchor could not be made: nothing was deleted."""


def _anchor(provider: Any) -> Any:
    def anchor(seq: int, hash: str) -> None:
        from ..evidence.anchors import anchor_checkpoint

        try:
            anchor_checkpoint(provider, seq, hash)
        except Exception as exc:  # any provider failure: nothing deleted, exit 3
            raise _Unavailable(str(exc) or type(exc).__name__) from None

    return anchor


@click.group()
def hold() -> None:
    """Keep receipt ranges from every prune until a person releases them."""


@hold.command("place")
@click.option("--id", "hold_id", required=True, help="A name for the hold (used once).")
@click.option("--from-seq", "from_seq", type=click.IntRange(min=1), required=True, help="First receipt seq kept (may lie above the head).")
@click.option("--to-seq", "to_seq", type=click.IntRange(min=1), help="Last receipt seq kept; without it, everything from --from-seq on.")
@click.option("--reason", "reason", required=True, help="Why (recorded).")
@click.option("--by", "by", required=True, help="Who places it (recorded).")
@store_url_option
@click.pass_obj
def place(settings: Settings, hold_id: str, from_seq: int, to_seq: int | None, reason: str, by: str,
          store_url: str | None) -> None:  # fmt: skip
    """Place a hold: no prune deletes a receipt it covers."""
    with open_operator_store(settings, store_url) as store:
        placed = _evidence(store).place_hold(hold_id, from_seq, to_seq, reason=reason, by=by)
    say(f"hold {placed.hold_id} placed on seq {placed.span()} by {placed.placed_by}")


@hold.command("release")
@click.option("--id", "hold_id", required=True, help="The hold to release.")
@click.option("--by", "by", required=True, help="Who releases it (recorded).")
@store_url_option
@click.pass_obj
def release(settings: Settings, hold_id: str, by: str, store_url: str | None) -> None:
    """Release a hold: its receipts may be pruned again."""
    with open_operator_store(settings, store_url) as store:
        released = _evidence(store).release_hold(hold_id, by=by)
    say(f"hold {released.hold_id} on seq {released.span()} released by {released.released_by}")


@hold.command("list")
@json_lines_option("each hold")
@store_url_option
@click.pass_obj
def list_holds(settings: Settings, as_json: bool, store_url: str | None) -> None:
    """Every hold, live and released, in the order placed."""
    with open_operator_store(settings, store_url, read_only=True) as store:
        holds: tuple[Hold, ...] = _evidence(store).holds()
    for h in holds:
        if as_json:
            say_raw(compact_json(h.to_dict()))
            continue
        state = "live" if h.live else f"released by {h.released_by} at {shown_time(h.released_at)}"
        say(f"{h.hold_id}  seq {h.span()}  {state}  placed by {h.placed_by} at {shown_time(h.placed_at)}  "
            f"reason: {h.reason}")  # fmt: skip
    if not holds and not as_json:
        say("no holds")


def shown_time(stamp: str | None) -> str:
    """A stored time as every listing prints it (milliseconds, ``Z``)."""
    from datetime import datetime

    from .._time import format_ts

    try:
        return format_ts(datetime.fromisoformat(stamp or ""))
    except ValueError:
        return stamp or "-"
