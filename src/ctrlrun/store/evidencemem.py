"""The memory store's evidence rows (the acts chain, holds, the prune checkpoint, the anchors
note) and the ``Tx`` row operations over them; a transaction's writes stay in an overlay until
it commits, as every memory write does."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..evidence.receipt import GENESIS_HASH
from ..evidence.retention import Checkpoint, Hold

__all__ = ["EvidenceData", "MemoryEvidenceRows"]

Row = dict[str, Any]


@dataclass
class EvidenceData:
    """What a memory store keeps beyond its receipts: a new store is covered from seq 1."""

    acts: list[tuple[int, str, str, str, str]] = field(default_factory=list)  # seq, kind, subject, json, hash
    head: tuple[int, str, int] = (0, GENESIS_HASH, 1)
    checkpoint: Checkpoint | None = None
    holds: dict[str, Hold] = field(default_factory=dict)
    anchors: list[tuple[str, int, str, str, str]] = field(default_factory=list)


@dataclass
class _Overlay:
    acts: list[tuple[int, str, str, str, str]]
    head: tuple[int, str, int]
    checkpoint: Checkpoint | None
    holds: dict[str, Hold]
    anchors: list[tuple[str, int, str, str, str]] = field(default_factory=list)
    deleted: set[str] = field(default_factory=set)  # receipt ids


class MemoryEvidenceRows:
    """The ``Tx`` row operations of the evidence, for the memory store's transaction."""

    _ev: _Overlay | None = None

    @property
    def _d(self) -> Any:
        """The store's ``_Data`` (receipts, effects, approvals, ledger, evidence)."""
        return self.__dict__["_data"]

    def _overlay(self) -> _Overlay:
        if self._ev is None:
            e: EvidenceData = self._d.evidence
            self._ev = _Overlay([], e.head, e.checkpoint, {})
        return self._ev

    def commit_evidence(self) -> None:
        ov = self._ev
        if ov is None:
            return
        data = self._d
        e: EvidenceData = data.evidence
        e.acts.extend(ov.acts)
        e.head, e.checkpoint = ov.head, ov.checkpoint
        e.holds.update(ov.holds)
        e.anchors.extend(ov.anchors)
        for receipt_id in ov.deleted:
            del data.receipts[receipt_id]

    # the acts chain
    def advance_acts(self) -> tuple[int, str] | None:
        ov = self._overlay()
        seq, hash, covers = ov.head
        ov.head = (seq + 1, hash, covers)
        return seq + 1, hash

    def insert_act(self, seq: int, kind: str, subject: str, text: str, hash: str) -> None:
        ov = self._overlay()
        ov.acts.append((seq, kind, subject, text, hash))
        ov.head = (ov.head[0], hash, ov.head[2])

    def acts_head(self) -> tuple[int, str, int] | None:
        return self._overlay().head if self._ev is not None else self._d.evidence.head

    def _all_acts(self) -> list[tuple[int, str, str, str, str]]:
        acts: list[tuple[int, str, str, str, str]] = self._d.evidence.acts
        return acts if self._ev is None else [*acts, *self._ev.acts]

    def acts_page(self, after: int, limit: int) -> list[tuple[int, str, str]]:
        acts = self._all_acts()
        start = max(0, min(after, len(acts)))  # act seq n sits at index n - 1
        while start > 0 and acts[start - 1][0] > after:
            start -= 1
        return [(a[0], a[3], a[4]) for a in acts[start:] if a[0] > after][:limit]

    def act_at(self, seq: int) -> tuple[str, str] | None:
        for act in self._all_acts():
            if act[0] == seq:
                return act[3], act[4]
        return None

    def acts_about(self, subjects: Sequence[str]) -> list[tuple[int, str, str]]:
        wanted = set(subjects)
        return [(a[0], a[3], a[4]) for a in self._all_acts() if a[2] in wanted]

    def acts_legacy(self) -> list[tuple[str, str, int]]:
        return []  # a memory store is always made with the acts chain

    # the checkpoint and the holds
    def checkpoint(self) -> Checkpoint | None:
        return self._overlay().checkpoint if self._ev is not None else self._d.evidence.checkpoint

    def set_checkpoint(self, checkpoint: Checkpoint) -> None:
        self._overlay().checkpoint = checkpoint

    def holds(self) -> list[Hold]:
        found = {**self._d.evidence.holds, **(self._ev.holds if self._ev else {})}
        return sorted(found.values(), key=lambda h: (h.placed_at, h.hold_id))

    def insert_hold(self, hold: Hold) -> bool:
        if any(h.hold_id == hold.hold_id for h in self.holds()):
            return False
        self._overlay().holds[hold.hold_id] = hold
        return True

    def release_hold(self, hold_id: str, by: str, at: str) -> bool:
        for hold in self.holds():
            if hold.hold_id == hold_id and hold.live:
                self._overlay().holds[hold_id] = replace(hold, released_by=by, released_at=at)
                return True
        return False

    def note_anchor(self, kind: str, seq: int, hash: str, token: str, at: str) -> None:
        self._overlay().anchors.append((kind, seq, hash, token, at))

    # the receipts a prune reads and deletes
    def _chained(self) -> list[Row]:
        gone = self._ev.deleted if self._ev is not None else ()
        rows: dict[str, Row] = self._d.receipts
        return [r for r in rows.values() if r["seq"] is not None and r["receipt_id"] not in gone]

    def receipt_at(self, seq: int) -> tuple[str, str, str, str] | None:
        for row in self._chained():
            if row["seq"] == seq:
                return row["receipt_id"], row["json"], row["prev_hash"], row["hash"]
        return None

    def delete_batch(self, through: int, limit: int) -> tuple[int, int, str] | None:
        batch = [r for r in self._chained() if r["seq"] <= through][:limit]
        if not batch:
            return None
        self._overlay().deleted.update(r["receipt_id"] for r in batch)
        return len(batch), batch[-1]["seq"], batch[-1]["hash"]

    def prune_blocker(self, name: str, low: int, high: int, **values: Any) -> tuple[Any, ...] | None:
        data = self._d
        for row in self._chained():
            if not low <= row["seq"] <= high:
                continue
            key, approval_id = row["effect_key"], row["approval_id"]
            if name == "unsettled" and key is not None:
                effect = data.effects.get(key)
                if effect is not None and effect["state"] in ("reserved", "executing", "ambiguous"):
                    return row["seq"], key, effect["state"]
            elif name == "pending" and approval_id is not None:
                approval = data.approvals.get(approval_id)
                if approval is not None and approval["status"] == "pending" and approval["expires_at"] >= values["now"]:
                    return row["seq"], approval_id
            elif name == "recent_charge" and key is not None:
                for charge in data.ledger:
                    if charge["effect_key"] == key and charge["released_at"] is None and charge["consumed_at"] >= values["since"]:
                        return row["seq"], key, charge["consumed_at"]
        return None

    def approval_receipts(self, after: int, through: int, limit: int) -> list[tuple[int, str]]:
        rows = [(r["seq"], r["json"]) for r in self._chained()
                if r["approval_id"] is not None and after < r["seq"] <= through]  # fmt: skip
        return rows[:limit]

    def resolved_effects(self, after: str, limit: int, since: int | None) -> list[tuple[Any, ...]]:
        chained = self._chained()
        last: dict[str, tuple[int, str]] = {}
        named: set[str] = set()
        for row in chained:
            if row["effect_key"] is not None:
                last[row["effect_key"]] = (row["seq"], row["result"])
                if since is not None and row["seq"] > since:
                    named.add(row["effect_key"])
        found = []
        for key in sorted(self._d.effects):
            effect = self._d.effects[key]
            if key <= after or (since is not None and key not in named):
                continue
            if effect["resolved_by"] is not None or effect["state"] in ("committed", "failed"):
                seq, result = last.get(key, (None, None))
                found.append((key, effect["attempt"], effect["resolved_by"], effect["state"], seq, result))
                if len(found) == limit:
                    break
        return found
