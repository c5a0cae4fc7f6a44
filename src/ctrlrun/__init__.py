"""ctrlrun: execution safety between an AI agent's decision to act and the call that acts.

Importing the package is light: each public name loads its module on first use, so SQLAlchemy,
pydantic, YAML and the extras load only when a store is opened, a policy loaded or the CLI run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_exports
from .protect import protect  # eager: ``ctrlrun.protect`` is the decorator, never the submodule

if TYPE_CHECKING:
    from .control.ambient import context, idempotency_token, with_approval
    from .control.default import reset
    from .adapter import (
        ApprovalAnswer, ApprovalNotAsked, FrameworkInterrupt, InterruptApprovalProvider,
        PendingApproval, banner, needs_approval,
    )  # fmt: skip
    from .action import (
        Action,
        Principal,
        action_hash,
        canonical_bytes,
        canonicalize,
    )
    from .approvals.records import (
        Approval,
        ApprovalProvider,
        ApprovalRecord,
        ApprovalRequest,
        ApprovalStatus,
        LocalApprovalProvider,
        ScriptedApprovalProvider,
    )
    from .control.front import Control, ReconcileOutcome
    from .approvals.edits import grant_with_edits
    from .effects.records import EffectRecord, EffectState, Reservation
    from .errors import (
        ActionDenied,
        AmbiguousEffect,
        AmbiguousWrite,
        ApprovalMismatch,
        ApprovalRequired,
        ApprovalTimeout,
        AuthorityDenied,
        AuthorityEscalation,
        BudgetExhausted,
        ClockSkew,
        CTRLRunError,
        Refusal,
        StoreError,
        StoreUnavailable,
        UsageError,
        DuplicateEffect,
        EffectKeyError,
        IdentityError,
        InvalidArgument,
        MissingDependency,
        NotExecuted,
        PolicyError,
        SchemaMismatch,
        Suspended,
    )
    from .identity import IdentityProvider, StaticIdentityProvider
    from .policy import Decision, Evaluation, Policy
    from .evidence.receipt import (
        Event,
        EventSink,
        JSONLEventSink,
        Receipt,
    )
    from .store import InMemoryStateStore, SQLiteStateStore, StateStore
    from ._version import __version__

# Public name -> the submodule that defines it; read by ``__getattr__`` on first use.
_LAZY: dict[str, str] = {
    "__version__": "_version",
    "context": "control.ambient",
    "idempotency_token": "control.ambient",
    "with_approval": "control.ambient",
    "reset": "control.default",
    "ApprovalAnswer": "adapter",
    "ApprovalNotAsked": "adapter",
    "FrameworkInterrupt": "adapter",
    "InterruptApprovalProvider": "adapter",
    "PendingApproval": "adapter",
    "banner": "adapter",
    "needs_approval": "adapter",
    "Action": "action",
    "Principal": "action",
    "action_hash": "action",
    "canonical_bytes": "action",
    "canonicalize": "action",
    "Approval": "approvals.records",
    "ApprovalProvider": "approvals.records",
    "ApprovalRecord": "approvals.records",
    "ApprovalRequest": "approvals.records",
    "ApprovalStatus": "approvals.records",
    "LocalApprovalProvider": "approvals.records",
    "ScriptedApprovalProvider": "approvals.records",
    "Control": "control.front",
    "ReconcileOutcome": "control.front",
    "grant_with_edits": "approvals.edits",
    "EffectRecord": "effects.records",
    "EffectState": "effects.records",
    "Reservation": "effects.records",
    "ActionDenied": "errors",
    "AmbiguousEffect": "errors",
    "AmbiguousWrite": "errors",
    "ApprovalMismatch": "errors",
    "ApprovalRequired": "errors",
    "ApprovalTimeout": "errors",
    "AuthorityDenied": "errors",
    "AuthorityEscalation": "errors",
    "BudgetExhausted": "errors",
    "ClockSkew": "errors",
    "CTRLRunError": "errors",
    "Refusal": "errors",
    "StoreError": "errors",
    "StoreUnavailable": "errors",
    "UsageError": "errors",
    "DuplicateEffect": "errors",
    "EffectKeyError": "errors",
    "IdentityError": "errors",
    "InvalidArgument": "errors",
    "MissingDependency": "errors",
    "NotExecuted": "errors",
    "PolicyError": "errors",
    "SchemaMismatch": "errors",
    "Suspended": "errors",
    "IdentityProvider": "identity",
    "StaticIdentityProvider": "identity",
    "Decision": "policy",
    "Evaluation": "policy",
    "Policy": "policy",
    "Event": "evidence.receipt",
    "EventSink": "evidence.receipt",
    "JSONLEventSink": "evidence.receipt",
    "Receipt": "evidence.receipt",
    "InMemoryStateStore": "store",
    "SQLiteStateStore": "store",
    "StateStore": "store",
}


__all__ = [
    "Action",
    "ActionDenied",
    "AmbiguousEffect",
    "AmbiguousWrite",
    "Approval",
    "ApprovalAnswer",
    "ApprovalMismatch",
    "ApprovalNotAsked",
    "ApprovalProvider",
    "ApprovalRecord",
    "ApprovalRequest",
    "ApprovalRequired",
    "ApprovalStatus",
    "ApprovalTimeout",
    "AuthorityDenied",
    "AuthorityEscalation",
    "BudgetExhausted",
    "CTRLRunError",
    "ClockSkew",
    "Refusal",
    "StoreError",
    "StoreUnavailable",
    "UsageError",
    "Control",
    "Decision",
    "DuplicateEffect",
    "EffectKeyError",
    "EffectRecord",
    "EffectState",
    "Evaluation",
    "Event",
    "EventSink",
    "FrameworkInterrupt",
    "IdentityError",
    "IdentityProvider",
    "InMemoryStateStore",
    "InterruptApprovalProvider",
    "InvalidArgument",
    "JSONLEventSink",
    "LocalApprovalProvider",
    "MissingDependency",
    "NotExecuted",
    "PendingApproval",
    "Policy",
    "PolicyError",
    "Principal",
    "Receipt",
    "ReconcileOutcome",
    "Reservation",
    "SQLiteStateStore",
    "SchemaMismatch",
    "ScriptedApprovalProvider",
    "StateStore",
    "StaticIdentityProvider",
    "Suspended",
    "__version__",
    "action_hash",
    "banner",
    "canonical_bytes",
    "canonicalize",
    "context",
    "grant_with_edits",
    "idempotency_token",
    "needs_approval",
    "protect",
    "reset",
    "with_approval",
]

if not TYPE_CHECKING:  # type checkers see the imports above, never a catch-all __getattr__
    __getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
