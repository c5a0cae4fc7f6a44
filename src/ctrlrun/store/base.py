"""The ``StateStore`` protocol: what ``Control``, the approval providers and the CLI call, made of
each capability's own store protocol (``EffectStore``, ``ApprovalStore``, ``RecordStore``,
``AuthorityStore``) and the two writes of a protected call that span them.

Nothing else is in it, so a backend (or a test double) needs only these methods. Every ctrlrun
store also has the rest of the store API (the single effect transitions, the approval finders,
``events``, ``put_receipt``, ``transactions``) from their shared implementation, ``StoreOps``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, Protocol, runtime_checkable

from ..approvals.records import Approval
from ..approvals.store import ApprovalStore
from ..authority.ledger import Charge
from ..authority.store import AuthorityStore
from ..effects.records import EffectState, Reservation
from ..effects.store import EffectStore
from ..evidence.drafts import EventRow, ReceiptDraft
from ..evidence.receipt import Event, Receipt
from ..evidence.store import RecordStore

__all__ = ["StateStore"]


@runtime_checkable
class StateStore(EffectStore, ApprovalStore, RecordStore, AuthorityStore, Protocol):
    """Effects, approvals, events and the receipt chain; each write decides and writes at once.

    Who calls what: ``Control`` runs a call through ``start_attempt``, ``finish_attempt`` and
    ``record``, and reads ``get_approval`` and ``get_effect``; an approved call without an effect
    key spends its approval with ``consume_approval``, a reconcile hook settles an effect with
    ``resolve_effect``, and an attempt refused by its ceiling is released with ``fail_effect``. The approval providers ask and answer with ``put_approval_request``,
    ``get_approval``, ``grant_approval`` and ``deny_approval``. The operator commands list
    a page at a time (``pending_approvals``, ``iter_effects``, ``iter_receipts``,
    ``last_receipts``, ``iter_receipts_since``; ``receipts`` and ``chain_head`` to verify the
    chain), look one story up by index for ``inspect`` (``receipts_for``, ``events_for``),
    answer and resolve (each answer writing its event in its own transaction, ``events=``), and
    ``close`` the store. Authority keeps its delegations here (``put_delegation``,
    ``get_delegation``, ``delegations``, ``delegations_for``, ``revoke_delegation``), charges
    budgets with the reservation (``start_attempt(charges=...)``) and reads the ledger back
    (``consumptions``).
    """

    # combined operations: one transaction each
    def start_attempt(
        self,
        *,
        action_id: str,
        effect_key: str | None,
        lease: timedelta = ...,
        approval_id: str | None = None,
        action_hash: str | None = None,
        events: Callable[[Approval | None, Reservation | None], Sequence[Event | EventRow]]
        | None = None,
        return_events: bool = True,
        charges: Sequence[Charge] = (),
    ) -> tuple[Approval | None, Reservation | None, tuple[Event, ...]]:
        """Consume the presented approval, reserve the key into ``executing``, take the
        charges, append the events.

        Refusals raise as ``consume_approval_and_reserve`` does and write nothing but its two kept
        writes; ``events`` is called inside the transaction (maybe twice, when the store has to
        plan the start anew) and must not call the store; it may answer ``Event`` objects or
        rows (``EventRow``). The stored events are handed back unless ``return_events`` is
        False (then ``()``: no id is read back, no object made).

        ``charges`` (they need an effect key) are checked only once the reservation table
        granted the key, each against the un-released ledger rows of its grant and metric
        within its window by the store's clock; the first that does not fit raises
        ``BudgetExhausted`` and nothing is written (the approval stays granted). Else their
        rows are written with the reservation, held by its attempt.
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
        events: Sequence[Event | EventRow] = (),
        receipt: Receipt | ReceiptDraft | None = None,
        return_events: bool = True,
    ) -> tuple[tuple[Event, ...], Receipt | ReceiptDraft | None]:
        """Write the outcome, events and receipt together; a refused outcome writes nothing. The
        stored events are handed back unless ``return_events`` is False (then ``()``); a
        ``ReceiptDraft`` comes back placed."""
        ...

    def close(self) -> None: ...
