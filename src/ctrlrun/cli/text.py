"""Safe printing: every human-readable line goes through ``safe``, so model-written text cannot
forge or hide output. A reader that closes the pipe early only stops the printing."""

from __future__ import annotations

import os
import sys
from typing import TextIO

import click

from ..operator.text import compact_json, safe

__all__ = [
    "compact_json", "reader_left", "reader_gone", "reset_output", "safe", "say", "say_raw", "say_prose",
]  # fmt: skip

_closed: set[str] = set()  # "out", "err": streams whose reader went away during this command


def reset_output() -> None:
    """Forget closed streams (one command invocation starts with both open)."""
    _closed.clear()


def reader_gone() -> bool:
    """True once stdout's reader closed the pipe: a listing stops there."""
    return "out" in _closed


def _silence(stream: TextIO) -> None:
    """Point a closed pipe's descriptor at the null device, so the exit flush cannot fail."""
    try:
        fd = stream.fileno()
        null = os.open(os.devnull, os.O_WRONLY)
    except (OSError, ValueError):  # not a real file (a test's buffer): nothing to flush later
        return
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)


def reader_left(*, err: bool = False) -> None:
    """Note that a stream's reader closed the pipe: write nothing more to it."""
    _closed.add("err" if err else "out")
    _silence(sys.stderr if err else sys.stdout)


def _echo(line: str, *, err: bool, color: bool | None = None) -> None:
    if ("err" if err else "out") in _closed:
        return
    try:
        click.echo(line, err=err, color=color)
    except BrokenPipeError:
        reader_left(err=err)


def say(line: str = "", *, err: bool = False) -> None:
    """Print one human-readable line, escaped."""
    _echo(safe(line), err=err)


def say_prose(line: str, *, as_json: bool) -> None:
    """A note such as ``no receipts yet``: on stderr when stdout is for programs (``--json``)."""
    say(line, err=as_json)


def say_raw(line: str) -> None:
    """Print a machine-readable (JSON) line exactly as given (``color=True``: click strips nothing)."""
    _echo(line, err=False, color=True)
