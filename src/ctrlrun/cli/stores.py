"""Which store an operator command opens, and opening it without ever creating or migrating it."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import click

from .._locations import state_location
from .._time import utc_now
from ..errors import InvalidArgument
from ..store import StateStore, open_store_url
from .text import say

__all__ = ["Settings", "hint_store_option", "open_operator_store", "select_store_url", "store_url_option"]

_SQLITE = "sqlite://"
_SELECTING_VARIABLES = ("CTRLRUN_STORE_URL", "CTRLRUN_STATE", "CTRLRUN_CONFIG")


@dataclass
class Settings:
    """Per-invocation settings; tests pass their own (``obj=Settings(clock=...)``)."""

    clock: Callable[[], datetime] = field(default=utc_now)


def store_url_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """The ``--store-url`` option every command that opens the operator's store takes."""
    return click.option(
        "--store-url",
        metavar="URL",
        default=None,
        help="Store to use: sqlite://<path> or postgresql://…[?ctrlrun_schema=NAME] (default: $CTRLRUN_STORE_URL, $CTRLRUN_STATE, "
        "else .ctrlrun/state.db beside the policy).",
    )(command)


def select_store_url(option: str | None) -> str:
    """``--store-url``, else ``$CTRLRUN_STORE_URL``, else ``$CTRLRUN_STATE``, else beside the policy."""
    if option is not None:
        if not option.strip():
            raise InvalidArgument("--store-url is blank; give a store URL such as sqlite://<path>")
        return option
    for name in _SELECTING_VARIABLES:  # refused even when a higher-priority one is set
        value = os.environ.get(name)
        if value is not None and not value.strip():
            raise InvalidArgument(f"{name} is set but blank; unset it or give it a value")
    return state_location()


def hint_store_option(option: str | None) -> str:
    """What a printed follow-up command needs to reach the store this one read (`` --store-url
    sqlite://…``), so that it runs where it is printed even when the store was chosen by an
    inline variable; empty for the default ``./.ctrlrun/state.db`` and for a Postgres URL (its
    password is never printed: the follow-up takes it from where this command did)."""
    url = select_store_url(option)
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
    import shlex

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


def _open_read_only(url: str, settings: Settings) -> StateStore:
    """A SQLite store opened for reading only; a snapshot read is said on stderr."""
    from ..store.sqlite import SQLiteStateStore

    sqlite = SQLiteStateStore(url[len(_SQLITE) :], clock=settings.clock, migrate=False, read_only=True)
    if sqlite.snapshot:  # a SQLite store's own property, not the StateStore protocol's
        say(f"note: {sqlite.path} is read as a snapshot: SQLite cannot share it with its writers "
            "from here (it has no -shm file and its directory cannot be written), so writes made "
            "meanwhile are not seen", err=True)  # fmt: skip
    return sqlite


@contextmanager
def open_operator_store(settings: Settings, option: str | None, *,
                        read_only: bool = False) -> Iterator[StateStore]:  # fmt: skip
    """Open the selected store as it is (``migrate=False``) and close it afterwards;
    ``read_only`` for commands that only read (they need no write access to a SQLite file)."""
    url = select_store_url(option)
    if url.startswith(_SQLITE):
        missing = _missing_database(url)
        if missing is not None:
            raise missing
    if read_only and url.startswith(_SQLITE):
        store = _open_read_only(url, settings)
    else:
        store = open_store_url(url, clock=settings.clock, migrate=False)
    try:
        yield store
    finally:
        store.close()
