"""The Postgres store's parameters written into its statements as SQL literals.

The store binds on the client (so ``BEGIN`` and ``COMMIT`` ride in the statement's message). The
values it sends are text, integers, booleans and NULL; writing those as literals here costs a
small fraction of the driver's general adaptation, which looks each value's type up on every
call. Anything else is left to the driver, as is text it would refuse (a NUL character).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .prepared import PLACEHOLDER

__all__ = ["Literals"]


def _chunks(statement: str) -> tuple[str, ...]:
    """The statement's text around its ``%s`` placeholders, ``%%`` written as ``%``."""
    chunks, current = [], []
    position = 0
    for match in PLACEHOLDER.finditer(statement):
        current.append(statement[position : match.start()])
        if match.group() == "%%":
            current.append("%")
        else:
            chunks.append("".join(current))
            current = []
        position = match.end()
    current.append(statement[position:])
    chunks.append("".join(current))
    return tuple(chunks)


def literal(value: Any) -> str | None:
    """``value`` as a Postgres literal, or ``None`` when the driver should adapt it."""
    kind = type(value)
    if kind is str:
        text: str = value
        if "\x00" in text:
            return None  # the driver refuses it, with the error the store reads
        if "\\" in text or "'" in text:
            # an escape string reads the same whatever standard_conforming_strings says
            return "E'" + text.replace("\\", "\\\\").replace("'", "''") + "'"
        return "'" + text + "'"
    if value is None:
        return "NULL"
    if kind is int:
        return int.__repr__(value) if value >= 0 else "(" + int.__repr__(value) + ")"
    if kind is bool:
        return "true" if value else "false"
    return None


class Literals:
    """Renders a statement with its parameters, each statement split once."""

    __slots__ = ("_split",)

    def __init__(self) -> None:
        self._split: dict[str, tuple[str, ...]] = {}

    def render(self, statement: str, parameters: Sequence[Any]) -> str | None:
        """The statement as the server will read it, or ``None``: the driver binds it."""
        chunks = self._split.get(statement)
        if chunks is None:
            if len(self._split) > 4096:  # statements are a fixed set; a bound, in case
                self._split.clear()
            chunks = self._split[statement] = _chunks(statement)
        if len(chunks) != len(parameters) + 1 or type(parameters) not in (tuple, list):
            return None  # the driver explains the mismatch
        out = [chunks[0]]
        for value, chunk in zip(parameters, chunks[1:]):
            text = literal(value)
            if text is None:
                return None
            out.append(text)
            out.append(chunk)
        return "".join(out)
