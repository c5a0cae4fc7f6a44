"""``anchor``: record the store's heads with a provider, or verify the store against every anchor
the provider holds."""

from __future__ import annotations

import click

from .commands_retention import UNAVAILABLE, load_object, shown_time
from .stores import Settings, open_operator_store, store_url_option
from .text import compact_json, say, say_raw

__all__ = ["anchor"]


@click.command()
@click.option("--provider", "provider", metavar="MODULE:ATTR", required=True,
              help="The anchor provider object (MODULE imported from sys.path).")  # fmt: skip
@click.option("--kind", "kind", type=click.Choice(["interval", "checkpoint"]), default="interval", show_default=True,
              help="interval: the receipt and acts heads; checkpoint: the prune checkpoint.")  # fmt: skip
@click.option("--verify", "verify", is_flag=True, help="Check the store against every anchor the provider holds.")
@click.option("--json", "as_json", is_flag=True, help="One JSON line.")
@store_url_option
@click.pass_obj
def anchor(settings: Settings, provider: str, kind: str, verify: bool, as_json: bool, store_url: str | None) -> None:
    """Record the chain heads with an anchor provider, or --verify the store against its anchors."""
    from ..evidence.anchors import AnchorUnavailable, make_anchors, verify_anchors

    chosen = load_object(provider)
    if verify:
        with open_operator_store(settings, store_url, read_only=True) as store:
            report = verify_anchors(store, chosen)
        if as_json:
            say_raw(compact_json(report.to_dict()))
        else:
            for b in report.breaks:
                say(f"  {b.name} at seq {b.seq} ({b.kind}): {b.detail}")
            if report.status == "unavailable":
                say(f"Error: unavailable: {report.error}; the store is neither verified nor broken", err=True)
            elif report.breaks:
                say(f"anchors: {report.checked} checked, {len(report.breaks)} broken", err=False)
                say(f"Error: the store does not match its anchors ({len(report.breaks)} "
                    f"break{'s' * (len(report.breaks) != 1)})", err=True)  # fmt: skip
            else:
                pruned = f" ({report.pruned} below the checkpoint, pruned)" if report.pruned else ""
                say(f"anchors: {report.checked} checked{pruned}, the store matches every one")
        if report.status == "unavailable":
            raise click.exceptions.Exit(UNAVAILABLE)
        if report.breaks:
            raise click.exceptions.Exit(1)
        return
    try:
        with open_operator_store(settings, store_url) as store:
            made = make_anchors(store, chosen, kind)
    except AnchorUnavailable as lost:
        if as_json:
            say_raw(compact_json({"ok": False, "status": "unavailable", "anchors": [], "error": str(lost)}))
        else:
            say(f"Error: unavailable: {lost}; nothing was anchored", err=True)
        raise click.exceptions.Exit(UNAVAILABLE) from None
    if as_json:
        say_raw(compact_json({"ok": True, "status": "anchored", "error": None,
                              "anchors": [{"seq": a.seq, "hash": a.hash, "kind": a.kind, "at": a.at} for a in made]}))  # fmt: skip
        return
    for a in made:
        say(f"anchored seq {a.seq} {a.hash} ({a.kind}) at {shown_time(a.at)}")
