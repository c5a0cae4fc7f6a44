"""``receipts --verify-chain [--since-verified]``: check the chain, print the report, and move
the store's verified mark after a check that passed.

The check reads the store as every read command does (never creating or migrating it; SQLite
opened read-only). The mark is then written through a store opened for writing, which is the
same Postgres store, or the SQLite file reopened read-write at the schema it is at; when that
cannot be done (the file may not be written, or it was read as a snapshot) stderr says that the
mark was not moved and why, and the exit code is the check's.
"""

from __future__ import annotations

import click

from ..evidence.chain import ChainReport
from ..store.verify import verify_chain
from ..errors import CTRLRunError
from ..store import StateStore
from ..store.verifymark import mark_verified
from .stores import Settings, open_operator_store
from .text import compact_json, say, say_raw

__all__ = ["print_report", "verify_chain_command"]


def _range_line(report: ChainReport) -> str:
    if report.check == "incremental":
        return f"incremental check of seq {report.from_seq}..{report.to_seq} (mark at {report.from_seq})"
    pruned = "" if report.pruned_through is None else f" (pruned through seq {report.pruned_through})"
    if report.to_seq < report.from_seq:
        return "full check of an empty chain"
    return f"full check of seq {report.from_seq}..{report.to_seq}{pruned}"


def _acts_line(report: ChainReport) -> str | None:
    if report.acts_head_seq is None or (report.acts_head_seq == 0 and report.not_covered is None):
        return None  # no act yet, nothing uncovered: nothing to say
    if report.check == "incremental":
        line = f"acts: {report.acts_verified} operator acts verified since the mark (head at seq {report.acts_head_seq})"
    else:
        line = f"acts: {report.acts_verified} of {report.acts_head_seq} operator acts verified"
    if report.not_covered is not None:
        line += f"; receipts 1..{report.not_covered} predate the acts chain (not covered)"
    return line


def print_report(report: ChainReport, as_json: bool) -> None:
    """The report as text (or one JSON line); a chain that does not verify exits 1."""
    if as_json:
        say_raw(compact_json(report.to_dict()))
    else:
        say(f"chain: {report.verified} of {report.chained + report.unchained} receipts verified")
        if report.unchained:
            say(f"       {report.unchained} written before the chain existed (unchained)")
        say(_range_line(report))
        acts = _acts_line(report)
        if acts is not None:
            say(acts)
        for chain_break in report.breaks:
            where = "" if chain_break.seq is None else f" at seq {chain_break.seq}"
            say(f"  {chain_break.name}{where}: {chain_break.detail}")
        if report.more_breaks:
            say(f"  … and {report.more_breaks} more break{'s' * (report.more_breaks != 1)} not listed")
        if report.ok:
            say("the chain is intact")
    if not report.ok:
        count = report.break_count
        raise CTRLRunError(f"the receipt chain does not verify ({count} break{'s' * (count != 1)})")


def _move_mark(store: StateStore, report: ChainReport, settings: Settings) -> None:
    """Move the mark to the head just verified, or say on stderr why it stays."""
    if not report.ok:
        return
    try:
        from ..store.sqlite import SQLiteStateStore  # only here: --help stays light

        sqlite = store if isinstance(store, SQLiteStateStore) else None
        if sqlite is not None and sqlite.read_only:  # a SQLite store's own properties
            if sqlite.snapshot:
                raise CTRLRunError(f"{sqlite.path} was read as a snapshot, so it cannot be written from here")
            writable = SQLiteStateStore(sqlite.path, clock=settings.clock, migrate=False)
            try:
                mark_verified(writable, report, settings.clock())
            finally:
                writable.close()
        else:
            mark_verified(store, report, settings.clock())
    except CTRLRunError as exc:
        say(f"note: the verified mark was not moved: {exc}", err=True)


def verify_chain_command(settings: Settings, store_url: str | None, check_chain: bool,
                         as_json: bool, since_verified: bool) -> None:  # fmt: skip
    """Verify the selected store's chain (from its mark with ``since_verified``), then report."""
    if not check_chain:
        raise click.UsageError("--since-verified needs --verify-chain (it chooses where the check starts)")
    with open_operator_store(settings, store_url, read_only=True) as store:
        report = verify_chain(store, since_verified=since_verified)
        _move_mark(store, report, settings)
    print_report(report, as_json)
