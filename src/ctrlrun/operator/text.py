"""Text an operator reads: ``safe`` escapes what a model wrote so it cannot forge or hide output,
and ``compact_json`` is the form ctrlrun stores documents in."""

from __future__ import annotations

import json
import unicodedata
from typing import Any

__all__ = ["compact_json", "safe"]

_HIDDEN = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def _escape(char: str) -> str:
    point = ord(char)
    if point <= 0xFF:
        return f"\\x{point:02x}"
    if point <= 0xFFFF:
        return f"\\u{point:04x}"
    return f"\\U{point:08x}"


def safe(value: Any) -> str:
    """``value`` as text with control, format and separator characters escaped (``\\x1b``, ``\\u202e``)."""
    text = value if isinstance(value, str) else str(value)
    if text.isprintable():  # fast path: no hidden category can be present
        return text
    return "".join(_escape(c) if unicodedata.category(c) in _HIDDEN else c for c in text)


def compact_json(value: Any) -> str:
    """Compact JSON with non-ASCII as itself, the form ctrlrun stores documents in."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
