"""Server-side prepared statements for the Postgres store's writes (``prepared=True``).

A statement compiled for psycopg's client-side binding (``%s`` placeholders) becomes ``PREPARE
name AS ...`` once per connection and ``EXECUTE name(%s, ...)`` after, so the server plans it
once instead of on every call. The name is a digest of the text: the same statement on the same
connection always has the same name, and another schema's statement another one.
"""

from __future__ import annotations

import hashlib
import re

__all__ = ["MISSING_PREPARED", "PLACEHOLDER", "Prepared", "prepare_form"]

#: the SQLSTATE of EXECUTE naming a statement the server does not know (invalid_sql_statement_name)
MISSING_PREPARED = "26000"
#: a client-side binding placeholder, or an escaped percent sign
PLACEHOLDER = re.compile(r"%%|%s")
_PREPARABLE = ("WITH", "INSERT", "UPDATE", "DELETE", "SELECT", "VALUES")


def prepare_form(statement: str) -> tuple[str, str] | None:
    """``(PREPARE message, EXECUTE template)`` for a data statement, or ``None`` for one that
    cannot be prepared (anything but a query or a data-modifying statement)."""
    verb = statement.lstrip().split(None, 1)[0].upper() if statement.strip() else ""
    if verb not in _PREPARABLE:
        return None
    count = 0

    def numbered(match: re.Match[str]) -> str:
        nonlocal count
        if match.group() == "%%":
            return "%"  # the PREPARE message is sent without parameters: no escaping
        count += 1
        return f"${count}"

    body = PLACEHOLDER.sub(numbered, statement)
    name = "ctrlrun_" + hashlib.sha256(statement.encode()).hexdigest()[:20]
    execute = f"EXECUTE {name}({', '.join(['%s'] * count)})" if count else f"EXECUTE {name}"
    return f"PREPARE {name} AS {body}", execute


class Prepared:
    """The statements prepared on one driver connection: statement text → what to send instead."""

    __slots__ = ("known",)

    def __init__(self) -> None:
        self.known: dict[str, str] = {}

    def forget(self) -> None:
        """The server no longer holds them (a pooler reset the session): prepare again."""
        self.known.clear()
