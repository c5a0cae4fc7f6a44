"""Receipts, events, the hash chain over receipts, and the sinks that copy them out."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from enum import StrEnum
from operator import attrgetter
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ..policy.decision import Decision
from .._time import parse_ts
from ..action import Principal
from ..action import _CANONICAL_JSON, _plain_checked, _Unplain, canonical_bytes, sha256_hex

__all__ = [
    "GENESIS_HASH",
    "RECEIPT_SCHEMA",
    "RECEIPT_SCHEMA_V7",
    "Event",
    "EventSink",
    "EventType",
    "JSONLEventSink",
    "Receipt",
    "ReceiptResult",
    "UnreadableReceipt",
    "receipt_from_row",
]

RECEIPT_SCHEMA = "ctrlrun.receipt/v8"
RECEIPT_SCHEMA_V7 = "ctrlrun.receipt/v7"  # read and verified as written; no longer written
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
    APPROVAL_EDITED = "APPROVAL_EDITED"
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
    APPROVAL_ESCALATED = "APPROVAL_ESCALATED"


_COMPACT_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _compact(document: Mapping[str, Any]) -> str:
    return _COMPACT_JSON.encode(document)


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
        if type(self.type) is not EventType:
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


@dataclass(frozen=True)
class Receipt:
    """The portable record of one finished attempt: 36 keys, in this order (v8).

    v8 is v7's 34 keys plus ``edited_from`` and ``edit_diff`` (approve with edits), both last
    and ``null`` when there was no edit. A v7 document read back keeps its 34 keys.
    """

    receipt_id: str
    action_id: str
    action: str
    action_hash: str
    principal: Principal | Mapping[str, Any]
    resource: str | None
    arguments: Mapping[str, Any]
    environment: str
    decision: Decision | str
    decision_reason: str
    approval_id: str | None
    approver: str | None
    effect_key: str | None
    attempt: int
    result: ReceiptResult | str
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
    edited_from: str | None = None
    edit_diff: Mapping[str, Any] | None = None
    schema: str = RECEIPT_SCHEMA
    hash: str | None = field(default=None, compare=False)
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    stored_seq: int | None = field(default=_NOT_STORED, compare=False, repr=False)

    def __post_init__(self) -> None:
        # result and decision as the enums they are, the principal as a Principal; a value
        # outside them (a store edited by hand) is kept as read, for the chain check to report
        values = self.__dict__
        for name, kind in (("result", ReceiptResult), ("decision", Decision)):
            value = values[name]
            if type(value) is str:
                try:
                    object.__setattr__(self, name, kind(value))
                except ValueError:
                    pass
        document = values["principal"]
        if isinstance(document, Mapping):
            principal = _principal_of(document)
            if principal is not None:
                values["_principal_document"] = document  # the hash is over the text as read
                object.__setattr__(self, "principal", principal)

    def to_dict(self) -> dict[str, Any]:
        """The document in table order (the stored hash is never part of it)."""
        return self._document()[0]

    def _document(self) -> tuple[dict[str, Any], list[Any]]:
        """``to_dict()``, and the keys whose values the canonical encoder must still check.

        A value needs no check when it is a ``str``/``int``/``bool``/``None`` or a mapping that
        ``to_dict`` parsed back from JSON without meeting a float: nothing in it can be refused
        except a lone surrogate, which the UTF-8 encode of the canonical text catches.
        """
        document: dict[str, Any] = {"schema": self.schema}
        unchecked: list[Any] = [] if type(self.schema) in _ATOMS else ["schema"]
        if self.schema == RECEIPT_SCHEMA_V7:
            body = zip(_BODY_KEYS_V7, _body_values_v7(self))
        else:
            body = zip(_BODY_KEYS, _body_values(self))
        for name, value in body:
            if name == "principal" and isinstance(value, Principal):
                value = self.__dict__.get("_principal_document") or value.to_dict()
            if name in _LIST_KEYS:
                value = [dict(v) if isinstance(v, Mapping) else v for v in value]
                if value:
                    unchecked.append(name)
            elif type(value) in _ATOMS:
                pass
            elif isinstance(value, Mapping):
                value, plain = _json_copy(value)
                if not plain:
                    unchecked.append(name)
            else:
                unchecked.append(name)
            document[name] = value
        for key, value in self.extra.items():
            if key not in document:
                document[key] = value
                unchecked.append(key)
        return document, unchecked

    def to_json(self) -> str:
        """The stored line: compact JSON, keys in table order, non-ASCII as itself."""
        written = self.__dict__.get("_json")  # the line the store wrote for this receipt
        return written if written is not None else _compact(self.to_dict())

    def chain_hash(self) -> str:
        """``sha256:`` over the canonical (sorted-key) bytes of the document."""
        return sha256_hex(_canonical(*self._document()))

    def chained(self, seq: int, prev_hash: str) -> Receipt:
        """This receipt placed at ``seq`` after ``prev_hash``, with its hash computed."""
        return self._placed(seq, prev_hash)[0]

    def _placed(self, seq: int, prev_hash: str) -> tuple[Receipt, dict[str, Any]]:
        """``chained(seq, prev_hash)`` and its ``to_dict()``, from one document (the store
        writes ``_compact`` of it, which is the placed receipt's ``to_json()``)."""
        document, unchecked = self._document()
        # to_dict() of the placed receipt: this document with seq and prev_hash replaced (an
        # extra key never overrides a field, so no extra key changes either)
        for name, value in (("seq", seq), ("prev_hash", prev_hash)):
            if type(value) not in _ATOMS:
                if isinstance(value, Mapping):
                    value = _json_copy(value)[0]
                unchecked.append(name)
            document[name] = value
        digest = sha256_hex(_canonical(document, unchecked))
        return _copy(self, seq=seq, prev_hash=prev_hash, hash=digest), document

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
    "task", "scope_hash", "budget_charges", "hop", "edited_from", "edit_diff",
)  # fmt: skip
_DOCUMENT_KEY_SET = frozenset(_DOCUMENT_KEYS)
_OPTIONAL_KEYS = frozenset(
    f.name for f in fields(Receipt) if f.default is not f.default_factory
) - {"hash", "extra", "stored_seq"}
assert len(_DOCUMENT_KEYS) == 36
_BODY_KEYS = _DOCUMENT_KEYS[1:]
_body_values = attrgetter(*_BODY_KEYS)
_BODY_KEYS_V7 = _DOCUMENT_KEYS[1:34]
_body_values_v7 = attrgetter(*_BODY_KEYS_V7)
_LIST_KEYS = frozenset(("controls", "approvers", "budget_charges"))
_ATOMS = frozenset((str, int, bool, type(None), ReceiptResult, Decision))  # exact types: never a Mapping
_FIELD_NAMES = tuple(f.name for f in fields(Receipt))
_FIELD_SET = frozenset(_FIELD_NAMES)
_field_values = attrgetter(*_FIELD_NAMES)
assert not any(f.init is False for f in fields(Receipt))


class _Float(Exception):
    pass


def _no_float(text: str) -> Any:
    raise _Float


_FLOATLESS = json.JSONDecoder(parse_float=_no_float)


def _json_copy(value: Mapping[str, Any]) -> tuple[Any, bool]:
    """``json.loads(_compact(value))``, and whether the copy holds no float."""
    try:
        return _exact_copy(value), True
    except (_Unplain, RecursionError):
        pass
    text = _compact(value)
    try:
        return _FLOATLESS.decode(text), True
    except _Float:
        return json.loads(text), False


def _exact_copy(value: Any) -> Any:
    """What the JSON round trip makes of exact ``dict`` (``str`` keys)/``list``/``tuple``/``str``/
    ``int``/``bool``/``None``, without the text; ``_Unplain`` at anything else (a float, a
    subclass, another key type), which the round trip itself then decides."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if kind is dict:
        copy = {}
        for key, item in value.items():
            if type(key) is not str:
                raise _Unplain
            copy[key] = _exact_copy(item)
        return copy
    if kind is list or kind is tuple:
        return [_exact_copy(item) for item in value]
    raise _Unplain


def _canonical(document: dict[str, Any], unchecked: list[Any]) -> bytes:
    """``canonical_bytes(document)`` checking only the ``unchecked`` keys' values (see
    ``Receipt._document``); anything refused, or odd, is left to ``canonical_bytes``."""
    try:
        plain = dict(document)
        for key in unchecked:
            if type(key) is not str:
                raise _Unplain
            plain[key] = _plain_checked(plain[key])
        return _CANONICAL_JSON.encode(plain).encode("utf-8")
    except (_Unplain, UnicodeEncodeError):
        return canonical_bytes(document)


def _copy(receipt: Receipt, **changes: Any) -> Receipt:
    """``dataclasses.replace(receipt, **changes)`` without the per-call field introspection:
    every field is an init field and ``__post_init__`` only types ``result`` and ``decision``,
    so copying the attributes (and typing those two when changed) is what ``replace`` does."""
    for name in changes:
        if name not in _FIELD_SET:
            raise TypeError(f"Receipt has no field {name!r}")
    new = object.__new__(Receipt)
    values = new.__dict__
    values.update(receipt.__dict__)
    values.pop("_json", None)  # the line written for the original, if any
    values.update(changes)
    if "principal" in changes:
        values.pop("_principal_document", None)
    if changes.keys() & {"result", "decision", "principal"}:
        new.__post_init__()
    return new


_PRINCIPAL_KEYS = frozenset(("agent", "user", "claims", "issuer", "expires_at"))


def _principal_of(document: Mapping[str, Any]) -> Principal | None:
    """The ``Principal`` a receipt's principal document stands for, when it is one exactly."""
    if not document.keys() <= _PRINCIPAL_KEYS or "agent" not in document:
        return None
    expires = document.get("expires_at")
    try:
        principal = Principal(
            document["agent"], document.get("user"), document.get("claims") or {},
            document.get("issuer"), parse_ts(expires) if isinstance(expires, str) else expires,
        )  # fmt: skip
    except Exception:  # not a principal this library could have written: kept as the mapping
        return None
    return principal if principal.to_dict() == dict(document, **{"claims": document.get("claims") or {}}) else None


@dataclass(frozen=True, slots=True)
class UnreadableReceipt:
    """A stored receipt row that could not be parsed; evidence is walked past, never dropped."""

    seq: int | None
    receipt_id: str | None
    error: str
    hash: str | None = None
    raw: str | None = field(default=None, repr=False)


@runtime_checkable
class EventSink(Protocol):
    """Receives every event and receipt after the store committed it.

    A sink may also have ``on_batch(events, receipt)``: it is then given one transaction's
    events and receipt (or ``None``) at once, instead of ``on_event``/``on_receipt``. Whatever a
    sink raises is logged and the sink still gets every later record: each event and the receipt
    are delivered on their own, so one failure skips only the record it failed on.
    """

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

    def on_batch(self, events: Sequence[Event], receipt: Receipt | None) -> None:
        """One transaction's records: all its event lines in one append, then the receipt's (also
        when the events' append failed; that failure is raised after)."""
        failed: Exception | None = None
        if events:
            try:
                self._append(self.events_path, "\n".join(event.to_json() for event in events))
            except Exception as exc:
                failed = exc
        if receipt is not None:
            self.on_receipt(receipt)
        if failed is not None:
            raise failed


def receipt_from_row(row: Mapping[str, Any]) -> Receipt | UnreadableReceipt:
    """The stored receipt with its stored hash, or an ``UnreadableReceipt`` naming the row."""
    try:
        return Receipt.from_json(row["json"], hash=row["hash"], stored_seq=row["seq"])
    except Exception as exc:
        return UnreadableReceipt(
            seq=row["seq"],
            receipt_id=row["receipt_id"],
            error=f"{type(exc).__name__}: {exc}",
            hash=row["hash"],
            raw=row["json"],
        )
