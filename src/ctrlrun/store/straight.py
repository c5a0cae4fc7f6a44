"""The store's side of the allowed call's straight path, written once: which calls its two writes
take (*start*: a new key reserved straight into ``executing`` with its events; *finish*: that
attempt committed with its event and receipt draft), and the values and rows they write. Each
backend supplies one primitive per write that does it in one transaction (``_start_straight``,
``_finish_straight``); a call this does not take, or one the primitive declines, goes to the
general path (``StoreOps``), whose steps decide it.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from .._time import format_precise
from ..approvals.records import Approval
from ..authority.ledger import Charge
from ..effects.records import DEFAULT_LEASE, EffectState, Reservation, new_reservation
from ..evidence.drafts import EventRow, ReceiptDraft
from ..evidence.receipt import Event, Receipt
from . import codec
from .ops import EventsFn
from .steps import _check_id, event_rows

__all__ = ["Started", "StraightWrites", "fresh_start"]

_ZERO = timedelta(0)

#: what a start hands back: (the presented approval spent, the reservation, the stored events)
Started = tuple[Approval | None, Reservation | None, tuple[Event, ...]]
#: what a finish hands back: (the stored events, the receipt placed)
Finished = tuple[tuple[Event, ...], Receipt | ReceiptDraft | None]


def fresh_start(now: datetime, effect_key: str, action_id: str, lease: timedelta, action_hash: str | None,
                events: EventsFn) -> tuple[Reservation, tuple[Any, ...], list[EventRow]]:  # fmt: skip
    """A new key's reservation at ``now``, its row's values and the start's event rows."""
    until = now + lease
    reservation = new_reservation(effect_key, action_id, 1, until)
    at = format_precise(now)  # the expiry formatted last: the start event's lease reuses it
    values = codec.fresh_effect_values(
        effect_key, EffectState.EXECUTING, action_id, format_precise(until), at, action_hash
    )  # fmt: skip
    return reservation, values, event_rows(events(None, reservation), action_id, effect_key)


class StraightWrites:
    """``start_attempt`` and ``finish_attempt`` for the allowed call, before ``StoreOps``'s in the
    method order of a store that supplies the two primitives."""

    def _start_straight(self, action_id: str, effect_key: str, lease: timedelta, action_hash: str | None,
                        events: EventsFn, return_events: bool) -> Started | None:  # fmt: skip
        """Reserve a new key into ``executing`` with the start's events (``fresh_start``); None
        when the general path must decide (nothing written)."""
        raise NotImplementedError

    def _finish_straight(self, effect_key: str, action_id: str, result: Any, rows: list[EventRow],
                         result_columns: tuple[Any, Any], draft: ReceiptDraft,
                         return_events: bool) -> Finished | None:  # fmt: skip
        """Commit the attempt the start left executing, with its event rows and the placed draft;
        None when the general path must decide (nothing written)."""
        raise NotImplementedError

    def start_attempt(
        self,
        *,
        action_id: str,
        effect_key: str | None,
        lease: timedelta = DEFAULT_LEASE,
        approval_id: str | None = None,
        action_hash: str | None = None,
        events: EventsFn | None = None,
        return_events: bool = True,
        charges: Sequence[Charge] = (),
    ) -> Started:
        if (
            approval_id is None and type(effect_key) is str and events is not None and not charges
            and type(lease) is timedelta and lease > _ZERO
        ):  # fmt: skip
            _check_id(action_id, "action_id")
            _check_id(effect_key, "effect_key")
            if action_hash is not None:
                _check_id(action_hash, "action_hash")
            started = self._start_straight(action_id, effect_key, lease, action_hash, events, return_events)
            if started is not None:
                return started
        return super().start_attempt(  # type: ignore[misc, no-any-return]
            action_id=action_id, effect_key=effect_key, lease=lease, approval_id=approval_id,
            action_hash=action_hash, events=events, return_events=return_events, charges=charges,
        )  # fmt: skip

    def finish_attempt(
        self,
        *,
        effect_key: str | None,
        action_id: str,
        outcome: EffectState | str | None,
        result: Any = None,
        error: str | None = None,
        events: Sequence[Event | EventRow] = (),
        receipt: Receipt | ReceiptDraft | None = None,
        return_events: bool = True,
    ) -> Finished:
        if (
            outcome is EffectState.COMMITTED and type(effect_key) is str and type(receipt) is ReceiptDraft
            and receipt.action_id == action_id and receipt.effect_key == effect_key
        ):  # fmt: skip
            rows = event_rows(events, action_id, effect_key)
            finished = self._finish_straight(effect_key, action_id, result, rows, codec.result_columns(result),
                                             receipt, return_events)  # fmt: skip
            if finished is not None:
                return finished
        return super().finish_attempt(  # type: ignore[misc, no-any-return]
            effect_key=effect_key, action_id=action_id, outcome=outcome, result=result,
            error=error, events=events, receipt=receipt, return_events=return_events,
        )  # fmt: skip
