"""Where a load is: the source, the schema in force and container line numbers, for messages."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import PolicyError

__all__ = ["SCHEMAS", "LoadContext", "describe", "schema_name", "type_name"]

SCHEMAS: tuple[str, ...] = tuple(f"ctrlrun.policy/v{n}" for n in range(1, 9))


def schema_name(level: int) -> str:
    """The schema string of version ``level`` (1-based)."""
    return SCHEMAS[level - 1]


def type_name(value: Any) -> str:
    """A YAML-flavoured name for the type of a loaded value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "mapping"
    if isinstance(value, str):
        return "string"
    if isinstance(value, int):
        return "int"
    return type(value).__name__


def describe(value: Any, limit: int = 80) -> str:
    """``type value`` for a message, e.g. ``int 5``, ``string 'x'``, ``null``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"bool {str(value).lower()}"
    shown = repr(value)
    if len(shown) > limit:
        shown = shown[: limit - 3] + "..."
    return f"{type_name(value)} {shown}"


@dataclass
class LoadContext:
    """The state shared by the validators of one document."""

    source: str
    level: int = 0
    lines: dict[int, int] = field(default_factory=dict)
    base_dir: str | None = None

    @property
    def schema(self) -> str:
        return schema_name(self.level)

    def line_of(self, node: Any) -> int | None:
        """The line a loaded mapping or list started on, if known."""
        if isinstance(node, (dict, list)):
            return self.lines.get(id(node))
        return None

    def error(self, where: str, message: str, node: Any = None) -> PolicyError:
        """A ``PolicyError`` that starts with the source and names the place."""
        line = self.line_of(node)
        place = f"{where} (line {line})" if line and where else where
        if line and not where:
            place = f"line {line}"
        prefix = f"{self.source}: {place}: " if place else f"{self.source}: "
        return PolicyError(prefix + message)

    def gate(self, where: str, key: str, since: int, node: Any = None) -> None:
        """Refuse ``key`` when the document's schema is older than ``since``."""
        if self.level < since:
            raise self.error(
                where,
                f"key '{key}' needs schema: {schema_name(since)} or later, but this document "
                f"declares {self.schema}; raise the schema or remove '{key}'",
                node,
            )
