"""Which store an operator act opens, and opening it without ever creating or migrating it."""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import InvalidArgument
from ..settings import Settings
from ..store import StateStore, open_store_url

__all__ = ["Settings", "follow_up_store_option", "open_store"]

_SQLITE = "sqlite://"


def follow_up_store_option(settings: Settings, option: str | None) -> str:
    """What a printed follow-up command needs to reach the store this one read (`` --store-url
    sqlite://…``), so that it runs where it is printed even when the store was chosen by an
    inline variable; empty for the default ``./.ctrlrun/state.db`` and for a Postgres URL (its
    password is never printed: the follow-up takes it from where this command did)."""
    url = settings.store_location(option)
    if not url.startswith(_SQLITE):
        return ""
    path = Path(url[len(_SQLITE) :])
    default = Path(".ctrlrun") / "state.db"
    try:
        if path.absolute().resolve() == default.absolute().resolve():
            return ""
        shown = os.path.relpath(path.absolute(), Path.cwd())
    except (OSError, ValueError):  # another drive, an unreadable directory: the path as given
        shown = str(path)
    return f" --store-url {shlex.quote(_SQLITE + shown)}"


def _missing_database(url: str) -> InvalidArgument | None:
    path = url[len(_SQLITE) :]
    if not path or ":memory:" in path or "mode=memory" in path:
        return None  # the store refuses these with its own message
    file = Path(path).expanduser().absolute()
    if not file.exists():
        return InvalidArgument(
            f"no database at '{file}': nothing has been recorded there yet, and this command "
            "never creates a store; run a protected call first (it creates the store), or point "
            "--store-url, CTRLRUN_STORE_URL or CTRLRUN_STATE at the right file"
        )
    if not file.is_file():
        return InvalidArgument(
            f"'{file}' is not a database file; point --store-url, CTRLRUN_STORE_URL or "
            "CTRLRUN_STATE at the ctrlrun state file"
        )
    return None


def _open_read_only(url: str, settings: Settings, note: Callable[[str], None] | None) -> StateStore:
    """A SQLite store opened for reading only; a snapshot read is said through ``note``."""
    from ..store.sqlite import SQLiteStateStore

    sqlite = SQLiteStateStore(url[len(_SQLITE) :], clock=settings.clock, migrate=False, read_only=True)
    if sqlite.snapshot and note is not None:  # a SQLite store's own property, not the protocol's
        note(f"note: {sqlite.path} is read as a snapshot: SQLite cannot share it with its writers "
             "from here (it has no -shm file and its directory cannot be written), so writes made "
             "meanwhile are not seen")  # fmt: skip
    return sqlite


@contextmanager
def open_store(settings: Settings, option: str | None = None, *, read_only: bool = False,
               note: Callable[[str], None] | None = None) -> Iterator[StateStore]:  # fmt: skip
    """Open the selected store as it is (``migrate=False``) and close it afterwards;
    ``read_only`` for acts that only read (they need no write access to a SQLite file)."""
    url = settings.store_location(option)
    if url.startswith(_SQLITE):
        missing = _missing_database(url)
        if missing is not None:
            raise missing
    if read_only and url.startswith(_SQLITE):
        store = _open_read_only(url, settings, note)
    else:
        store = open_store_url(url, clock=settings.clock, migrate=False)
    try:
        yield store
    finally:
        store.close()
