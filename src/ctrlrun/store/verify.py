"""Checking a store's evidence: its receipt chain walked in one read snapshot, then its operator
acts cross-checked against the effects they settled. The walk itself is ``ctrlrun.evidence``'s,
on the rows this hands it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..evidence.chain import ChainReport, row_position, verify_rows, walk_snapshot
from ..evidence.receipt import Receipt, UnreadableReceipt

__all__ = ["verify_chain"]


def verify_chain(store: Any, *, since_verified: bool = False) -> ChainReport:
    """Walk the store's receipts up to the chain head read first, in one read snapshot, and name
    every break; ``since_verified`` walks only what follows the store's verified mark (a full
    walk when it has none). It reads only: moving the mark is ``store.verifymark``'s."""
    from .snapshot import open_snapshot

    with open_snapshot(store, since_verified=since_verified) as snapshot:
        if snapshot is not None:
            report, mark = walk_snapshot(snapshot, since_verified), snapshot.mark
    if snapshot is not None:
        from .actscheck import check_acts

        return check_acts(store, report, mark if report.check == "incremental" else None)
    head = store.chain_head()  # any other StateStore: its head first, then its rows up to it
    limit = None if head is None else head[0]
    rows: Iterable[Receipt | UnreadableReceipt] = store.receipts()
    if limit is not None:
        rows = (r for r in rows if (row_position(r) or 0) <= limit)
    return verify_rows(rows, head)
