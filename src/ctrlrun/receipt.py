"""``ctrlrun.receipt``, the import path the docs name: receipts, events, sinks and the chain check
(they live in ``ctrlrun.evidence``)."""

from __future__ import annotations

from typing import Any

from .evidence.receipt import (  # noqa: F401
    GENESIS_HASH,
    RECEIPT_SCHEMA,
    RECEIPT_SCHEMA_V7,
    Event,
    EventSink,
    EventType,
    JSONLEventSink,
    Receipt,
    ReceiptResult,
    UnreadableReceipt,
)
from .evidence.chain import (  # noqa: F401
    ChainBreak,
    ChainReport,
    verify_rows,
)


def verify_chain(store: Any, *, since_verified: bool = False) -> ChainReport:
    """Check ``store``'s receipt chain and operator acts (``ctrlrun.store.verify.verify_chain``)."""
    from .store.verify import verify_chain as check

    return check(store, since_verified=since_verified)


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
    "verify_chain",
    "verify_rows",
]
