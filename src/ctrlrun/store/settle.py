"""After a finish whose write failed: read back whether it landed, and what to hand back if so.

A finish is a compare-and-set on the attempt that holds the key (``executing``, no outcome yet)
and places a receipt whose id is new, so both questions have exact answers in the store: the
key's record shows this attempt's outcome, and the receipt id is stored. When neither is there
the finish did not land and sending it again is safe (it is the same compare-and-set).
"""

from __future__ import annotations

from collections.abc import Sequence
from ..evidence.drafts import EventRow, ReceiptDraft, event_from_row
from ..effects.records import EffectState
from ..evidence.receipt import Event, Receipt
from .rows import Tx

__all__ = ["Landed", "finish_landed"]

Landed = tuple[tuple[Event, ...], Receipt | ReceiptDraft | None]


def finish_landed(
    tx: Tx,
    *,
    effect_key: str | None,
    action_id: str,
    outcome: EffectState | None,
    rows: Sequence[EventRow],
    receipt: Receipt | ReceiptDraft | None,
    return_events: bool,
) -> Landed | None:
    """What ``finish_attempt`` would have answered, when the finish is in the store; ``None``
    when it is not (nothing of it was kept: the caller may send it again).

    The events come back without their ids (the store assigned them in the write whose answer
    was lost); the receipt as stored."""
    stored: tuple[str, str] | None = None
    if receipt is not None:
        stored = tx.stored_receipt(receipt.receipt_id)
    if effect_key is not None:
        record = tx.effect(effect_key)
        if record is None or record.action_id != action_id or record.state is not outcome:
            return None
        if record.state is EffectState.EXECUTING:  # pragma: no cover - no finish writes it
            return None
    elif stored is None:
        return None  # with neither a key nor a receipt there is nothing to recognise it by
    events = tuple(event_from_row(row, None) for row in rows) if return_events else ()
    if receipt is None or stored is None:
        return events, None
    line, digest = stored
    if isinstance(receipt, ReceiptDraft):
        receipt.line, receipt.hash = line, digest
        return events, receipt
    return events, Receipt.from_json(line, hash=digest)
