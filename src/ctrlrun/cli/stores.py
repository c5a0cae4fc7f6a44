"""The ``--store-url`` option, and the operator library's store opening as the CLI uses it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import click

from ..operator.stores import follow_up_store_option, open_store
from ..settings import Settings
from ..store import StateStore
from .text import say

__all__ = ["Settings", "hint_store_option", "open_operator_store", "select_store_url", "store_url_option"]


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
    return Settings().store_location(option)


def hint_store_option(option: str | None) -> str:
    """`` --store-url sqlite://…`` for a printed follow-up command (empty for the default store)."""
    return follow_up_store_option(Settings(), option)


def _note(line: str) -> None:
    say(line, err=True)


@contextmanager
def open_operator_store(settings: Settings, option: str | None, *,
                        read_only: bool = False) -> Iterator[StateStore]:  # fmt: skip
    """Open the selected store as it is and close it afterwards; a snapshot read is said on stderr."""
    with open_store(settings, option, read_only=read_only, note=_note) as store:
        yield store
