"""The console's notifier against a real HTTP receiver, on SQLite and on Postgres: one signed
delivery per event and target, retries with a stable delivery id, escalation once, and one
claim when two notifiers (two OS processes) share a Postgres store. Time is a ``FakeClock``."""

from __future__ import annotations

import hashlib
import hmac
import json
import multiprocessing
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import ctrlrun
from ctrlrun.approvals.records import ApprovalStatus
from ctrlrun.console.notify import Notifier, backoff, start_notifier
from ctrlrun.console.settings import NotifySettings
from ctrlrun.errors import InvalidArgument
from ctrlrun.evidence.receipt import EventType
from ctrlrun.store import open_store_url
from ctrlrun.store.notifications import NotificationRows

from ..conftest import FakeClock, create_pg_schema, drop_pg_schema, postgres_url
from ..policies import REFUND_POLICY
from ._receiver import Receiver

SECRET = "s3cr3t-ünï"
BODY_KEYS = ["type", "id", "request_id", "action", "agent", "user", "environment",
             "effect_key", "expires_at", "url"]  # fmt: skip


def settings(*webhooks: str, fmt: str = "json", after: float | None = None,
             escalate: str | None = None, base_url: str | None = "https://console.example") -> NotifySettings:  # fmt: skip
    return NotifySettings(webhooks=webhooks, format=fmt, secret=SECRET.encode("utf-8"),
                          escalate_after=after, escalate_webhook=escalate, base_url=base_url)  # fmt: skip


def _sqlite_url(tmp_path: Path) -> Iterator[str]:
    yield f"sqlite://{tmp_path / 'state.db'}"


def _postgres_url(tmp_path: Path) -> Iterator[str]:
    url = postgres_url()
    schema = create_pg_schema(url)
    yield f"{url}?ctrlrun_schema={schema}"
    drop_pg_schema(url, schema)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    factory = _sqlite_url if request.param == "sqlite" else _postgres_url
    yield from factory(tmp_path)


@pytest.fixture
def pg_store_url(tmp_path: Path) -> Iterator[str]:
    yield from _postgres_url(tmp_path)


class Agents:
    """A store created the way a protected call creates it, and a refund the policy may send
    to a human; ``lose_reply`` makes the next call ambiguous."""

    def __init__(self, url: str, clock: FakeClock) -> None:
        self.store = open_store_url(url, clock=clock)
        self.clock = clock
        control = ctrlrun.Control(ctrlrun.Policy.from_yaml(REFUND_POLICY), self.store,
                                  clock=clock, environment="production")  # fmt: skip
        self.lose_reply = False

        @ctrlrun.protect("stripe.refund", effect="refund:{payment_id}", control=control)
        def refund(payment_id: str, amount: int) -> str:
            if self.lose_reply:
                raise TimeoutError("reply lost")
            return "ok"

        self.refund = refund

    def request(self, payment_id: str = "txn_1", user: str | None = "alice") -> str:
        with ctrlrun.context(agent="support-agent", user=user):
            with pytest.raises(ctrlrun.ApprovalRequired) as required:
                self.refund(payment_id=payment_id, amount=123_456)
        return required.value.request_id

    def ambiguous(self, payment_id: str = "txn_9") -> str:
        self.lose_reply = True
        with ctrlrun.context(agent="support-agent"):
            with pytest.raises(TimeoutError):
                self.refund(payment_id=payment_id, amount=1_000)
        self.lose_reply = False
        return f"refund:{payment_id}"

    def events(self, kind: EventType) -> list[Any]:
        return [e for e in self.store.events() if e.type is kind]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def agents(store_url: str, clock: FakeClock) -> Iterator[Agents]:
    world = Agents(store_url, clock)
    yield world
    world.store.close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as running:
        yield running


@pytest.fixture
def notifiers(store_url: str, clock: FakeClock) -> Iterator[Any]:
    """Make notifiers over the store as a console opens it (never migrating); closed after."""
    made: list[tuple[Any, Notifier]] = []

    def make(notify: NotifySettings) -> Notifier:
        store = open_store_url(store_url, clock=clock, migrate=False)
        notifier = Notifier(store, notify, clock=clock)
        made.append((store, notifier))
        return notifier

    yield make
    for store, notifier in made:
        notifier.close()
        store.close()


def check_signed(received: Any) -> dict[str, Any]:
    expected = hmac.new(SECRET.encode("utf-8"), received.body, hashlib.sha256).hexdigest()
    assert received.headers["X-Ctrlrun-Signature"] == f"sha256={expected}"
    document: dict[str, Any] = json.loads(received.body)
    if "id" in document:
        assert received.headers["X-Ctrlrun-Delivery"] == document["id"]
    return document


# --------------------------------------------------------------------------- deliveries


def test_a_new_pending_request_is_delivered_once_signed_without_arguments(
    agents, receiver, notifiers
):
    request_id = agents.request()
    notifier = notifiers(settings(receiver.url))
    notifier.tick()
    notifier.tick()  # nothing new: nothing sent again
    (received,) = receiver.received
    document = check_signed(received)
    assert list(document) == BODY_KEYS
    (requested,) = agents.events(EventType.APPROVAL_REQUESTED)
    record = agents.store.get_approval(request_id)
    assert document == {
        "type": "approval.requested", "id": document["id"], "request_id": request_id,
        "action": "stripe.refund", "agent": "support-agent", "user": "alice",
        "environment": "production", "effect_key": requested.effect_key,
        "expires_at": ctrlrun._time.format_ts(record.expires_at),
        "url": f"https://console.example/requests/{request_id}",
    }  # fmt: skip
    assert requested.effect_key == "refund:txn_1"
    assert b"123456" not in received.body and b"amount" not in received.body
    (row,) = notifier.rows.rows()
    assert (row.delivery_id, row.subject_id, row.kind, row.target) == (
        document["id"], request_id, "approval.requested", receiver.url)
    assert row.attempts == 1 and row.last_status == "200"
    assert row.delivered_at is not None and row.next_attempt_at is None


def test_every_webhook_gets_its_own_claim(agents, receiver, notifiers):
    agents.request()
    notifiers(settings(receiver.url, receiver.url + "2")).tick()
    assert sorted(r.path for r in receiver.received) == ["/hook", "/hook2"]
    ids = {r.headers["X-Ctrlrun-Delivery"] for r in receiver.received}
    assert len(ids) == 2


def test_an_ambiguous_effect_is_delivered_once(agents, receiver, notifiers):
    key = agents.ambiguous()
    notifier = notifiers(settings(receiver.url))
    notifier.tick()
    notifier.tick()
    (received,) = receiver.received
    document = check_signed(received)
    assert document["type"] == "effect.ambiguous" and document["effect_key"] == key
    assert document["url"] == "https://console.example/effects?state=ambiguous"
    assert (document["action"], document["agent"], document["environment"]) == (
        "stripe.refund", "support-agent", "production")
    assert document["request_id"] is None and document["expires_at"] is None


def test_a_failed_delivery_is_retried_after_its_backoff_with_the_same_id(
    agents, receiver, notifiers, clock
):
    agents.request()
    receiver.answer(500)
    notifier = notifiers(settings(receiver.url))
    notifier.tick()
    (row,) = notifier.rows.rows()
    assert (row.attempts, row.last_status, row.delivered_at) == (1, "500", None)
    assert row.next_attempt_at is not None
    notifier.tick()  # not due yet
    assert len(receiver.received) == 1
    clock.advance(backoff(1) + timedelta(milliseconds=1))
    notifier.tick()
    first, second = receiver.received
    assert first.body == second.body
    assert first.headers["X-Ctrlrun-Delivery"] == second.headers["X-Ctrlrun-Delivery"]
    check_signed(second)
    (row,) = notifier.rows.rows()
    assert (row.attempts, row.last_status) == (2, "200")
    assert row.delivered_at is not None and row.next_attempt_at is None


def test_a_network_failure_is_kept_and_retried_until_24_hours(agents, notifiers, clock):
    agents.request()
    with Receiver() as gone:
        url = gone.url  # its port is closed once the receiver has stopped
    notifier = notifiers(settings(url))
    notifier.tick()
    (row,) = notifier.rows.rows()
    assert row.last_status.startswith("error: ") and row.next_attempt_at is not None
    for _ in range(40):  # at most an hour apart: past 24 hours within 40 attempts
        clock.advance(hours=1)
        notifier.tick()
    (row,) = notifier.rows.rows()
    assert row.next_attempt_at is None and row.delivered_at is None
    assert 24 <= row.attempts <= 40


def test_another_notifier_retries_a_claim_whose_sender_vanished(agents, receiver, notifiers, clock):
    """A claim held by a sender that never recorded its attempt is retried once the hold ends."""
    request_id = agents.request()
    rows = notifiers(settings(receiver.url)).rows
    assert rows.claim(delivery_id="dlv_" + "0" * 32, subject_id=request_id,
                      kind="approval.requested", target=receiver.url, body='{"x":1}',
                      now=clock(), hold_until=clock() + timedelta(seconds=60))  # fmt: skip
    other = notifiers(settings(receiver.url))
    other.tick()
    assert receiver.received == []  # claimed elsewhere, held
    clock.advance(seconds=61)
    other.tick()
    (received,) = receiver.received
    assert received.body == b'{"x":1}' and received.headers["X-Ctrlrun-Delivery"] == "dlv_" + "0" * 32


def test_slack_format_sends_the_facts_and_the_link(agents, receiver, notifiers):
    request_id = agents.request(user="<!channel>\x1b[31m\u202e")
    notifiers(settings(receiver.url, fmt="slack")).tick()
    (received,) = receiver.received
    document = check_signed(received)
    assert list(document) == ["text"]
    text = document["text"]
    assert "approval requested" in text and "stripe.refund" in text and "production" in text
    assert "support-agent" in text and "refund:txn_1" in text and request_id in text
    assert f"<https://console.example/requests/{request_id}|open in the console>" in text
    assert "&lt;!channel&gt;\\x1b[31m\\u202e" in text  # shown as text, never a mention
    assert "\x1b" not in text and "\u202e" not in text and "123456" not in text


def test_an_expired_or_answered_request_is_not_told(agents, receiver, notifiers, clock):
    first = agents.request("txn_1")
    agents.request("txn_2")
    agents.store.deny_approval(first, "cli:local")
    clock.advance(minutes=16)  # past the second's expiry
    notifiers(settings(receiver.url)).tick()
    assert receiver.received == []


def test_a_request_without_its_event_is_told_after_a_grace_with_no_effect_key(
    agents, receiver, notifiers, clock
):
    from ctrlrun.action import Action, Principal
    from ctrlrun.approvals.records import build_request

    action = Action("deploy", {"env": "prod"}, Principal("ops-agent"), environment="staging")
    request = build_request(action, timedelta(hours=1), clock())
    agents.store.put_approval_request(request)  # no APPROVAL_REQUESTED event (yet)
    notifier = notifiers(settings(receiver.url))
    notifier.tick()
    assert receiver.received == []
    clock.advance(seconds=30)
    notifier.tick()
    (received,) = receiver.received
    document = check_signed(received)
    assert (document["request_id"], document["effect_key"], document["environment"]) == (
        request.request_id, None, "staging")


def test_a_request_answered_before_its_escalation_claim_is_not_escalated(agents, notifiers, clock):
    request_id = agents.request()
    rows = notifiers(settings(after=1, escalate="http://127.0.0.1:1/e")).rows
    agents.store.grant_approval(request_id, "cli:local")
    assert not rows.claim(delivery_id="dlv_" + "1" * 32, subject_id=request_id,
                          kind="approval.escalated", target="http://127.0.0.1:1/e", body="{}",
                          now=clock(), hold_until=clock(), while_pending=request_id)  # fmt: skip
    assert rows.rows() == []


# --------------------------------------------------------------------------- escalation


def test_a_request_left_pending_is_escalated_once_across_two_notifiers(
    agents, receiver, notifiers, clock
):
    request_id = agents.request()
    hook = receiver.url + "-escalate"
    one = notifiers(settings(after=300, escalate=hook))
    two = notifiers(settings(after=300, escalate=hook))
    clock.advance(seconds=299)
    one.tick(), two.tick()
    assert receiver.received == [] and agents.events(EventType.APPROVAL_ESCALATED) == []
    clock.advance(seconds=1)
    one.tick(), two.tick(), one.tick()
    (received,) = receiver.on("/hook-escalate")
    document = check_signed(received)
    assert document["type"] == "approval.escalated" and document["request_id"] == request_id
    (event,) = agents.events(EventType.APPROVAL_ESCALATED)
    assert dict(event.data) == {"request_id": request_id, "after_s": 300, "target": hook}
    assert event.approval_id == request_id and event.effect_key == "refund:txn_1"
    assert agents.store.get_approval(request_id).status is ApprovalStatus.PENDING
    clock.advance(minutes=11)  # expiry is unchanged: the request expires unanswered
    assert agents.store.pending_approvals() == ()


def test_escalation_only_after_the_delay_and_apart_from_the_webhooks(agents, receiver, notifiers, clock):
    agents.request()
    notifier = notifiers(settings(receiver.url, after=60, escalate=receiver.url + "-escalate"))
    notifier.tick()
    assert [r.path for r in receiver.received] == ["/hook"]
    clock.advance(seconds=60)
    notifier.tick()
    assert [r.path for r in receiver.received] == ["/hook", "/hook-escalate"]


# --------------------------------------------------------------------------- two processes


def _notifier_process(url: str, notify: NotifySettings, now: str, barrier: Any, results: Any) -> None:
    """One console's notifier in its own OS process: wait for the other, then three passes."""
    clock = FakeClock(datetime.fromisoformat(now))
    store = open_store_url(url, clock=clock, migrate=False)
    try:
        notifier = Notifier(store, notify, clock=clock)
        barrier.wait()
        for _ in range(3):
            notifier.tick()
        notifier.close()
        results.put("ok")
    except Exception as exc:  # reported to the parent, which fails the test
        results.put(f"{type(exc).__name__}: {exc}")
    finally:
        store.close()


def _race(url: str, notify: NotifySettings, now: datetime) -> None:
    spawn = multiprocessing.get_context("spawn")
    barrier, results = spawn.Barrier(2), spawn.Queue()
    processes = [spawn.Process(target=_notifier_process, args=(url, notify, now.isoformat(), barrier, results))
                 for _ in range(2)]  # fmt: skip
    for process in processes:
        process.start()
    outcomes = [results.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(timeout=60)
    assert outcomes == ["ok", "ok"]


@pytest.mark.postgres
def test_two_notifier_processes_on_one_postgres_store_deliver_each_event_once(
    pg_store_url, receiver, clock
):
    world = Agents(pg_store_url, clock)
    requests = [world.request(f"txn_{i}") for i in range(5)]
    key = world.ambiguous()
    _race(pg_store_url, settings(receiver.url), clock())
    documents = [check_signed(r) for r in receiver.received]
    assert sorted(d["request_id"] for d in documents if d["type"] == "approval.requested") == sorted(requests)
    assert [d["effect_key"] for d in documents if d["type"] == "effect.ambiguous"] == [key]
    assert len(documents) == 6 == len({d["id"] for d in documents})
    world.store.close()


@pytest.mark.postgres
def test_two_notifier_processes_escalate_once(pg_store_url, receiver, clock):
    world = Agents(pg_store_url, clock)
    request_id = world.request()
    clock.advance(seconds=120)
    _race(pg_store_url, settings(after=120, escalate=receiver.url), clock())
    (received,) = receiver.received
    assert check_signed(received)["type"] == "approval.escalated"
    assert len(world.events(EventType.APPROVAL_ESCALATED)) == 1
    assert world.store.get_approval(request_id).status is ApprovalStatus.PENDING
    world.store.close()


# --------------------------------------------------------------------------- setup


def test_start_notifier_runs_a_pass_and_stops(agents, receiver, store_url, clock):
    agents.request()
    stop = start_notifier(store_url, settings(receiver.url), clock=clock, interval=5)
    stop()  # the first pass runs at once; stop waits for it
    assert len(receiver.received) == 1


@pytest.mark.parametrize(
    "notify, names",
    [
        (NotifySettings(("http://127.0.0.1:1/h",), "xml", None, None, None, None), "webhook-format"),
        (NotifySettings(("ftp://x",), "json", None, None, None, None), "ftp://x"),
        (NotifySettings((), "json", None, 10.0, None, None), "go together"),
        (NotifySettings((), "json", None, 0.0, "http://127.0.0.1:1/e", None), "positive"),
    ],
)
def test_bad_settings_are_refused_by_name(agents, notifiers, notify, names):
    with pytest.raises(InvalidArgument, match=names):
        notifiers(notify)


def test_the_memory_store_is_refused():
    from ctrlrun.store import InMemoryStateStore

    with pytest.raises(InvalidArgument, match="SQLite or Postgres"):
        NotificationRows(InMemoryStateStore())


def test_importing_ctrlrun_does_not_import_the_console():
    code = "import sys, ctrlrun; print(any(m.startswith('ctrlrun.console') for m in sys.modules), 'httpx' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
