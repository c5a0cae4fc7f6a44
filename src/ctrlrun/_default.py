"""Where the default Control finds its policy and its store, and the per-process cache of it."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import InvalidArgument, PolicyError

if TYPE_CHECKING:
    from .control import Control

__all__ = ["cached_control", "default_control", "open_default_store", "policy_path", "reset", "state_location"]

_ENV_KEYS = ("CTRLRUN_CONFIG", "CTRLRUN_STATE", "CTRLRUN_STORE_URL", "CTRLRUN_ENVIRONMENT")


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


_lock = threading.Lock()
_cached: tuple[tuple[Any, ...], Control] | None = None


def _fingerprint() -> tuple[Any, ...]:
    return (*(os.environ.get(k) for k in _ENV_KEYS), os.getcwd())


def default_control() -> Control:
    """The process-wide Control from ``ctrlrun.yaml``, rebuilt when its inputs change."""
    global _cached
    from .control import Control

    key = _fingerprint()
    with _lock:
        if _cached is not None and _cached[0] == key:
            return _cached[1]
        control = Control.from_file(policy_path())
        previous, _cached = _cached, (key, control)
    if previous is not None:
        _close(previous[1])
    return control


def cached_control() -> Control | None:
    """The cached default Control if its inputs have not changed, else None (nothing is built)."""
    cached = _cached
    if cached is not None and cached[0] == _fingerprint():
        return cached[1]
    return None


def reset() -> None:
    """Drop the cached default Control (the next protected call builds it again)."""
    global _cached
    with _lock:
        previous, _cached = _cached, None
    if previous is not None:
        _close(previous[1])


def _close(control: Control) -> None:
    close = getattr(control.store, "close", None)
    if close is not None:
        try:
            close()
        except Exception:
            pass
