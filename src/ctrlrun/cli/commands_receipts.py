"""``receipts``: list the receipt chain, export it as JSON lines, or verify it."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

import click

from ..evidence.receipt import Receipt, UnreadableReceipt
from ..store import StateStore
from .options import check_paging, json_lines_option, paging_options
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


class _Moment(click.ParamType):  # type: ignore[type-arg]
    """An ISO-8601 time with its UTC offset (``2026-11-30T09:00:00Z``, ``…+01:00``)."""

    name = "TIME"

    def convert(self, value: Any, param: Any, ctx: Any) -> datetime:
        if isinstance(value, datetime):
            return value
        try:
            moment = datetime.fromisoformat(str(value).strip())
        except ValueError:
            moment = None
        if moment is None or moment.utcoffset() is None:
            self.fail(f"{value!r} is not an ISO-8601 time with an offset (e.g. "
                      "2026-11-30T09:00:00Z)", param, ctx)  # fmt: skip
        return moment


def _listing(store: StateStore, last: int | None, since: datetime | None,
             from_seq: int | None) -> Iterable[Receipt | UnreadableReceipt]:  # fmt: skip
    """The rows a listing prints, read a page at a time."""
    if last is not None:
        return store.last_receipts(last)
    if since is not None:
        return store.iter_receipts_since(since)
    if from_seq is not None:
        return (r for r in store.iter_receipts(after_seq=from_seq - 1) if r.seq is not None)
    return store.iter_receipts()


def _print_rows(store: Any, rows: Iterable[Receipt | UnreadableReceipt], as_json: bool,
                page: bool) -> None:  # fmt: skip
    """Print each row as it is read; an empty store says so (a page prints its rows only)."""
    printed = False
    for row in rows:
        if reader_gone():
            return
        printed = True
        line = _render(row, as_json)
        if as_json:
            say_raw(line)
        else:
            say(line)
    if not printed and (not page or not store.last_receipts(1)):
        say_prose("no receipts yet", as_json=as_json)


@click.command()
@click.option("--last", type=click.IntRange(min=1), metavar="N", help="Only the last N receipts.")
@click.option("--since", type=_Moment(), help="Receipts finished at or after TIME (ISO-8601 with offset).")
@click.option("--from-seq", "from_seq", type=click.IntRange(min=1), metavar="SEQ",
              help="Receipts with seq >= SEQ, to the head.")  # fmt: skip
@json_lines_option("each stored receipt document (with --verify-chain: the report, one line)")
@paging_options("every receipt is printed")
@click.option("--verify-chain", "check_chain", is_flag=True, help="Check the hash chain instead of listing.")
@click.option("--since-verified", is_flag=True,
              help="With --verify-chain: check only what follows the store's verified mark.")  # fmt: skip
@store_url_option
@click.pass_obj
def receipts(settings: Settings, last: int | None, since: datetime | None, from_seq: int | None,
             as_json: bool, limit: int | None, every: bool, check_chain: bool, since_verified: bool,
             store_url: str | None) -> None:  # fmt: skip
    """Show receipts in chain order, or check the chain with --verify-chain.

    Every receipt is shown unless --last, --limit, --since or --from-seq picks some."""
    if check_chain or since_verified:
        verify_chain_command(settings, store_url, check_chain, as_json, since_verified)
        return
    if sum(v is not None for v in (last, since, from_seq)) > 1:
        raise click.UsageError("give at most one of --last, --since and --from-seq")
    check_paging(limit, every, ("--last N", last))
    with open_operator_store(settings, store_url, read_only=True) as store:
        paged = last is not None or since is not None or from_seq is not None or limit is not None
        rows = _listing(store, last, since, from_seq)
        if limit is not None:
            rows = itertools.islice(rows, limit)
        _print_rows(store, rows, as_json, paged)
