"""ctrlrun: execution safety between an AI agent's decision to act and the call that acts."""

from importlib.metadata import PackageNotFoundError, version as _version

from ._ambient import context, idempotency_token, with_approval
from ._default import reset
from .adapter import (
    ApprovalAnswer,
    ApprovalNotAsked,
    FrameworkInterrupt,
    InterruptApprovalProvider,
    PendingApproval,
    banner,
    needs_approval,
)
from .action import Action, Principal, action_hash, canonical_bytes, canonicalize
from .approvals import (
    Approval,
    ApprovalProvider,
    ApprovalRecord,
    ApprovalRequest,
    ApprovalStatus,
    LocalApprovalProvider,
    ScriptedApprovalProvider,
)
from .control import Control, ReconcileOutcome
from .edits import grant_with_edits
from .effect import EffectRecord, EffectState, Reservation
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
from .protect import protect
from .receipt import Event, EventSink, JSONLEventSink, Receipt
from .store import InMemoryStateStore, SQLiteStateStore, StateStore

try:
    __version__ = _version("ctrlrun")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0"

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
