"""Options every listing command spells the same way: ``--json`` (JSON Lines) and the paging
pair ``--limit N`` / ``--all``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from .text import say

__all__ = ["check_paging", "json_lines_option", "more_hint", "paging_options"]

F = Callable[..., Any]


def json_lines_option(each: str) -> Callable[[F], F]:
    """``--json``: one document per line (JSON Lines), said so in ``--help``."""
    return click.option(
        "--json", "as_json", is_flag=True,
        help=f"JSON Lines: {each}, one JSON document per line (a stream, not one JSON array: "
             "read it line by line, e.g. with jq).",
    )  # fmt: skip


def paging_options(default: str) -> Callable[[F], F]:
    """``--limit N`` (the first N lines ``--all`` would print) and ``--all``; ``default`` says
    what the command prints with neither."""

    def apply(command: F) -> F:
        command = click.option("--all", "every", is_flag=True,
                               help=f"Every line, streamed ({default} without --limit or --all).")(command)  # fmt: skip
        return click.option("--limit", type=click.IntRange(min=1), metavar="N",
                            help="At most N lines: the first N that --all would print.")(command)  # fmt: skip

    return apply


def check_paging(limit: int | None, every: bool, *others: tuple[str, Any]) -> None:
    """Refuse ``--limit`` with ``--all``, and either with an option that picks its own rows."""
    if every and limit is not None:
        raise click.UsageError("give --limit N or --all, not both")
    for name, value in others:
        if value is not None and (every or limit is not None):
            raise click.UsageError(f"give {name} or --limit/--all, not both")


def more_hint(shown: int) -> None:
    """On stderr (stdout keeps the page's lines only): the default page was full."""
    say(f"(the first {shown} shown; --limit N for another page size, --all for every one)", err=True)
