"""Approvals: requests, records and their rules, the providers that ask, and a human's answers and edits."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from .records import DEFAULT_APPROVAL_TTL, Approval, ApprovalProvider, ApprovalRecord, ApprovalRequest, ApprovalStatus, ExpireThenRefuse, LocalApprovalProvider, ScriptedApprovalProvider, VerifiedApprover, apply_consume, apply_deny, apply_grant, build_request, check_answerable, check_consumable

_LAZY: dict[str, str] = {
    "DEFAULT_APPROVAL_TTL": "records",
    "Approval": "records",
    "ApprovalProvider": "records",
    "ApprovalRecord": "records",
    "ApprovalRequest": "records",
    "ApprovalStatus": "records",
    "ExpireThenRefuse": "records",
    "LocalApprovalProvider": "records",
    "ScriptedApprovalProvider": "records",
    "VerifiedApprover": "records",
    "apply_consume": "records",
    "apply_deny": "records",
    "apply_grant": "records",
    "build_request": "records",
    "check_answerable": "records",
    "check_consumable": "records",
}

__all__ = [
    "Approval",
    "ApprovalProvider",
    "ApprovalRecord",
    "ApprovalRequest",
    "ApprovalStatus",
    "DEFAULT_APPROVAL_TTL",
    "ExpireThenRefuse",
    "LocalApprovalProvider",
    "ScriptedApprovalProvider",
    "VerifiedApprover",
    "apply_consume",
    "apply_deny",
    "apply_grant",
    "build_request",
    "check_answerable",
    "check_consumable",
]

if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
