"""Prune and holds as rules: the checkpoint a prune leaves, the holds that stop one, and the
order in which a prune's refusals are decided. Pure: the stores read and write the rows."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ..errors import InvalidArgument

__all__ = [
    "CHECKPOINT_SCHEMA",
    "PrunePlan",
    "PruneResult",
    "PRUNE_ACTION",
    "PRUNE_BATCH",
    "Checkpoint",
    "Hold",
    "PruneRefused",
    "parse_duration",
]

CHECKPOINT_SCHEMA = "ctrlrun.checkpoint/v1"
PRUNE_ACTION = "ctrlrun.retention.prune"
PRUNE_BATCH = 1000  # receipts a batch deletes, each batch its own short transaction
_DURATION = re.compile(r"([0-9]+)([smhd])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class PruneRefused(InvalidArgument):
    """A prune that would lose evidence, or leave the chain unverifiable: nothing was written.
    ``seq`` names the receipt the refusal is about (``None`` when it is about the range)."""

    def __init__(self, message: str, *, seq: int | None = None, reason: str = "") -> None:
        super().__init__(message)
        self.seq = seq
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Where a prune left the chain: the last deleted receipt's ``seq`` and stored ``hash``."""

    seq: int
    hash: str
    schema: str
    at: str

    def to_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "hash": self.hash, "schema": self.schema, "at": self.at}


@dataclass(frozen=True, slots=True)
class Hold:
    """Receipts ``from_seq..to_seq`` (no end: everything from ``from_seq`` on) a prune must keep,
    until a person releases the hold."""

    hold_id: str
    from_seq: int
    to_seq: int | None
    reason: str
    placed_by: str
    placed_at: str
    released_by: str | None = None
    released_at: str | None = None

    @property
    def live(self) -> bool:
        return self.released_at is None

    def covers_any(self, low: int, high: int) -> bool:
        """Whether a live hold keeps any receipt of ``low..high``."""
        return self.live and self.from_seq <= high and (self.to_seq is None or self.to_seq >= low)

    def span(self) -> str:
        return f"{self.from_seq}..{'' if self.to_seq is None else self.to_seq}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "hold_id": self.hold_id, "from_seq": self.from_seq, "to_seq": self.to_seq,
            "reason": self.reason, "placed_by": self.placed_by, "placed_at": self.placed_at,
            "released_by": self.released_by, "released_at": self.released_at,
            "live": self.live,
        }  # fmt: skip


def parse_duration(text: str) -> timedelta:
    """``90d``, ``12h``, ``30m``, ``45s``: an integer and one unit."""
    match = _DURATION.fullmatch(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise InvalidArgument(
            f"duration {text!r} is not an integer and a unit (s, m, h or d), e.g. 90d or 12h"
        )
    return timedelta(seconds=int(match.group(1)) * _UNITS[match.group(2)])


def check_hold_range(from_seq: Any, to_seq: Any) -> None:
    """A hold's range: ``from_seq`` ≥ 1 and, when given, ``to_seq`` ≥ ``from_seq``."""
    if isinstance(from_seq, bool) or not isinstance(from_seq, int) or from_seq < 1:
        raise InvalidArgument(f"a hold's from_seq must be an integer >= 1, got {from_seq!r}")
    if to_seq is not None and (isinstance(to_seq, bool) or not isinstance(to_seq, int) or to_seq < from_seq):
        raise InvalidArgument(
            f"a hold's to_seq must be an integer >= from_seq ({from_seq}), got {to_seq!r}; "
            "leave it out for an open-ended hold"
        )


def check_prune_range(through: Any, head_seq: int, checkpoint: Checkpoint | None, holds: list[Hold]) -> int:
    """The range a prune through ``through`` deletes (its first seq), or the refusal naming the
    seq: past the head, not past the checkpoint, or inside a live hold."""
    if isinstance(through, bool) or not isinstance(through, int) or through < 1:
        raise PruneRefused(f"--through must be a receipt seq >= 1, got {through!r}", reason="range")
    if through >= head_seq:
        raise PruneRefused(
            f"refusing to prune through seq {through}: the chain head is seq {head_seq}, and a "
            "prune always keeps the head (prune through a seq below it)",
            seq=through, reason="head",
        )  # fmt: skip
    first = 1 if checkpoint is None else checkpoint.seq + 1
    if checkpoint is not None and through <= checkpoint.seq:
        raise PruneRefused(
            f"refusing to prune through seq {through}: the chain was already pruned through seq "
            f"{checkpoint.seq}, and a checkpoint never moves backwards",
            seq=through, reason="checkpoint",
        )  # fmt: skip
    for hold in holds:
        if hold.covers_any(first, through):
            where = max(first, hold.from_seq)
            raise PruneRefused(
                f"refusing to prune seq {first}..{through}: hold {hold.hold_id!r} keeps seq "
                f"{hold.span()} ({hold.reason}); release it with `ctrlrun hold release --id "
                f"{hold.hold_id} --by WHO`, or prune through seq {hold.from_seq - 1}",
                seq=where, reason="hold",
            )  # fmt: skip
    return first


@dataclass(frozen=True, slots=True)
class PrunePlan:
    """A prune that passed every refusal: receipts ``first..through``, the hash it keeps."""

    first: int
    through: int
    hash: str
    head_seq: int


@dataclass(frozen=True, slots=True)
class PruneResult:
    """What a prune did: the range it deleted (all of it, unless interrupted) and its receipt."""

    first: int
    through: int
    deleted: int
    batches: int
    checkpoint: Checkpoint
    receipt_id: str

    def to_dict(self) -> dict[str, Any]:
        return {"from_seq": self.first, "through": self.through, "deleted": self.deleted,
                "batches": self.batches, "checkpoint": self.checkpoint.to_dict(),
                "receipt_id": self.receipt_id}  # fmt: skip
