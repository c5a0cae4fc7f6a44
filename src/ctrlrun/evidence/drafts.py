"""Evidence as the stores write it: event rows, and the allowed call's receipt draft, written
once from pre-encoded parts (its line and hash are byte for byte what ``Receipt`` gives)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..action import _CANONICAL_JSON, sha256_hex
from ..action import _json_str as _json_text
from .receipt import _COMPACT_JSON, _DOCUMENT_KEYS, Event, EventType, Receipt

__all__ = ["EventRow", "ReceiptDraft", "Writer", "event_from_row", "receipt_formats", "writer"]


EventRow = tuple[str, str, "str | None", "str | None", "str | None", str]
"""An event as the store keeps it: ``(ts, type, action_id, effect_key, approval_id, data_json)``."""

Writer = Callable[[Mapping[str, str]], str]
"""One form of a receipt draft's document: the values' JSON texts by key → the whole text."""


def event_from_row(row: Sequence[Any], event_id: int | None) -> Event:
    """The ``Event`` a stored row stands for (built only when someone asks for objects)."""
    event = object.__new__(Event)
    put = object.__setattr__
    put(event, "type", EventType(row[1]))
    put(event, "ts", row[0])
    put(event, "action_id", row[2])
    put(event, "effect_key", row[3])
    put(event, "approval_id", row[4])
    put(event, "data", json.loads(row[5]))
    put(event, "event_id", event_id)
    return event


class ReceiptDraft:
    """A receipt written from pre-encoded parts, before the chain places it.

    ``values`` holds each varying key's JSON text; ``formats`` writes the whole document from
    them, keys in table order and sorted, the constant keys already written (two ``Writer``:
    ``receipt_formats``, or ``writer``). The store sets ``seq`` and ``prev_hash`` (``place``); the stored line
    and the hash are then exactly what a ``Receipt`` with the same values gives. A ``Receipt``
    object is made only when someone asks (a sink).
    """

    __slots__ = ("values", "formats", "receipt_id", "action_id", "effect_key", "result",
                 "finished_at", "approval_id", "line", "hash")  # fmt: skip

    def __init__(
        self, values: dict[str, str], formats: tuple[Writer, Writer], *, receipt_id: str,
        action_id: str, effect_key: str | None, result: str, finished_at: str,
        approval_id: str | None = None,
    ) -> None:  # fmt: skip
        self.values = values
        self.formats = formats
        self.receipt_id = receipt_id
        self.action_id = action_id
        self.effect_key = effect_key
        self.result = result
        self.finished_at = finished_at
        self.approval_id = approval_id
        self.line: str | None = None
        self.hash: str | None = None

    def place(self, seq: int, prev_hash: str) -> tuple[str, str]:
        """Put the receipt at ``seq`` after ``prev_hash``: its stored line and its hash."""
        values = self.values
        values["seq"] = str(int(seq))
        values["prev_hash"] = _json_text(prev_hash)
        line, canonical = self.formats
        self.line = line(values)
        self.hash = sha256_hex(canonical(values).encode("utf-8"))
        return self.line, self.hash

    def pieces(self) -> tuple[str, ...]:
        """The stored line and the canonical text with everything but ``seq`` and ``prev_hash``
        written: ``(l0, l1, l2, c0, c1, c2)`` such that the line is ``l0 + seq + l1 + prev_hash
        + l2`` and the canonical text ``c0 + prev_hash + c1 + seq + c2`` (a store that places
        the receipt itself, in one statement, joins them)."""
        values = self.values
        values["seq"], values["prev_hash"] = "\x00", "\x01"  # JSON text never holds these raw
        line, canonical = (form(values) for form in self.formats)
        l0, rest = line.split("\x00")
        l1, l2 = rest.split("\x01")
        c0, rest = canonical.split("\x01")
        c1, c2 = rest.split("\x00")
        return l0, l1 + '"', '"' + l2, c0 + '"', '"' + c1, c2

    def receipt(self) -> Receipt:
        """The placed receipt as an object (its ``to_json()`` is the stored line)."""
        assert self.line is not None, "a draft becomes a receipt once placed"
        built = Receipt.from_json(self.line, hash=self.hash)
        object.__setattr__(built, "_json", self.line)
        return built




def receipt_formats(constants: Mapping[str, Any]) -> tuple[Writer, Writer]:
    """The two forms of a ``ReceiptDraft``, compiled: ``constants`` (key: value) written as
    JSON, every other key of the current schema a slot for its JSON text."""

    def body(keys: Iterable[str], encode: Any, suffix: str) -> str:
        parts = []
        for key in keys:
            if key in constants:
                value = encode(constants[key]).replace("%", "%%")
            else:  # an object's text differs between the two forms: a slot for each
                value = f"%({key}{suffix if key in _OBJECT_KEYS else ''})s"
            parts.append(f"{_json_text(key)}:{value}")
        return "{" + ",".join(parts) + "}"

    return (
        writer(body(_DOCUMENT_KEYS, _COMPACT_JSON.encode, ""), compiled=True),
        writer(body(sorted(_DOCUMENT_KEYS), _CANONICAL_JSON.encode, "_sorted"), compiled=True),
    )


_SLOT = re.compile(r"%\((\w+)\)s|%%")


def writer(form: str, *, compiled: bool = False) -> Writer:
    """The ``Writer`` of a ``%``-format whose slots are ``%(key)s``: ``form % values`` itself,
    or (``compiled``, for forms kept and written many times) a function that joins the texts
    in one f-string, about six times faster. Its source holds only names (the slots' keys are
    identifiers, the constant texts are bound to it as values), never any text of the form."""
    if not compiled:
        return form.__mod__
    texts, keys, start, current = [], [], 0, ""
    for found in _SLOT.finditer(form):
        current += form[start : found.start()]
        start = found.end()
        if found.group(1) is None:
            current += "%"
            continue
        key = found.group(1)
        if not key.isidentifier():  # pragma: no cover - the slots are the schema's own keys
            raise ValueError(f"receipt slot {key!r} is not a name")
        texts.append(current)
        keys.append(key)
        current = ""
    texts.append(current + form[start:])
    names = [f"t{i}" for i in range(len(texts))]
    pieces = [f"{{{names[0]}}}"] + [f"{{v['{key}']}}{{{name}}}" for key, name in zip(keys, names[1:])]
    source = f"def make({', '.join(names)}):\n    return lambda v: f\"\"\"{''.join(pieces)}\"\"\"\n"
    namespace: dict[str, Any] = {}
    exec(compile(source, "<ctrlrun receipt form>", "exec"), namespace)
    made: Writer = namespace["make"](*texts)
    return made


_OBJECT_KEYS = frozenset(("principal",))  # the slots whose canonical text has its keys sorted
