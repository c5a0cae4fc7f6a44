"""The per-process default Control built from ``ctrlrun.yaml``, cached until its inputs change."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from ..settings import default_inputs, policy_path

if TYPE_CHECKING:
    from .front import Control

__all__ = ["cached_control", "default_control", "reset"]

_lock = threading.Lock()
_cached: tuple[tuple[Any, ...], Control] | None = None


def default_control() -> Control:
    """The process-wide Control from ``ctrlrun.yaml``, rebuilt when its inputs change."""
    global _cached
    from .front import Control

    key = default_inputs()
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
    if cached is not None and cached[0] == default_inputs():
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
