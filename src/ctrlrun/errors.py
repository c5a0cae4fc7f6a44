"""The exception hierarchy: every error ctrlrun raises on purpose is a ``CTRLRunError``.

Three kinds a caller acts on differently, and the executor's own signals::

    CTRLRunError
    ├── Refusal              the call may not run (now): nothing of it ran
    │   ├── ActionDenied ── AuthorityDenied
    │   ├── ApprovalRequired, ApprovalTimeout, ApprovalMismatch
    │   ├── DuplicateEffect, AmbiguousEffect
    │   ├── AuthorityEscalation
    │   └── IdentityError
    ├── UsageError           the code or its configuration is wrong: fix it, then call again
    │   ├── InvalidArgument (also a ValueError), PolicyError, EffectKeyError
    │   └── MissingDependency (also an ImportError)
    ├── StoreError           the store failed: the message says what it kept
    │   ├── StoreUnavailable     unreachable, busy, timed out or rolled back: nothing was kept
    │   ├── AmbiguousWrite       a write could not be confirmed (after read-back and retries)
    │   ├── ClockSkew            this host's clock and the server's disagree: time is not judged
    │   └── SchemaMismatch       the store's schema is not one this build knows
    ├── NotExecuted          raised by a protected function: the remote provably did nothing
    └── Suspended            raised by a protected function to hold its effect (not built yet)
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "CTRLRunError",
    "Refusal",
    "UsageError",
    "StoreError",
    "StoreUnavailable",
    "InvalidArgument",
    "PolicyError",
    "EffectKeyError",
    "ActionDenied",
    "AuthorityDenied",
    "AuthorityEscalation",
    "BudgetExhausted",
    "ApprovalRequired",
    "ApprovalTimeout",
    "ApprovalMismatch",
    "DuplicateEffect",
    "AmbiguousEffect",
    "AmbiguousWrite",
    "NotExecuted",
    "Suspended",
    "IdentityError",
    "SchemaMismatch",
    "MissingDependency",
    "ClockSkew",
]


class CTRLRunError(Exception):
    """Base class of every error ctrlrun raises on purpose."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message if message is not None else self._default_message())

    def _default_message(self) -> str:
        return type(self).__name__

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle as type, message and attributes (subclasses take required keyword-only
        arguments, which ``Exception``'s own reduction would drop): a refusal raised in another
        process, or stored by a durable engine, comes back as itself."""
        return (_rebuild, (type(self), self.args, dict(self.__dict__)))


def _rebuild(cls: type[CTRLRunError], args: tuple[Any, ...], state: dict[str, Any]) -> CTRLRunError:
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class Refusal(CTRLRunError):
    """The call may not run, or not yet; nothing of it ran (the subclass says why)."""


class UsageError(CTRLRunError):
    """The calling code or its configuration is wrong; the message names the fix."""


class StoreError(CTRLRunError):
    """The store failed; the message says what it kept and what to do."""


class StoreUnavailable(StoreError):
    """The store could not take this write or read (unreachable, busy, a timeout, rolled back
    by the server): nothing of it was kept, so doing it again is safe."""


class InvalidArgument(UsageError, ValueError):
    """A value or wiring that ctrlrun cannot accept (the message names it and the fix)."""


class PolicyError(UsageError):
    """A policy file is missing, unreadable or malformed."""


class EffectKeyError(UsageError):
    """The effect-key template cannot be rendered from this call's arguments."""


class ActionDenied(Refusal):
    """The action may not run; ``reason`` says why (``rule[1]``, ``unknown_action``, ...)."""

    def __init__(
        self, message: str | None = None, *, reason: str, action_id: str | None = None
    ) -> None:
        self.reason = reason
        self.action_id = action_id
        super().__init__(message)

    def _default_message(self) -> str:
        if self.action_id:
            return f"action {self.action_id} denied: {self.reason}"
        return f"action denied: {self.reason}"


class AuthorityDenied(ActionDenied):
    """The authority model refused the action."""

    def __init__(
        self,
        message: str | None = None,
        *,
        reason: str,
        action_id: str | None = None,
        grant_id: str | None = None,
        delegation_id: str | None = None,
    ) -> None:
        self.grant_id = grant_id
        self.delegation_id = delegation_id
        super().__init__(message, reason=reason, action_id=action_id)


class BudgetExhausted(ActionDenied):
    """A budget of the grant that passed has no room for this call (``reason="budget_exhausted"``).

    A plain denial of authority that passed: it names the grant, the metric and the window,
    never the amount left.
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        grant_id: str,
        metric: str,
        window: int,
        action_id: str | None = None,
    ) -> None:
        self.grant_id = grant_id
        self.metric = metric
        self.window = window
        super().__init__(message, reason="budget_exhausted", action_id=action_id)

    def _default_message(self) -> str:
        subject = f"action {self.action_id}" if self.action_id else "action"
        return (
            f"{subject} denied: budget_exhausted: grant {self.grant_id!r} has no {self.metric} "
            f"left for this call in its {self.window}s window; nothing was reserved or charged: "
            "wait for the window to roll, or ask for a grant with a larger budget"
        )


class AuthorityEscalation(Refusal):
    """A delegation tried to widen its parent grant."""

    def __init__(
        self,
        message: str | None = None,
        *,
        reason: str,
        parent_id: str | None = None,
        dimension: str | None = None,
    ) -> None:
        self.reason = reason
        self.parent_id = parent_id
        self.dimension = dimension
        super().__init__(message)

    def _default_message(self) -> str:
        return f"delegation refused: {self.reason}"


class ApprovalRequired(Refusal):
    """The policy wants a human: approve ``request_id``, then present it with ``with_approval``."""

    def __init__(
        self,
        message: str | None = None,
        *,
        request_id: str,
        action_id: str | None = None,
        action_hash: str | None = None,
    ) -> None:
        self.request_id = request_id
        self.action_id = action_id
        self.action_hash = action_hash
        super().__init__(message)

    def _default_message(self) -> str:
        return (
            f"approval required: request {self.request_id} is pending; "
            f"run `ctrlrun approve {self.request_id}`, then retry inside "
            f"ctrlrun.with_approval({self.request_id!r})"
        )


class ApprovalTimeout(Refusal):
    """Nobody answered the approval request before its deadline."""

    def __init__(self, message: str | None = None, *, request_id: str) -> None:
        self.request_id = request_id
        super().__init__(message)

    def _default_message(self) -> str:
        return f"approval request {self.request_id} was not answered in time"


class ApprovalMismatch(Refusal):
    """A presented (or answered) approval does not authorize this exact action.

    With ``reason="edited"`` the human approved other arguments: ``approved_arguments`` holds
    them, and re-issuing the call with exactly those under the same approval runs it once.
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        reason: str,
        approval_id: str | None = None,
        approved_arguments: Any = None,
    ) -> None:
        self.reason = reason
        self.approval_id = approval_id
        self.approved_arguments = approved_arguments
        super().__init__(message)

    def _default_message(self) -> str:
        return f"approval {self.approval_id or '?'} refused: {self.reason}"


class DuplicateEffect(Refusal):
    """The effect key is already committed, or held by a live reservation (``in_progress``).

    ``replayable``: the key was committed by an attempt of this same action (same action hash)
    and its result was stored exactly, so ``result`` is what that attempt returned; otherwise
    ``result`` is ``None``. A caller (a durable engine's replay, say) may hand it back instead of
    running the effect again."""

    def __init__(
        self, message: str | None = None, *, state: str, effect_key: str | None = None,
        replayable: bool = False, result: Any = None,
    ) -> None:  # fmt: skip
        self.state = state
        self.effect_key = effect_key
        self.replayable = replayable
        self.result = result if replayable else None
        super().__init__(message)

    def _default_message(self) -> str:
        if self.state == "committed":
            return f"effect {self.effect_key!r} already committed; it will not run again"
        return f"effect {self.effect_key!r} is held by another attempt ({self.state})"


class AmbiguousEffect(Refusal):
    """The effect's outcome is unknown; a retry is refused until it is resolved."""

    def __init__(
        self,
        message: str | None = None,
        *,
        effect_key: str | None = None,
        action_id: str | None = None,
    ) -> None:
        self.effect_key = effect_key
        self.action_id = action_id
        super().__init__(message)

    def _default_message(self) -> str:
        return (
            f"effect {self.effect_key!r} may already have happened (AMBIGUOUS); "
            f"find out, then run `ctrlrun resolve {self.effect_key} --committed` or `--failed`"
        )


class AmbiguousWrite(StoreError):
    """A store write could not be confirmed: whether the store kept it is unknown after reading
    it back (and, for an outcome, retrying it until a deadline). Not an ``AmbiguousEffect``.

    From a protected call's start the function was not run; from its outcome write the function
    ran, and the message says so, names ``effect_key`` and the next step (``ctrlrun resolve``).
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        effect_key: str | None = None,
        action_id: str | None = None,
    ) -> None:
        self.effect_key = effect_key
        self.action_id = action_id
        super().__init__(message)


class NotExecuted(CTRLRunError):
    """Raised by a protected function to state that the remote provably did nothing."""


class Suspended(CTRLRunError):
    """Raised by an executor to hold its effect across round trips (not built yet)."""

    def __init__(self, message: str | None = None, *, continuation: Any = None) -> None:
        self.continuation = continuation
        super().__init__(message)


class IdentityError(Refusal):
    """A credential was offered and rejected, or the principal expired."""


class SchemaMismatch(StoreError):
    """The store's schema is not one this build knows."""

    def __init__(
        self,
        message: str | None = None,
        *,
        applied: tuple[str, ...] = (),
        known: tuple[str, ...] = (),
        running: str | None = None,
    ) -> None:
        self.applied = tuple(applied)
        self.known = tuple(known)
        self.running = running
        super().__init__(message)

    def _default_message(self) -> str:
        return (
            f"the store's migrations {list(self.applied)} are not ones ctrlrun {self.running} "
            f"knows ({list(self.known)}): it was written by another program or version; point "
            "ctrlrun at another path, or open it with the program that wrote it"
        )


class MissingDependency(UsageError, ImportError):
    """An optional extra is not installed."""

    def __init__(self, message: str | None = None, *, module: str, extra: str) -> None:
        self.module = module
        self.extra = extra
        super().__init__(message)

    def _default_message(self) -> str:
        return (
            f"{self.module} is not installed: run pip install '.[{self.extra}]' from the root of "
            "your ctrlrun clone (the 'ctrlrun' on PyPI is another project)"
        )


class ClockSkew(StoreError):
    """This host's clock and the store server's disagree by more than the store allows, so it
    refuses the writes that judge time (leases, approval expiry) until they agree again."""

    def __init__(
        self,
        message: str | None = None,
        *,
        host: str | None = None,
        server: str | None = None,
        skew: float | None = None,
        limit: float | None = None,
    ) -> None:
        self.host = host
        self.server = server
        self.skew = skew
        self.limit = limit
        super().__init__(message)

    def _default_message(self) -> str:
        return (
            f"the clock of host {self.host or '?'} is {self.skew or 0:.1f} s off the clock of "
            f"the store server {self.server or '?'} (at most {self.limit or 0:g} s allowed), so "
            "leases and approval expiry cannot be judged: synchronise this host's clock (NTP), "
            "or raise max_clock_skew"
        )
