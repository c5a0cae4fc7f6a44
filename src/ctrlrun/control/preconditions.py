"""Preconditions: the fingerprint of the state a human approved, taken when the request is made
and taken again before the approval is spent.

Only fingerprints and an exception's type name leave this module: never the provider's state,
never an exception's message.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .attempt import Attempt
from .options import check_provider
from .steps import Carried, Steps, call
from ..action import Action, canonical_bytes, sha256_hex
from ..approvals.records import check_consumable
from ..errors import ActionDenied, ApprovalMismatch, InvalidArgument
from ..evidence.receipt import EventType

if TYPE_CHECKING:
    from .wiring import Wiring

__all__ = [
    "PRECONDITION_REASONS",
    "PRECONDITION_SCHEMA",
    "Preconditions",
    "check_provider",
    "consumed_data",
    "fingerprint",
    "invalidated_data",
    "recheck",
    "request_fingerprint",
]

PRECONDITION_SCHEMA = "ctrlrun.precondition/v1"
PRECONDITION_REASONS = frozenset(
    {"precondition_changed", "precondition_missing", "precondition_unavailable"}
)

Preconditions = Callable[[Action], Mapping[str, Any]]


def fingerprint(state: Any) -> str:
    """``"sha256:"`` + hex SHA-256 of the canonical ``{"schema", "state"}`` document; a state that
    is not a mapping, or that canonicalization refuses, raises ``InvalidArgument``."""
    if not isinstance(state, Mapping):
        raise InvalidArgument(
            f"a precondition provider must return a mapping, not a {type(state).__name__}"
        )
    return sha256_hex(canonical_bytes({"schema": PRECONDITION_SCHEMA, "state": state}))


def _take(provider: Preconditions, action: Action) -> Steps[tuple[str | None, str | None]]:
    """``(fingerprint, None)``, or ``(None, <exception type name>)`` when the provider raised or
    answered something that cannot be fingerprinted; a ``BaseException`` propagates."""
    try:
        state = yield call(provider, action)
    except Carried as carried:  # a GeneratorExit from the provider: not a provider failure
        raise carried.original from None
    except Exception as exc:
        return None, type(exc).__name__
    if inspect.iscoroutine(state):  # an async provider on a synchronous call: never awaited
        state.close()
    try:
        return fingerprint(state), None
    except Exception as exc:
        return None, type(exc).__name__


def request_fingerprint(
    wiring: Wiring, attempt: Attempt, provider: Preconditions | None
) -> Steps[dict[str, str]]:
    """The keyword a new request is made with (``{}`` without a provider); a failing provider
    denies the call, recorded with a ``denied`` receipt, before any request exists."""
    if provider is None:
        return {}
    taken, error = yield from _take(provider, attempt.action)
    if taken is not None:
        return {"precondition_fingerprint": taken}
    action = attempt.action
    attempt.event(EventType.ACTION_DENIED, reason="precondition_unavailable", error=error)
    yield from wiring.record(
        attempt,
        attempt.receipt(
            "denied",
            f"the precondition provider failed ({error}); no approval was requested "
            "(precondition_unavailable)",
        ),
    )
    raise ActionDenied(
        f"action {action.name!r} denied: its precondition provider failed ({error}), so no "
        "approval was requested; make the provider return the resource's state as a mapping "
        "of JSON values (no floats) and call again",
        reason="precondition_unavailable",
        action_id=action.action_id,
    )


def recheck(
    wiring: Wiring, attempt: Attempt, approval_id: str, provider: Preconditions | None
) -> Steps[None]:
    """Before the store spends ``approval_id``: the ordinary checks on a fresh read (a refusal
    raises, the provider uncalled), then the state now against the state approved; a
    precondition refusal raises ``ApprovalMismatch`` and writes nothing (the caller records it)."""
    action = attempt.action
    attempt.precondition_at_request = attempt.precondition_at_recheck = None
    attempt.precondition_error = None
    record = yield call(wiring.store.get_approval, approval_id)
    now = getattr(wiring.store, "clock", wiring.clock)()  # as the consuming call judges expiry
    kept = check_consumable(record, approval_id, action.action_hash, now, action_id=action.action_id)
    if kept is not None or record is None:
        return  # expired: the consuming call refuses it (and marks it expired)
    stored = record.request.precondition_fingerprint
    attempt.precondition_at_request = stored
    if provider is None and stored is None:
        return
    if provider is None:
        raise _refused(
            approval_id, "precondition_missing",
            "it was granted for a recorded state of the resource, but this call has no "
            "preconditions= provider to recheck it; pass the provider the request was made with",
        )  # fmt: skip
    if stored is None:
        raise _refused(
            approval_id, "precondition_missing",
            "it was granted without a recorded state of the resource, but this call has a "
            "preconditions= provider; ask for a new approval through the provider",
        )  # fmt: skip
    taken, error = yield from _take(provider, action)
    attempt.precondition_at_recheck = taken
    if taken is None:
        attempt.precondition_error = error
        raise _refused(
            approval_id, "precondition_unavailable",
            f"the precondition provider failed ({error}), so the state could not be rechecked; "
            "fix the provider and call again (the approval stays granted)",
        )  # fmt: skip
    if taken != stored:
        raise _refused(
            approval_id, "precondition_changed",
            "the resource's state changed since the human approved it; ask for a new approval, "
            "or call again once the state is back (the approval stays granted until it expires)",
        )  # fmt: skip


def _refused(approval_id: str, reason: str, why: str) -> ApprovalMismatch:
    return ApprovalMismatch(f"approval {approval_id} refused ({reason}): {why}", reason=reason,
                            approval_id=approval_id)  # fmt: skip


def invalidated_data(attempt: Attempt, reason: str) -> dict[str, Any]:
    """What an ``APPROVAL_INVALIDATED`` event of a precondition refusal adds to its data."""
    if reason not in PRECONDITION_REASONS:
        return {}
    data: dict[str, Any] = {
        "precondition_at_request": attempt.precondition_at_request,
        "precondition_at_recheck": attempt.precondition_at_recheck,
    }
    if attempt.precondition_error is not None:
        data["error"] = attempt.precondition_error
    return data


def consumed_data(attempt: Attempt) -> dict[str, Any]:
    """What ``APPROVAL_CONSUMED`` adds beside the approver: both fingerprints, when rechecked."""
    if attempt.precondition_at_request is None and attempt.precondition_at_recheck is None:
        return {}
    return {
        "precondition_at_request": attempt.precondition_at_request,
        "precondition_at_recheck": attempt.precondition_at_recheck,
    }
