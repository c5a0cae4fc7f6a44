"""What policy says about one action: the decision and its evaluation (no pydantic, so light to import)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

__all__ = ["Decision", "Evaluation"]


class Decision(StrEnum):
    """What policy says about an action; ``str()`` is the value."""

    ALLOW = "allow"
    APPROVE = "approve"
    DENY = "deny"


@dataclass(frozen=True, slots=True)
class Evaluation:
    """The outcome of ``Policy.evaluate``; unpacks as ``(decision, reason, controls)``."""

    decision: Decision
    reason: str
    controls: tuple[str, ...] = ()

    def __iter__(self) -> Iterator[Any]:
        return iter((self.decision, self.reason, self.controls))
