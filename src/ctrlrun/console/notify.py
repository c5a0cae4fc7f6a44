"""The console's notifier: tells webhooks about new pending requests and ambiguous effects, and
escalates requests left pending, reading the store on a timer (never on the protected call).

Each (subject, kind, target) is claimed once in the store's ``notifications`` table before it is
sent, however many consoles run on the store; delivery is at-least-once (retried with backoff
for 24 hours, each attempt's result kept on the row); the receiver de-duplicates by delivery id.
Escalation writes ``APPROVAL_ESCALATED`` with its claim and never answers the request.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from .._time import format_precise, format_ts, parse_ts, utc_now
from ..action import new_id
from ..approvals.records import ApprovalRecord
from ..effects.records import EffectState
from ..errors import CTRLRunError, InvalidArgument, MissingDependency
from ..evidence.receipt import Event, EventType
from ..store import open_store_url
from ..store.notifications import Notification, NotificationRows
from .notify_body import (
    APPROVAL_ESCALATED,
    APPROVAL_REQUESTED,
    EFFECT_AMBIGUOUS,
    FORMATS,
    effect_facts,
    link,
    render,
    request_facts,
    signature,
)
from .settings import NotifySettings

__all__ = ["DeliveryResult", "Notifier", "POLL_SECONDS", "start_notifier"]

log = logging.getLogger("ctrlrun.console")

POLL_SECONDS = 2.0  # at most 5 s between two reads of the store
RETRY_FOR = timedelta(hours=24)
HOLD = timedelta(seconds=60)  # an attempt's sender holds the row this long (then anyone retries)
FIRST_BACKOFF, MAX_BACKOFF = 10.0, 3600.0
NO_EVENT_GRACE = timedelta(seconds=30)  # a request without APPROVAL_REQUESTED is told after this
SEND_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class DeliveryResult:
    """One POST's outcome: ``status`` is the HTTP status, or the network error's description."""

    ok: bool
    status: str


Sender = Callable[[str, bytes, dict[str, str]], DeliveryResult]


def _httpx_sender() -> tuple[Sender, Callable[[], None]]:
    """A sender posting with httpx (and how to close its client)."""
    try:
        import httpx
    except ImportError:
        raise MissingDependency(module="httpx", extra="console") from None
    client = httpx.Client(timeout=SEND_TIMEOUT, follow_redirects=False, trust_env=False)

    def send(url: str, body: bytes, headers: dict[str, str]) -> DeliveryResult:
        try:
            response = client.post(url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            return DeliveryResult(False, f"error: {type(exc).__name__}: {exc}"[:500])
        return DeliveryResult(200 <= response.status_code < 300, str(response.status_code))

    return send, client.close


def _check(settings: NotifySettings) -> None:
    if settings.format not in FORMATS:
        raise InvalidArgument(
            f"--webhook-format {settings.format!r} is not one of {', '.join(FORMATS)}"
        )
    for url in (*settings.webhooks, *filter(None, [settings.escalate_webhook])):
        if not url.startswith(("http://", "https://")):
            raise InvalidArgument(f"webhook {url!r} is not an http:// or https:// URL; give one")
    if (settings.escalate_after is None) != (settings.escalate_webhook is None):
        raise InvalidArgument(
            "--escalate-after and --escalate-webhook go together: give both or neither"
        )
    if settings.escalate_after is not None and settings.escalate_after <= 0:
        raise InvalidArgument(f"--escalate-after must be positive, got {settings.escalate_after}s")


def backoff(attempts: int) -> timedelta:
    """The wait after the ``attempts``-th failed attempt: doubling from 10 s, at most an hour."""
    return timedelta(seconds=min(FIRST_BACKOFF * 2 ** max(attempts - 1, 0), MAX_BACKOFF))


class Notifier:
    """One console's notifier over a store: ``tick()`` is one pass (tests call it, a thread
    calls it every ``POLL_SECONDS``); ``clock`` decides every time it judges."""

    def __init__(
        self, store: Any, settings: NotifySettings, *, clock: Callable[[], datetime] = utc_now,
        sender: Sender | None = None,
    ) -> None:  # fmt: skip
        _check(settings)
        self.settings = settings
        self.clock = clock
        self._store = store
        self.rows = NotificationRows(store)
        self._close_sender: Callable[[], None] = lambda: None
        if sender is None:
            sender, self._close_sender = _httpx_sender()
        self._send = sender
        self._known: set[tuple[str, str, str]] = set()  # claims seen: never claimed again here

    def close(self) -> None:
        self._close_sender()

    # -- one pass

    def tick(self) -> None:
        """Claim and send what is new, escalate what waited too long, retry what is due."""
        now = self.clock()
        pending = self._store.pending_approvals()
        if self.settings.webhooks:
            self._requested(pending, now)
            self._ambiguous(now)
        if self.settings.escalate_webhook is not None:
            self._escalate(pending, now)
        for row in self.rows.take_due(now, now + HOLD):
            self._deliver(row)

    def _unknown(self, wanted: Iterable[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
        """The claims in ``wanted`` that neither this notifier nor the store has yet."""
        fresh = [claim for claim in wanted if claim not in self._known]
        if fresh:
            self._known |= self.rows.claimed(s for s, _, _ in fresh)
        return [claim for claim in fresh if claim not in self._known]

    def _requested(self, pending: tuple[ApprovalRecord, ...], now: datetime) -> None:
        by_id = {record.approval_id: record for record in pending}
        wanted = [(i, APPROVAL_REQUESTED, t) for i in by_id for t in self.settings.webhooks]
        todo = self._unknown(wanted)
        if not todo:
            return
        keys = self.rows.requested_effect_keys({s for s, _, _ in todo})
        for subject, kind, target in todo:
            record = by_id[subject]
            if subject not in keys and now < record.request.created_at + NO_EVENT_GRACE:
                continue  # its APPROVAL_REQUESTED event is written just after the request
            facts = request_facts(record, keys.get(subject))
            self._claim_and_send(subject, kind, target, facts, now)

    def _ambiguous(self, now: datetime) -> None:
        effects = {f"{r.effect_key}#{r.attempt}": r for r in self._store.list_effects(EffectState.AMBIGUOUS)}
        wanted = [(s, EFFECT_AMBIGUOUS, t) for s in effects for t in self.settings.webhooks]
        for subject, kind, target in self._unknown(wanted):
            key = effects[subject].effect_key
            facts = effect_facts(key, self.rows.latest_receipt(key))
            self._claim_and_send(subject, kind, target, facts, now)

    def _escalate(self, pending: tuple[ApprovalRecord, ...], now: datetime) -> None:
        after = self.settings.escalate_after
        target = self.settings.escalate_webhook
        assert after is not None and target is not None
        due = {r.approval_id: r for r in pending
               if now >= r.request.created_at + timedelta(seconds=after)}  # fmt: skip
        todo = self._unknown((i, APPROVAL_ESCALATED, target) for i in due)
        if not todo:
            return
        keys = self.rows.requested_effect_keys({s for s, _, _ in todo})
        for subject, kind, _ in todo:
            record = due[subject]
            facts = request_facts(record, keys.get(subject))
            event = Event(
                type=EventType.APPROVAL_ESCALATED, ts=format_ts(now),
                action_id=record.request.action.action_id, effect_key=keys.get(subject),
                approval_id=subject,
                data={"request_id": subject, "after_s": after, "target": target},
            )  # fmt: skip
            self._claim_and_send(subject, kind, target, facts, now, event=event)

    def _claim_and_send(
        self, subject: str, kind: str, target: str, facts: dict[str, Any], now: datetime,
        event: Event | None = None,
    ) -> None:  # fmt: skip
        delivery_id = new_id("dlv")
        url = link(kind, facts, self.settings.base_url)
        body = render(kind, delivery_id, facts, url, self.settings.format)
        won = self.rows.claim(
            delivery_id=delivery_id, subject_id=subject, kind=kind, target=target, body=body,
            now=now, hold_until=now + HOLD, event=event,
            while_pending=subject if kind == APPROVAL_ESCALATED else None,
        )  # fmt: skip
        self._known.add((subject, kind, target))
        if won:
            self._deliver(self._claimed_row(delivery_id, subject, kind, target, body, now))

    @staticmethod
    def _claimed_row(delivery_id: str, subject: str, kind: str, target: str, body: str,
                     now: datetime) -> Notification:  # fmt: skip
        stamp = format_precise(now)
        return Notification(delivery_id, subject, kind, target, body, stamp, 0, None, None,
                            None, None)  # fmt: skip

    # -- delivery

    def _deliver(self, row: Notification) -> None:
        """One attempt, its result kept on the row (the next attempt due, or none)."""
        body = row.body.encode("utf-8")
        headers = {"Content-Type": "application/json", "X-Ctrlrun-Delivery": row.delivery_id}
        if self.settings.secret is not None:
            headers["X-Ctrlrun-Signature"] = signature(body, self.settings.secret)
        result = self._send(row.target, body, headers)
        at = self.clock()
        attempts = row.attempts + 1
        next_at: datetime | None = None
        if not result.ok:
            deadline = parse_ts(row.created_at) + RETRY_FOR
            if at < deadline:
                next_at = min(at + backoff(attempts), deadline)
            log.warning("webhook %s for %s %s answered %s (attempt %d)%s", row.target, row.kind,
                        row.subject_id, result.status, attempts,
                        "" if next_at else "; giving up after 24 hours")  # fmt: skip
        self.rows.record_attempt(row.delivery_id, status=result.status, at=at,
                                 delivered=result.ok, next_attempt_at=next_at)  # fmt: skip


def start_notifier(
    store_url: str, settings: NotifySettings, *, clock: Callable[[], datetime] = utc_now,
    interval: float = POLL_SECONDS,
) -> Callable[[], None]:  # fmt: skip
    """Open the store (never creating or migrating it), run a ``Notifier`` in a background
    thread every ``interval`` seconds, and answer the function that stops it and closes all."""
    if not 0 < interval <= 5:
        raise InvalidArgument(f"the notifier's interval must be in (0, 5] seconds, got {interval}")
    store = open_store_url(store_url, clock=clock, migrate=False)
    try:
        notifier = Notifier(store, settings, clock=clock)
    except BaseException:
        store.close()
        raise
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            try:
                notifier.tick()
            except CTRLRunError as exc:
                log.warning("the notifier's pass failed (%s); it tries again", exc)
            except Exception:  # a bug must not end notifications silently
                log.exception("the notifier's pass failed unexpectedly; it tries again")
            stop.wait(interval)

    thread = threading.Thread(target=run, name="ctrlrun-notifier", daemon=True)
    thread.start()

    def stop_notifier() -> None:
        stop.set()
        thread.join()
        notifier.close()
        store.close()

    return stop_notifier
