"""The protected call: ``Control`` (the front object) and the pipeline its calls run through."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from .front import Control, ReconcileOutcome

_LAZY: dict[str, str] = {
    "Control": "front",
    "ReconcileOutcome": "front",
}

__all__ = [
    "Control",
    "ReconcileOutcome",
]

if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
