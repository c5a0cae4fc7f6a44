"""Approvals: requests and records with their pure rules (``records``), the providers that ask, the
event an answer writes (``answers``) and approving with edits (``edits``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from .records import DEFAULT_APPROVAL_TTL, Approval, ApprovalProvider, ApprovalRecord, ApprovalRequest, ApprovalStatus, LocalApprovalProvider, ScriptedApprovalProvider, VerifiedApprover
    from .edits import grant_with_edits

_LAZY: dict[str, str] = {
    "DEFAULT_APPROVAL_TTL": "records",
    "Approval": "records",
    "ApprovalProvider": "records",
    "ApprovalRecord": "records",
    "ApprovalRequest": "records",
    "ApprovalStatus": "records",
    "LocalApprovalProvider": "records",
    "ScriptedApprovalProvider": "records",
    "VerifiedApprover": "records",
    "grant_with_edits": "edits",
}

__all__ = ["Approval", "ApprovalProvider", "ApprovalRecord", "ApprovalRequest", "ApprovalStatus", "DEFAULT_APPROVAL_TTL", "LocalApprovalProvider", "ScriptedApprovalProvider", "VerifiedApprover", "grant_with_edits"]

if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
