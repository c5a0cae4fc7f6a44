"""State stores: the ``StateStore`` protocol, the in-memory store and the SQLite store.

The Postgres store (``store/postgres.py``, public as ``ctrlrun.postgres``) loads only when a URL
names it, so importing this package never needs its driver; the SQLite store (and SQLAlchemy)
loads on first use of ``SQLiteStateStore`` or a ``sqlite://`` URL.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._lazy import lazy_exports
from .._time import utc_now
from ..errors import InvalidArgument

if TYPE_CHECKING:
    from .base import StateStore
    from .memory import InMemoryStateStore
    from .sqlite import SQLiteStateStore

__all__ = ["InMemoryStateStore", "SQLiteStateStore", "StateStore", "open_default_store", "open_store_url"]

if not TYPE_CHECKING:  # type checkers see the imports above, never a catch-all __getattr__
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {"StateStore": "base", "InMemoryStateStore": "memory", "SQLiteStateStore": "sqlite"},
        __all__,
    )


def open_store_url(
    url: str, *, clock: Callable[[], datetime] = utc_now, migrate: bool = True
) -> StateStore:
    """Open the store a URL names: ``sqlite://<path>`` or ``postgresql://…[?ctrlrun_schema=…]``.

    ``postgres://`` works too; ``ctrlrun_schema`` (default ``public``) is taken out of the URL
    before it reaches the driver. ``migrate=False`` opens an existing store at the current schema
    without creating or upgrading anything (the operator commands' path).
    """
    if not isinstance(url, str) or not url.strip():
        raise InvalidArgument(f"a store URL must be a non-empty string, got {url!r}")
    if url.startswith("sqlite://"):
        path = url[len("sqlite://") :]
        if not path:
            raise InvalidArgument(f"store URL {url!r} names no file: use sqlite://<path>")
        from .sqlite import SQLiteStateStore

        return SQLiteStateStore(path, clock=clock, migrate=migrate)
    if url.startswith(("postgresql://", "postgres://")):
        from .postgres import PostgresStateStore, split_store_url

        conninfo, schema = split_store_url(url)
        return PostgresStateStore(
            conninfo, schema=schema or "public", clock=clock, migrate=migrate
        )
    raise InvalidArgument(
        f"unsupported store URL {url!r}: use sqlite://<path> or "
        "postgresql://user@host/db[?ctrlrun_schema=<name>]"
    )


def open_default_store(policy_file: Path) -> tuple[Any, Path | None]:
    """Open the default store and say where its JSONL evidence copy goes (None for Postgres)."""
    from ..settings import state_location

    url = state_location(policy_file)
    store = open_store_url(url)
    if url.startswith("sqlite://"):
        return store, Path(url[len("sqlite://") :]).parent
    return store, None
