"""Delegation and revocation through a Control: the checks, the record and its event, written
together; a refusal writes only its ``DELEGATION_REJECTED`` event."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .attempt import fan_out
from ..authority.ledger import CREATED_VIA, DelegationRecord
from .._time import format_ts
from ..action import Principal
from ..errors import AuthorityEscalation, IdentityError, InvalidArgument
from ..evidence.receipt import Event, EventType

if TYPE_CHECKING:
    from ..authority.resolve import Delegation, Grant
    from .wiring import Wiring

__all__ = ["delegate", "revoke"]


def _event(wiring: Wiring, type_: EventType, **data: Any) -> Event:
    return Event(type=type_, ts=format_ts(wiring.clock()), data=data)


def _reject(wiring: Wiring, parent_id: str, reason: str, dimension: str | None) -> None:
    data: dict[str, Any] = {"reason": reason, "parent_id": parent_id}
    if dimension is not None:
        data["dimension"] = dimension
    events, _ = wiring.store.record(events=[_event(wiring, EventType.DELEGATION_REJECTED, **data)])
    fan_out(wiring.sinks, events, None)


def _authority(wiring: Wiring, doing: str) -> Any:
    if wiring.authority is None:
        raise InvalidArgument(
            f"cannot {doing}: the policy {wiring.policy.source} has no authority: section; "
            "add one (schema ctrlrun.policy/v3 or later) with the grants to delegate from"
        )
    return wiring.authority


def delegate(wiring: Wiring, parent_id: str, grant: Grant, *, by: Principal, created_via: str) -> Delegation:
    """Check ``grant`` against ``parent_id`` and record it as a new ``dlg_`` delegation."""
    from ..authority.resolve import Grant, check_delegation, new_delegation_id, read_delegation

    authority = _authority(wiring, f"delegate from {parent_id!r}")
    if not isinstance(grant, Grant):
        raise InvalidArgument(
            f"delegate({parent_id!r}, ...) needs a ctrlrun.authority.Grant (see "
            f"ctrlrun.authority.grant_from_yaml), got {type(grant).__name__}"
        )
    if grant.id:
        raise InvalidArgument(
            f"the delegated grant has id {grant.id!r}: a delegation gets its dlg_ id from the "
            "Control; leave id empty"
        )
    if not isinstance(by, Principal):
        raise InvalidArgument(f"delegate(by=...) needs a Principal, got {type(by).__name__}")
    if created_via not in CREATED_VIA:
        raise InvalidArgument(f"created_via must be one of {', '.join(CREATED_VIA)}, not {created_via!r}")
    now = wiring.clock()
    if by.expires_at is not None and now > by.expires_at:
        _reject(wiring, parent_id, "principal_expired", None)
        raise IdentityError(
            f"delegation from {parent_id!r} refused: the principal {by.agent!r} expired at "
            f"{format_ts(by.expires_at)}; renew its credential before delegating"
        )
    records = wiring.store.delegations(include_revoked=True)
    try:
        depth = check_delegation(authority, records, parent_id, grant, by, now)
    except AuthorityEscalation as refusal:
        _reject(wiring, parent_id, refusal.reason, refusal.dimension)
        raise
    same = _identical_live(records, parent_id, grant.to_json(), now)
    if same is not None:
        raise InvalidArgument(
            f"delegation from {parent_id!r} refused: {same.delegation_id} (made "
            f"{format_ts(same.created_at)} by {same.created_by_agent}) already hands this exact "
            "grant on and is live; nothing was recorded. Use it, or revoke it first "
            f"(ctrlrun revoke {same.delegation_id}) to replace it"
        )
    record = DelegationRecord(
        delegation_id=new_delegation_id(), parent_id=parent_id, depth=depth,
        grant_json=grant.to_json(), created_by_agent=by.agent, created_by_user=by.user,
        created_via=created_via, created_at=now,
    )  # fmt: skip
    created = _event(
        wiring, EventType.DELEGATION_CREATED, delegation_id=record.delegation_id,
        parent_id=parent_id, depth=depth, created_by_agent=by.agent, created_by_user=by.user,
        created_via=created_via,
    )  # fmt: skip
    stored = wiring.store.put_delegation(record, events=[created])
    fan_out(wiring.sinks, stored, None)
    return read_delegation(record)


def _identical_live(records: Any, parent_id: str, grant_json: str, now: Any) -> DelegationRecord | None:
    """A delegation of the same grant from the same parent, not revoked and not expired: a
    second would only be one more thing to revoke."""
    from ..authority.resolve import read_delegation

    for record in records:
        if record.parent_id != parent_id or record.grant_json != grant_json or record.revoked_at is not None:
            continue
        expires = read_delegation(record).grant.expires_at
        if expires is None or expires > now:
            return record  # type: ignore[no-any-return]
    return None


def revoke(wiring: Wiring, delegation_id: str, *, by: str | None) -> bool:
    """Revoke one delegation; ``False`` (no event) when it was revoked already."""
    _authority(wiring, f"revoke {delegation_id!r}")
    who = "api:local" if by is None else by
    if not isinstance(who, str) or not who.strip():
        raise InvalidArgument(f"revoke(by=...) must be a non-empty string, got {by!r}")
    written: list[Event] = []

    def events(record: DelegationRecord) -> list[Event]:
        event = _event(wiring, EventType.DELEGATION_REVOKED, delegation_id=record.delegation_id, revoked_by=who)
        written[:] = [event]
        return written

    revoked = wiring.store.revoke_delegation(delegation_id, by=who, at=wiring.clock(), events=events)
    if revoked:
        fan_out(wiring.sinks, written, None)
    return revoked
