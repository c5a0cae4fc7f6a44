"""Receipts, events, the hash chain over receipts, and the sinks that copy them out."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from .action import canonical_bytes, sha256_hex

__all__ = [
    "GENESIS_HASH",
    "RECEIPT_SCHEMA",
    "ChainBreak",
    "ChainReport",
    "Event",
    "EventSink",
    "EventType",
    "JSONLEventSink",
    "Receipt",
    "ReceiptResult",
    "UnreadableReceipt",
    "verify_chain",
]

RECEIPT_SCHEMA = "ctrlrun.receipt/v7"
GENESIS_HASH = "sha256:" + "0" * 64

log = logging.getLogger("ctrlrun")


class ReceiptResult(StrEnum):
    """How an attempt ended."""

    COMMITTED = "committed"
    FAILED = "failed"
    AMBIGUOUS = "ambiguous"
    DENIED = "denied"
    BLOCKED = "blocked"
    OBSERVED = "observed"


class EventType(StrEnum):
    """The closed set of event types."""

    ACTION_PROPOSED = "ACTION_PROPOSED"
    POLICY_EVALUATED = "POLICY_EVALUATED"
    APPROVAL_REQUESTED = "APPROVAL_REQUESTED"
    APPROVAL_GRANTED = "APPROVAL_GRANTED"
    APPROVAL_DENIED = "APPROVAL_DENIED"
    APPROVAL_EXPIRED = "APPROVAL_EXPIRED"
    APPROVAL_INVALIDATED = "APPROVAL_INVALIDATED"
    APPROVAL_CONSUMED = "APPROVAL_CONSUMED"
    EFFECT_RESERVED = "EFFECT_RESERVED"
    EFFECT_RESERVATION_REFUSED = "EFFECT_RESERVATION_REFUSED"
    EXECUTION_STARTED = "EXECUTION_STARTED"
    EXECUTION_COMMITTED = "EXECUTION_COMMITTED"
    EXECUTION_FAILED = "EXECUTION_FAILED"
    EXECUTION_AMBIGUOUS = "EXECUTION_AMBIGUOUS"
    EFFECT_RESOLVED = "EFFECT_RESOLVED"
    ACTION_DENIED = "ACTION_DENIED"
    RECONCILIATION_STARTED = "RECONCILIATION_STARTED"
    RECONCILIATION_RESOLVED = "RECONCILIATION_RESOLVED"
    EXECUTION_SUSPENDED = "EXECUTION_SUSPENDED"
    EXECUTION_RESUMED = "EXECUTION_RESUMED"
    AUTHORITY_RESOLVED = "AUTHORITY_RESOLVED"
    AUTHORITY_DENIED = "AUTHORITY_DENIED"
    DELEGATION_CREATED = "DELEGATION_CREATED"
    DELEGATION_REVOKED = "DELEGATION_REVOKED"
    DELEGATION_REJECTED = "DELEGATION_REJECTED"
    CLOCK_SKEW_DETECTED = "CLOCK_SKEW_DETECTED"


def _compact(document: Mapping[str, Any]) -> str:
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


@dataclass(frozen=True, slots=True)
class Event:
    """One step of one action; many per action, not chained."""

    type: EventType
    ts: str
    action_id: str | None = None
    effect_key: str | None = None
    approval_id: str | None = None
    data: Mapping[str, Any] = field(default_factory=dict)
    event_id: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "type", EventType(self.type))
        object.__setattr__(self, "data", dict(self.data))

    def to_dict(self) -> dict[str, Any]:
        return {
            "event_id": self.event_id,
            "ts": self.ts,
            "type": self.type.value,
            "action_id": self.action_id,
            "effect_key": self.effect_key,
            "approval_id": self.approval_id,
            "data": dict(self.data),
        }

    def to_json(self) -> str:
        return _compact(self.to_dict())

    @classmethod
    def from_dict(cls, document: Mapping[str, Any]) -> Event:
        return cls(
            type=EventType(document["type"]),
            ts=document["ts"],
            action_id=document.get("action_id"),
            effect_key=document.get("effect_key"),
            approval_id=document.get("approval_id"),
            data=document.get("data") or {},
            event_id=document.get("event_id"),
        )

    @classmethod
    def from_json(cls, text: str) -> Event:
        return cls.from_dict(json.loads(text))


_NOT_STORED = -1


@dataclass(frozen=True, slots=True)
class Receipt:
    """The portable record of one finished attempt: 34 keys, in this order."""

    receipt_id: str
    action_id: str
    action: str
    action_hash: str
    principal: Mapping[str, Any]
    resource: str | None
    arguments: Mapping[str, Any]
    environment: str
    decision: str
    decision_reason: str
    approval_id: str | None
    approver: str | None
    effect_key: str | None
    attempt: int
    result: str
    execution: str | None
    would_have: Mapping[str, Any] | None
    error: str | None
    started_at: str
    finished_at: str
    seq: int | None = None
    prev_hash: str | None = None
    policy_hash: str | None = None
    policy_version: str | None = None
    controls: tuple[str, ...] = ()
    precondition_at_request: str | None = None
    precondition_at_recheck: str | None = None
    approvers: tuple[Mapping[str, Any], ...] = ()
    authority_grant_id: str | None = None
    task: str | None = None
    scope_hash: str | None = None
    budget_charges: tuple[Mapping[str, Any], ...] = ()
    hop: str | None = None
    schema: str = RECEIPT_SCHEMA
    hash: str | None = field(default=None, compare=False)
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    stored_seq: int | None = field(default=_NOT_STORED, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """The 34-key document in table order (the stored hash is never part of it)."""
        document: dict[str, Any] = {"schema": self.schema}
        for name in _DOCUMENT_KEYS[1:]:
            value = getattr(self, name)
            if name in ("controls", "approvers", "budget_charges"):
                value = [dict(v) if isinstance(v, Mapping) else v for v in value]
            elif isinstance(value, Mapping):
                value = json.loads(_compact(value))
            document[name] = value
        for key, value in self.extra.items():
            document.setdefault(key, value)
        return document

    def to_json(self) -> str:
        """The stored line: compact JSON, keys in table order, non-ASCII as itself."""
        return _compact(self.to_dict())

    def chain_hash(self) -> str:
        """``sha256:`` over the canonical (sorted-key) bytes of the document."""
        return sha256_hex(canonical_bytes(self.to_dict()))

    def chained(self, seq: int, prev_hash: str) -> Receipt:
        """This receipt placed at ``seq`` after ``prev_hash``, with its hash computed."""
        placed = replace(self, seq=seq, prev_hash=prev_hash, hash=None)
        return replace(placed, hash=placed.chain_hash())

    @classmethod
    def from_dict(
        cls,
        document: Mapping[str, Any],
        *,
        hash: str | None = None,
        stored_seq: int | None = _NOT_STORED,
    ) -> Receipt:
        """Rebuild a receipt; extra keys are kept (the hash, not the parser, reports tampering).

        A store passes ``stored_seq``, the row's own ``seq`` column, which the chain check walks by.
        """
        values: dict[str, Any] = {}
        for name in _DOCUMENT_KEYS:
            if name in document:
                values[name] = document[name]
            elif name not in _OPTIONAL_KEYS:
                raise KeyError(name)
        for name in ("controls", "approvers", "budget_charges"):
            if name in values:
                values[name] = tuple(values[name] or ())
        values["extra"] = {k: v for k, v in document.items() if k not in _DOCUMENT_KEY_SET}
        return cls(**values, hash=hash, stored_seq=stored_seq)

    @classmethod
    def from_json(
        cls, text: str, *, hash: str | None = None, stored_seq: int | None = _NOT_STORED
    ) -> Receipt:
        return cls.from_dict(json.loads(text), hash=hash, stored_seq=stored_seq)


_DOCUMENT_KEYS = (
    "schema", "receipt_id", "action_id", "action", "action_hash", "principal", "resource",
    "arguments", "environment", "decision", "decision_reason", "approval_id", "approver",
    "effect_key", "attempt", "result", "execution", "would_have", "error", "started_at",
    "finished_at", "seq", "prev_hash", "policy_hash", "policy_version", "controls",
    "precondition_at_request", "precondition_at_recheck", "approvers", "authority_grant_id",
    "task", "scope_hash", "budget_charges", "hop",
)  # fmt: skip
_DOCUMENT_KEY_SET = frozenset(_DOCUMENT_KEYS)
_OPTIONAL_KEYS = frozenset(
    f.name for f in fields(Receipt) if f.default is not f.default_factory
) - {"hash", "extra", "stored_seq"}
assert len(_DOCUMENT_KEYS) == 34


@dataclass(frozen=True, slots=True)
class UnreadableReceipt:
    """A stored receipt row that could not be parsed; evidence is walked past, never dropped."""

    seq: int | None
    receipt_id: str | None
    error: str
    hash: str | None = None
    raw: str | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class ChainBreak:
    """One place where the chain does not verify."""

    name: str
    seq: int | None
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "seq": self.seq, "detail": self.detail}


@dataclass(frozen=True, slots=True)
class ChainReport:
    """What ``verify_chain`` found."""

    verified: int
    chained: int
    unchained: int
    head_seq: int | None
    head_hash: str | None
    breaks: tuple[ChainBreak, ...]

    @property
    def ok(self) -> bool:
        return not self.breaks

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "verified": self.verified,
            "chained": self.chained,
            "unchained": self.unchained,
            "head_seq": self.head_seq,
            "head_hash": self.head_hash,
            "breaks": [b.to_dict() for b in self.breaks],
        }


_SENTINEL = "<unverifiable>"


def _position(row: Receipt | UnreadableReceipt) -> int | None:
    """Where a row sits in the chain: its stored ``seq`` column when it came from a store."""
    if isinstance(row, Receipt) and row.stored_seq != _NOT_STORED:
        return row.stored_seq
    return row.seq


def verify_chain(store: Any) -> ChainReport:
    """Walk the store's receipts by stored ``seq`` and name every break in the chain."""
    rows = list(store.receipts())
    return verify_rows(rows, store.chain_head())


def verify_rows(
    rows: Iterable[Receipt | UnreadableReceipt], head: tuple[int, str] | None
) -> ChainReport:
    """The chain check over rows already read (ordered by their stored ``seq``)."""
    placed = [(_position(r), r) for r in rows]
    breaks: list[ChainBreak] = []
    unchained = [r for position, r in placed if position is None]
    chained = sorted(((p, r) for p, r in placed if p is not None), key=lambda pr: pr[0])
    if unchained:
        breaks.append(
            ChainBreak("unchained", None, f"{len(unchained)} receipt(s) have no chain position")
        )
    expected_seq, expected_prev = 1, GENESIS_HASH
    last_seq, last_hash = 0, GENESIS_HASH
    verified = 0
    for seq, row in chained:
        row_breaks: list[ChainBreak] = []
        if seq != expected_seq:
            gap = f"seq {expected_seq}" if seq == expected_seq + 1 else f"seq {expected_seq}..{seq - 1}"
            row_breaks.append(ChainBreak("missing", expected_seq, f"{gap} is not in the store"))
            expected_seq = seq
        if isinstance(row, UnreadableReceipt):
            row_breaks.append(
                ChainBreak("content_altered", seq, f"the stored receipt cannot be read: {row.error}")
            )
            breaks.extend(row_breaks)
            expected_prev = _SENTINEL
            last_seq, last_hash = seq, _SENTINEL
            expected_seq += 1
            continue
        try:
            recomputed = row.chain_hash()
        except Exception as exc:  # a document with no canonical form
            row_breaks.append(
                ChainBreak("content_altered", seq, f"the receipt has no canonical form: {exc}")
            )
            breaks.extend(row_breaks)
            expected_prev = _SENTINEL
            last_seq, last_hash = seq, _SENTINEL
            expected_seq += 1
            continue
        if not row.hash:
            row_breaks.append(ChainBreak("hash_missing", seq, "the stored hash is empty"))
        elif recomputed != row.hash:
            row_breaks.append(
                ChainBreak(
                    "content_altered",
                    seq,
                    f"receipt {row.receipt_id} hashes to {recomputed}, stored {row.hash}",
                )
            )
        if row.prev_hash != expected_prev:
            row_breaks.append(
                ChainBreak(
                    "link_broken",
                    seq,
                    f"receipt {row.receipt_id} points back to {row.prev_hash}, "
                    f"expected {expected_prev}",
                )
            )
        if not row_breaks:
            verified += 1
        breaks.extend(row_breaks)
        expected_prev = recomputed
        last_seq, last_hash = seq, recomputed
        expected_seq += 1
    if head is None:
        breaks.append(ChainBreak("head_mismatch", None, "the chain head row is missing"))
        head_seq, head_hash = None, None
    else:
        head_seq, head_hash = head
        if (head_seq, head_hash) != (last_seq, last_hash):
            breaks.append(
                ChainBreak(
                    "head_mismatch",
                    head_seq,
                    f"the head records seq {head_seq} {head_hash}, "
                    f"the receipts end at seq {last_seq} {last_hash}",
                )
            )
    return ChainReport(
        verified=verified,
        chained=len(chained),
        unchained=len(unchained),
        head_seq=head_seq,
        head_hash=head_hash,
        breaks=tuple(breaks),
    )


@runtime_checkable
class EventSink(Protocol):
    """Receives every event and receipt after the store committed it."""

    def on_event(self, event: Event) -> None: ...

    def on_receipt(self, receipt: Receipt) -> None: ...


class JSONLEventSink:
    """Appends one JSON line per record to ``receipts.jsonl`` and ``events.jsonl``."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.receipts_path = self.directory / "receipts.jsonl"
        self.events_path = self.directory / "events.jsonl"

    def _append(self, path: Path, line: str) -> None:
        data = (line + "\n").encode("utf-8")
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    def on_event(self, event: Event) -> None:
        self._append(self.events_path, event.to_json())

    def on_receipt(self, receipt: Receipt) -> None:
        self._append(self.receipts_path, receipt.to_json())
