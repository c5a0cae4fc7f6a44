"""A compiled SQL statement as the driver takes it; the statement modules make them, the
execution path runs them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Compiled"]


@dataclass(frozen=True, slots=True)
class Compiled:
    """A statement as the driver takes it: ``sql`` with positional marks, ``names`` the bound
    parameter of each mark in order, ``columns`` the names of what it returns."""

    sql: str
    names: tuple[str, ...]
    columns: tuple[str, ...] = ()

    def bind(self, values: dict[str, Any]) -> tuple[Any, ...]:
        """The parameters, in mark order, from a mapping of bound names."""
        return tuple([values[name] for name in self.names])
