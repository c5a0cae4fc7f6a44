"""What the receipts of a window say the policy did, or would have done.

Each observed receipt counts by the first refusal enforce mode would have raised
(``would_have.blocked_reason``); each enforced one by what it was (denied by reason, blocked,
ambiguous). The two are counted apart: a store keeps both kinds after a switch of mode.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from .._time import format_ts, parse_ts
from ..errors import InvalidArgument
from ..evidence.receipt import Receipt

__all__ = ["parse_since", "tally"]

_RELATIVE = re.compile(r"([1-9][0-9]*)([mhd])")
_UNITS = {"m": "minutes", "h": "hours", "d": "days"}
#: blocked reasons that enforce mode would have recorded as a ``denied`` receipt
_DENIED_PREFIXES = ("rule[", "authority_", "budget_")
_DENIED = frozenset({"principal_expired", "no_authority", "decision", "unknown_action",
                     "no_matching_rule", "approval_denied"})  # fmt: skip


def parse_since(value: str, now: datetime) -> datetime:
    """``--since``: an ISO 8601 time with an offset, or ``<n>m``, ``<n>h``, ``<n>d`` before now."""
    relative = _RELATIVE.fullmatch(value.strip())
    if relative:
        return now - timedelta(**{_UNITS[relative.group(2)]: int(relative.group(1))})
    try:
        moment = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        moment = None
    if moment is None or moment.utcoffset() is None:
        raise InvalidArgument(
            f"{value!r} is not a time: give an ISO 8601 time with an offset "
            "(2026-12-01T00:00:00Z) or a span before now (30m, 12h, 7d)"
        )
    return moment


def _denied_reason(reason: str) -> bool:
    return reason in _DENIED or reason.startswith(_DENIED_PREFIXES)


def tally(receipts: Iterable[Receipt], *, mode: str, since: datetime | None, ledger_rows: int) -> dict[str, Any]:
    """The stats document (``ctrlrun.stats/v1``) for the receipts finished at or after ``since``.

    Observed receipts and enforced ones are counted apart whatever the policy's mode is now (a
    store keeps both after a switch): the ``would_have_*`` keys and their ``*_by_reason`` count
    observed receipts only; ``enforced`` counts what was really denied and blocked;
    ``ambiguous_outcomes`` counts both."""
    denied: dict[str, int] = {}
    blocked: dict[str, int] = {}
    enforced_denied: dict[str, int] = {}
    approval = ambiguous = enforced_ambiguous = enforced_blocked = observed = actions = 0
    first = last = None
    for receipt in receipts:
        if since is not None and parse_ts(receipt.finished_at) < since:
            continue
        actions += 1
        first = receipt.finished_at if first is None or receipt.finished_at < first else first
        last = receipt.finished_at if last is None or receipt.finished_at > last else last
        if receipt.result == "observed":
            observed += 1
            reason = (receipt.would_have or {}).get("blocked_reason")
            ambiguous += receipt.execution == "ambiguous"
            if reason is None:
                continue
            if reason == "approval_required":
                approval += 1
            elif _denied_reason(reason):
                denied[reason] = denied.get(reason, 0) + 1
            else:
                blocked[reason] = blocked.get(reason, 0) + 1
        elif receipt.result == "denied":
            enforced_denied[receipt.decision_reason] = enforced_denied.get(receipt.decision_reason, 0) + 1
        elif receipt.result == "blocked":
            enforced_blocked += 1
        elif receipt.result == "ambiguous":
            enforced_ambiguous += 1
    return {
        "schema": "ctrlrun.stats/v1",
        "mode": mode,
        "since": None if since is None else format_ts(since),
        "from": first,
        "to": last,
        "actions": actions,
        "ledger_rows": ledger_rows,
        "would_have_been_denied": sum(denied.values()),
        "denied_by_reason": dict(sorted(denied.items())),
        "would_have_needed_approval": approval,
        "would_have_been_blocked": sum(blocked.values()),
        "blocked_by_reason": dict(sorted(blocked.items())),
        "ambiguous_outcomes": ambiguous + enforced_ambiguous,
        "observed": {"actions": observed, "ambiguous_outcomes": ambiguous},
        "enforced": {
            "actions": actions - observed,
            "denied": sum(enforced_denied.values()),
            "denied_by_reason": dict(sorted(enforced_denied.items())),
            "blocked": enforced_blocked,
            "ambiguous_outcomes": enforced_ambiguous,
        },
    }
