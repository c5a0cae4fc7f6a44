"""What the approvals need of a store: requests put, read, listed, answered and spent."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Protocol, runtime_checkable

from ..action import Action
from ..evidence.receipt import Event
from .records import Approval, ApprovalRecord, ApprovalRequest, VerifiedApprover

__all__ = ["ApprovalStore"]


@runtime_checkable
class ApprovalStore(Protocol):
    """Approval requests and their answers; each answer writes its events in its transaction."""

    def put_approval_request(self, request: ApprovalRequest) -> None: ...

    def get_approval(self, approval_id: str) -> ApprovalRecord | None: ...

    def grant_approval(
        self,
        approval_id: str,
        approver: str,
        *,
        verified: VerifiedApprover | None = None,
        edited_action: Action | None = None,
        events: Callable[[ApprovalRecord, datetime], Sequence[Event]] | None = None,
    ) -> Approval | None: ...

    def deny_approval(
        self, approval_id: str, approver: str, *, verified: VerifiedApprover | None = None,
        events: Callable[[ApprovalRecord, datetime], Sequence[Event]] | None = None,
    ) -> None: ...

    def pending_approvals(self, limit: int | None = None) -> tuple[ApprovalRecord, ...]: ...

    def consume_approval(self, approval_id: str, action_hash: str) -> Approval: ...
