"""Where the default wiring finds its policy file and its store (from the environment and the
working directory), and opening that store; shared by ``Control.from_file``, the default Control
and the CLI."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .errors import InvalidArgument, PolicyError

__all__ = ["open_default_store", "policy_path", "state_location"]


def _env(name: str) -> str | None:
    value = os.environ.get(name)
    if value is not None and not value.strip():
        raise InvalidArgument(f"{name} is set but blank; unset it or give it a value")
    return value


def policy_path(path: str | os.PathLike[str] | None = None) -> Path:
    """The policy file: ``path``, else ``$CTRLRUN_CONFIG``, else ``./ctrlrun.yaml`` (absolute)."""
    if path is None:
        value = os.environ.get("CTRLRUN_CONFIG")
        if value is not None and not value.strip():
            raise PolicyError("CTRLRUN_CONFIG is set but blank; unset it or name the policy file")
        path = value or "ctrlrun.yaml"
    return Path(path).expanduser().absolute()


def state_location(policy_file: Path | None = None) -> str:
    """The store URL to use: ``$CTRLRUN_STORE_URL``, ``$CTRLRUN_STATE``, else next to the policy."""
    url = _env("CTRLRUN_STORE_URL")
    if url is not None:
        return url
    state = _env("CTRLRUN_STATE")
    if state is not None:
        if state.strip() == ":memory:" or "mode=memory" in state:
            raise InvalidArgument(
                "CTRLRUN_STATE names an in-memory database, which processes cannot share; "
                "give it a file path"
            )
        return "sqlite://" + str(Path(state).expanduser().absolute())
    policy_file = policy_file if policy_file is not None else policy_path()
    return "sqlite://" + str(policy_file.parent / ".ctrlrun" / "state.db")


def open_default_store(policy_file: Path) -> tuple[Any, Path | None]:
    """Open the default store and say where its JSONL evidence copy goes (None for Postgres)."""
    from .store import open_store_url

    url = state_location(policy_file)
    store = open_store_url(url)
    if url.startswith("sqlite://"):
        return store, Path(url[len("sqlite://") :]).parent
    return store, None
