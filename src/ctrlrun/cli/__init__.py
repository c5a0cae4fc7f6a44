"""The ``ctrlrun`` command line: click commands that call the library, never the tables."""

from __future__ import annotations

import sys

from .app import cli

__all__ = ["cli", "main"]


def main() -> None:
    """Console-script entry point."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            try:
                reconfigure(errors="backslashreplace")
            except Exception:  # a replaced stream; print as it allows
                pass
    cli.main(prog_name="ctrlrun")
