"""Opening the default store the settings name; shared by ``Control.from_file``, the default
Control and the CLI."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..settings import policy_path, state_location

__all__ = ["open_default_store", "policy_path", "state_location"]


def open_default_store(policy_file: Path) -> tuple[Any, Path | None]:
    """Open the default store and say where its JSONL evidence copy goes (None for Postgres)."""
    from ..store import open_store_url

    url = state_location(policy_file)
    store = open_store_url(url)
    if url.startswith("sqlite://"):
        return store, Path(url[len("sqlite://") :]).parent
    return store, None
