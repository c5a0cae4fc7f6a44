"""What the effects need of a store: effect records read, listed and moved by their rules."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from typing import Protocol, runtime_checkable

from ..evidence.receipt import Event
from .records import EffectRecord, EffectState

__all__ = ["EffectStore"]


@runtime_checkable
class EffectStore(Protocol):
    """Effect records: read, listed a page at a time, settled by a human or a hook, released."""

    def resolve_effect(
        self, effect_key: str, state: EffectState | str, resolver: str, *,
        events: Callable[[EffectRecord, datetime], Sequence[Event]] | None = None,
    ) -> EffectRecord: ...

    def fail_effect(self, effect_key: str, action_id: str, error: str | None) -> None:
        """Move this attempt's record to ``failed`` (releasing its budget charges)."""
        ...

    def mark_ambiguous(self, effect_key: str, action_id: str, error: str | None) -> None:
        """Move the record ``action_id`` holds to ``ambiguous`` (an execution whose lease lapsed)."""
        ...

    def get_effect(self, effect_key: str) -> EffectRecord | None: ...

    def iter_effects(
        self, state: EffectState | str | None = None, key_prefix: str | None = None,
        limit: int | None = None, *, page: int = ...,
    ) -> Iterator[EffectRecord]:  # fmt: skip
        """Effect records in creation order, a page at a time (``key_prefix`` literal)."""
        ...
