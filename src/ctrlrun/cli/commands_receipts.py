"""``receipts``: list the receipt chain, export it as JSON lines, or verify it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import click

from ..receipt import Receipt, UnreadableReceipt
from .stores import Settings, open_operator_store, store_url_option
from .text import compact_json, reader_gone, say, say_prose, say_raw
from .verifying import verify_chain_command

__all__ = ["receipts"]


def _error_type(error: str) -> str:
    name = error.split(":", 1)[0].strip()
    return name if name.isidentifier() else "Error"


def _unreadable(seq: Any, receipt_id: Any, hash: Any, type_name: str) -> tuple[str, str]:
    """The human line and the JSON line for a row that cannot be read."""
    refusal = f"this row could not be read ({type_name})"
    shown_seq = "-" if seq is None else seq
    line = f"seq {shown_seq}  {receipt_id or '-'}  UNREADABLE  {refusal}"
    document = {"seq": seq, "receipt_id": receipt_id, "refusal": refusal, "hash": hash}
    return line, compact_json(document)


def _receipt_line(receipt: Receipt) -> str:
    principal = receipt.principal
    if isinstance(principal, Mapping):  # a document this library did not write
        agent = principal.get("agent") or "-"
    else:
        agent = principal.agent
    return (
        f"{receipt.finished_at}  {receipt.receipt_id}  {receipt.action}  "
        f"{receipt.decision}/{receipt.result}  {receipt.effect_key or '-'}  {agent}"
    )


def _render(row: Receipt | UnreadableReceipt, as_json: bool) -> str:
    if isinstance(row, UnreadableReceipt):
        human, document = _unreadable(row.seq, row.receipt_id, row.hash, _error_type(row.error))
        return document if as_json else human
    try:
        return row.to_json() if as_json else _receipt_line(row)
    except Exception as exc:  # a stored document that parses but cannot be rendered
        human, document = _unreadable(row.seq, row.receipt_id, row.hash, type(exc).__name__)
        return document if as_json else human


@click.command()
@click.option("--last", type=click.IntRange(min=1), metavar="N", help="Only the last N receipts.")
@click.option("--json", "as_json", is_flag=True, help="Each stored receipt document as one JSON line.")
@click.option("--verify-chain", "check_chain", is_flag=True, help="Check the hash chain instead of listing.")
@click.option("--since-verified", is_flag=True,
              help="With --verify-chain: check only what follows the store's verified mark.")  # fmt: skip
@store_url_option
@click.pass_obj
def receipts(settings: Settings, last: int | None, as_json: bool, check_chain: bool,
             since_verified: bool, store_url: str | None) -> None:  # fmt: skip
    """Show receipts in chain order, or check the chain with --verify-chain."""
    if check_chain or since_verified:
        verify_chain_command(settings, store_url, check_chain, as_json, since_verified)
        return
    with open_operator_store(settings, store_url, read_only=True) as store:
        rows = store.receipts()
    if not rows:
        say_prose("no receipts yet", as_json=as_json)
        return
    if last is not None:
        rows = rows[-last:]
    for row in rows:
        if reader_gone():
            return
        line = _render(row, as_json)
        if as_json:
            say_raw(line)
        else:
            say(line)
