"""Evidence: receipts and events, the hash chain over receipts, operator acts, anchors and retention."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from .receipt import GENESIS_HASH, RECEIPT_SCHEMA, RECEIPT_SCHEMA_V7, Event, EventSink, EventType, JSONLEventSink, Receipt, ReceiptResult, UnreadableReceipt
    from .chain import ChainBreak, ChainReport, verify_rows

_LAZY: dict[str, str] = {
    "GENESIS_HASH": "receipt",
    "RECEIPT_SCHEMA": "receipt",
    "RECEIPT_SCHEMA_V7": "receipt",
    "Event": "receipt",
    "EventSink": "receipt",
    "EventType": "receipt",
    "JSONLEventSink": "receipt",
    "Receipt": "receipt",
    "ReceiptResult": "receipt",
    "UnreadableReceipt": "receipt",
    "ChainBreak": "chain",
    "ChainReport": "chain",
    "verify_rows": "chain",
}

__all__ = [
    "ChainBreak",
    "ChainReport",
    "Event",
    "EventSink",
    "EventType",
    "GENESIS_HASH",
    "JSONLEventSink",
    "RECEIPT_SCHEMA",
    "RECEIPT_SCHEMA_V7",
    "Receipt",
    "ReceiptResult",
    "UnreadableReceipt",
    "verify_rows",
]

if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
