"""The ``StateStore`` protocol: the durable state behind a Control, as every backend offers it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol, runtime_checkable

from ..approvals import Approval, ApprovalRecord, ApprovalRequest, VerifiedApprover
from ..effect import EffectRecord, EffectState, Reservation
from ..receipt import Event, Receipt, UnreadableReceipt

__all__ = ["StateStore"]


@runtime_checkable
class StateStore(Protocol):
    """Effects, approvals, events and the receipt chain; each write decides and writes at once."""

    transactions: int

    # effects
    def reserve_effect(
        self, effect_key: str, action_id: str, lease: timedelta = ...
    ) -> Reservation: ...

    def consume_approval_and_reserve(
        self,
        approval_id: str,
        action_hash: str,
        effect_key: str,
        action_id: str,
        lease: timedelta = ...,
    ) -> tuple[Approval, Reservation]: ...

    def consume_approval(self, approval_id: str, action_hash: str) -> Approval: ...

    def begin_execution(self, effect_key: str, action_id: str) -> None: ...

    def commit_effect(self, effect_key: str, action_id: str, result: Any = None) -> None: ...

    def fail_effect(self, effect_key: str, action_id: str, error: str | None) -> None: ...

    def mark_ambiguous(self, effect_key: str, action_id: str, error: str | None) -> None: ...

    def resolve_effect(
        self, effect_key: str, state: EffectState | str, resolver: str
    ) -> EffectRecord: ...

    def extend_lease(self, effect_key: str, action_id: str, until: datetime) -> None: ...

    def get_effect(self, effect_key: str) -> EffectRecord | None: ...

    def list_effects(self, state: EffectState | str | None = None) -> tuple[EffectRecord, ...]: ...

    # approvals
    def put_approval_request(self, request: ApprovalRequest) -> None: ...

    def get_approval(self, approval_id: str) -> ApprovalRecord | None: ...

    def grant_approval(
        self, approval_id: str, approver: str, *, verified: VerifiedApprover | None = None
    ) -> Approval | None: ...

    def deny_approval(
        self, approval_id: str, approver: str, *, verified: VerifiedApprover | None = None
    ) -> None: ...

    def pending_approvals(self, limit: int | None = None) -> tuple[ApprovalRecord, ...]: ...

    def approvals_for(self, action_hash: str) -> tuple[ApprovalRecord, ...]: ...

    def find_granted_approval(self, action_hash: str) -> Approval | None: ...

    def find_denied_request(self, action_hash: str) -> ApprovalRequest | None: ...

    # evidence
    def append_event(self, event: Event) -> Event: ...

    def events(self) -> tuple[Event, ...]: ...

    def put_receipt(self, receipt: Receipt) -> Receipt: ...

    def receipts(self) -> tuple[Receipt | UnreadableReceipt, ...]: ...

    def chain_head(self) -> tuple[int, str] | None: ...

    # combined operations: one transaction each
    def start_attempt(
        self,
        *,
        action_id: str,
        effect_key: str | None,
        lease: timedelta = ...,
        approval_id: str | None = None,
        action_hash: str | None = None,
        events: Callable[[Approval | None, Reservation | None], Sequence[Event]] | None = None,
        return_events: bool = True,
    ) -> tuple[Approval | None, Reservation | None, tuple[Event, ...]]:
        """Consume the presented approval, reserve the key into ``executing``, append the events.

        Refusals raise as ``consume_approval_and_reserve`` does and write nothing but its two kept
        writes; ``events`` is called inside the transaction (maybe twice, when the store has to
        plan the start anew) and must not call the store. The stored events are handed back
        unless ``return_events`` is False (then ``()``: no id is read back).
        """
        ...

    def finish_attempt(
        self,
        *,
        effect_key: str | None,
        action_id: str,
        outcome: EffectState | str | None,
        result: Any = None,
        error: str | None = None,
        events: Sequence[Event] = (),
        receipt: Receipt | None = None,
        return_events: bool = True,
    ) -> tuple[tuple[Event, ...], Receipt | None]:
        """Write the outcome, events and receipt together; a refused outcome writes nothing. The
        stored events are handed back unless ``return_events`` is False (then ``()``)."""
        ...

    def record(
        self, *, events: Sequence[Event] = (), receipt: Receipt | None = None
    ) -> tuple[tuple[Event, ...], Receipt | None]:
        """Append events and chain a receipt in one transaction."""
        ...

    def close(self) -> None: ...
