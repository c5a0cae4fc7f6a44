"""The Postgres store under faults: the chain head's lock never outlives a message, every wait
is bounded (timeouts as startup options, keepalives), a held lock or an idle session is a clear
"nothing was written: retry", and a skewed clock is refused. Real processes: test_postgres_stalls."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

import ctrlrun
from ctrlrun import Control, JSONLEventSink, Policy, context, protect
from ctrlrun.errors import ClockSkew, CTRLRunError
from ctrlrun.postgres import PostgresStateStore, PostgresTimeouts
from ctrlrun.receipt import verify_chain
from ctrlrun.store import open_store_url

from .test_store_conformance import make_event, make_receipt

needs_server = pytest.mark.postgres

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    rules:
      - when: { amount_gte: 0, amount_lte: 100 }
        decision: allow
      - when: { amount_gte: 0, amount_lte: 1000 }
        decision: approve
      - decision: deny
  notify.send:
    decision: allow
"""


@pytest.fixture
def pg(pg_url, pg_schema, clock):
    store = PostgresStateStore(pg_url, schema=pg_schema, clock=clock)
    yield store
    store.close()


def _joiner(url: str) -> str:
    return "&" if "?" in url else "?"


def _touches_head(message: str, schema: str) -> bool:
    return f"{schema}.receipt_chain" in message


# --------------------------------------------------------------------------- the head's lock


@needs_server
def test_every_write_that_moves_the_chain_head_is_one_message(pg, pg_schema, clock, tmp_path):
    """Allowed (with and without a key), approved, refused, denied, raising, and the store's own
    ``record``/``put_receipt``: each write touching the head is ``BEGIN; …; COMMIT`` whole, so
    its row lock is never held across a round trip to this host."""
    sink = JSONLEventSink(tmp_path / "sink")
    control = Control(Policy.from_yaml(POLICY), pg, clock=clock, sinks=[sink])
    messages: list[str] = []
    pg.trace = lambda text, params: messages.append(text)

    @protect("stripe.refund", control=control)
    def refund(payment_id: str, amount: int) -> str:
        if payment_id == "boom":
            raise RuntimeError("the remote hung up")
        return "ok"

    @protect("notify.send", control=control)
    def notify(text: str) -> str:
        return text

    with context(agent="agent-1"):
        assert refund(payment_id="txn_1", amount=100) == "ok"  # allowed, the straight path
        assert notify(text="hi") == "hi"  # allowed, no effect key
        with pytest.raises(ctrlrun.DuplicateEffect):
            refund(payment_id="txn_1", amount=100)  # blocked: a refusal's receipt
        with pytest.raises(ctrlrun.ActionDenied):
            refund(payment_id="txn_2", amount=10_000)  # denied
        with pytest.raises(RuntimeError):
            refund(payment_id="boom", amount=1)  # the pipeline's ambiguous finish
        with pytest.raises(ctrlrun.ApprovalRequired) as asked:
            refund(payment_id="txn_3", amount=500)
        pg.grant_approval(asked.value.request_id, "cli:local")
        with ctrlrun.with_approval(asked.value.request_id):
            with pytest.raises(ctrlrun.ApprovalMismatch):
                refund(payment_id="txn_3", amount=501)  # refused approval: a receipt
            assert refund(payment_id="txn_3", amount=500) == "ok"  # the pipeline's finish
    pg.record(events=[make_event()], receipt=make_receipt(1))
    pg.record(receipt=make_receipt(2))
    pg.put_receipt(make_receipt(3))

    head = [m for m in messages if _touches_head(m, pg_schema)]
    writes = [m for m in head if "FOR UPDATE" in m or "UPDATE " in m]
    receipts = pg.receipts()
    assert len(writes) == len(receipts), [r.result for r in receipts]  # one per receipt
    for message in writes:
        assert message.startswith("BEGIN; ") and message.endswith("; COMMIT"), message[:200]
    assert not [m for m in head if m not in writes and m.startswith("BEGIN")]  # reads only
    assert len(receipts) >= 10 and verify_chain(pg).ok
    # the receipts handed to the sink are the stored ones, byte for byte
    lines = (tmp_path / "sink" / "receipts.jsonl").read_text(encoding="utf-8").splitlines()
    stored = {r.receipt_id: r.to_json() for r in receipts}
    for line in lines:
        assert stored[json.loads(line)["receipt_id"]] == line
    assert len(lines) == len(receipts) - 3  # all but the three the test wrote itself


@needs_server
def test_a_receipt_object_placed_by_the_server_is_the_one_this_host_would_place(pg):
    receipt = make_receipt(7)
    placed = pg.put_receipt(receipt)
    expected = receipt.chained(placed.seq, placed.prev_hash)
    assert placed.hash == expected.hash and placed.to_json() == expected.to_json()
    (stored,) = pg.receipts()
    assert stored.hash == expected.hash and stored.to_json() == expected.to_json()
    with pytest.raises(ctrlrun.InvalidArgument, match="already stored"):
        pg.put_receipt(receipt)
    assert len(pg.receipts()) == 1 and pg.chain_head()[0] == 1


# --------------------------------------------------------------------------- timeouts: parameters


def test_default_timeouts_become_libpq_parameters_and_startup_options():
    from ctrlrun.store.pgtimeouts import connect_parameters

    assert connect_parameters({}, PostgresTimeouts(), environ={}) == {
        "connect_timeout": 10,
        "keepalives": 1,
        "keepalives_idle": 5,
        "keepalives_interval": 2,
        "keepalives_count": 3,
        "tcp_user_timeout": 10_000,
        "options": "-c lock_timeout=5000 -c statement_timeout=15000 "
        "-c idle_in_transaction_session_timeout=15000",
    }


def test_what_the_url_or_the_environment_sets_wins():
    from ctrlrun.store.pgtimeouts import connect_parameters

    given = {"connect_timeout": "3", "keepalives": "0", "tcp_user_timeout": "500",
             "options": "-c search_path=x --lock-timeout=1s"}  # fmt: skip
    extra = connect_parameters(given, PostgresTimeouts(), environ={})
    assert "connect_timeout" not in extra and "keepalives" not in extra
    assert "tcp_user_timeout" not in extra and extra["keepalives_idle"] == 5
    assert extra["options"] == (
        "-c search_path=x --lock-timeout=1s -c statement_timeout=15000 "
        "-c idle_in_transaction_session_timeout=15000"
    )
    environ = {"PGOPTIONS": "-c statement_timeout=0", "PGCONNECT_TIMEOUT": "4"}
    extra = connect_parameters({}, PostgresTimeouts(), environ=environ)
    assert "connect_timeout" not in extra
    assert extra["options"] == (
        "-c statement_timeout=0 -c lock_timeout=5000 -c idle_in_transaction_session_timeout=15000"
    )


def test_timeouts_can_be_changed_left_to_the_server_or_sent_without_options():
    from ctrlrun.store.pgtimeouts import connect_parameters

    custom = PostgresTimeouts(lock=0.25, statement=None, idle_in_transaction=0,
                              keepalives_idle=None, keepalives_interval=None,
                              keepalives_count=None, tcp_user_timeout=None)  # fmt: skip
    assert connect_parameters({}, custom, environ={}) == {
        "connect_timeout": 10,
        "options": "-c lock_timeout=250 -c idle_in_transaction_session_timeout=0",
    }
    quiet = PostgresTimeouts(startup_options=False)
    assert "options" not in connect_parameters({}, quiet, environ={"PGOPTIONS": "-c a=b"})


@pytest.mark.parametrize(
    "wrong", [{"lock": -1}, {"statement": "5s"}, {"connect": True}, {"lock": float("nan")},
              {"startup_options": "no"}],  # fmt: skip
)
def test_bad_timeouts_refused(wrong):
    with pytest.raises(ctrlrun.InvalidArgument, match="PostgresTimeouts"):
        PostgresTimeouts(**wrong)


def test_ctrlrun_url_settings_are_taken_out():
    from ctrlrun.store.pgtimeouts import take_url_settings

    url = "postgresql://u@h/db?ctrlrun_startup_options=off&sslmode=disable&ctrlrun_max_clock_skew=2.5"
    assert take_url_settings(url) == (
        "postgresql://u@h/db?sslmode=disable",
        {"startup_options": False, "max_clock_skew": 2.5},
    )
    assert take_url_settings("postgresql://u@h/db?ctrlrun_max_clock_skew=off")[1] == {
        "max_clock_skew": None
    }
    for wrong in ("ctrlrun_startup_options=maybe", "ctrlrun_max_clock_skew=soon"):
        with pytest.raises(ctrlrun.InvalidArgument, match=wrong.split("=")[0]):
            take_url_settings("postgresql://u@h/db?" + wrong)
    with pytest.raises(ctrlrun.InvalidArgument, match="max_clock_skew"):
        PostgresStateStore("postgresql://u@127.0.0.1:1/db", max_clock_skew=0)


# --------------------------------------------------------------------------- timeouts: server


def _setting(store, name: str) -> str:
    return store._conn().exec_driver_sql(f"SHOW {name}").scalar()


@needs_server
def test_the_session_runs_with_the_timeouts(pg):
    assert _setting(pg, "lock_timeout") == "5s"
    assert _setting(pg, "statement_timeout") == "15s"
    assert _setting(pg, "idle_in_transaction_session_timeout") == "15s"
    client = pg._conn().connection.driver_connection.info.get_parameters()
    assert client["keepalives"] == "1" and client["keepalives_idle"] == "5"
    assert client["keepalives_interval"] == "2" and client["keepalives_count"] == "3"
    assert client["tcp_user_timeout"] == "10000" and client["connect_timeout"] == "10"


@needs_server
def test_url_options_and_the_keyword_set_the_timeouts(pg_url, pg_schema, clock):
    url = pg_url + _joiner(pg_url) + "options=-c%20lock_timeout%3D1234"
    store = PostgresStateStore(url, schema=pg_schema, clock=clock,
                               timeouts=PostgresTimeouts(lock=9, statement=2.5))  # fmt: skip
    try:
        assert _setting(store, "lock_timeout") == "1234ms"  # the URL wins
        assert _setting(store, "statement_timeout") == "2500ms"
    finally:
        store.close()
    quiet = open_store_url(
        f"{pg_url}{_joiner(pg_url)}ctrlrun_schema={pg_schema}"
        "&ctrlrun_startup_options=off", clock=clock,
    )  # fmt: skip
    try:
        assert _setting(quiet, "lock_timeout") == "0"  # the server's (or the role's) own
        assert quiet.timeouts.startup_options is False
    finally:
        quiet.close()


# --------------------------------------------------------------------------- a held lock


class HeldLock:
    """Another session holding a row ``FOR UPDATE`` in an open transaction until ``release``."""

    def __init__(self, url: str, statement: str) -> None:
        import psycopg

        self.conn = psycopg.connect(url)  # not autocommit: the SELECT opens the transaction
        self.conn.execute(statement)

    def release(self) -> None:
        self.conn.rollback()
        self.conn.close()


def _quick(pg_url, pg_schema, **timeouts) -> PostgresStateStore:
    return PostgresStateStore(pg_url, schema=pg_schema, timeouts=PostgresTimeouts(**timeouts))


@needs_server
def test_a_held_chain_head_makes_a_writer_fail_clearly_then_succeed(pg_url, pg_schema):
    store = _quick(pg_url, pg_schema, lock=0.2)
    held = HeldLock(pg_url, f"SELECT * FROM {pg_schema}.receipt_chain WHERE id = 1 FOR UPDATE")
    try:
        with pytest.raises(CTRLRunError) as info:
            store.record(events=[make_event()], receipt=make_receipt(1))
        assert not isinstance(info.value, ctrlrun.AmbiguousWrite)
        assert "lock_timeout (0.2 s)" in str(info.value)
        assert "nothing was written: retry" in str(info.value)
        assert store.receipts() == () and store.events() == ()
    finally:
        held.release()
    store.record(events=[make_event()], receipt=make_receipt(1))  # the retry
    assert len(store.receipts()) == 1 and verify_chain(store).ok
    store.close()


@needs_server
def test_a_held_chain_head_stops_the_allowed_finish_and_leaves_the_key_held(pg_url, pg_schema):
    """The function ran; its finish could not take the head: the error says nothing was
    written, and the key stays ``executing`` under its lease (no blind retry runs it again)."""
    store = _quick(pg_url, pg_schema, lock=0.2)
    store.outcome_deadline = 1.0  # the finish is retried, as always, but not for the usual 15 s
    control = Control(Policy.from_yaml(POLICY), store)
    ran: list[str] = []

    @protect("stripe.refund", control=control)
    def refund(payment_id: str, amount: int) -> str:
        ran.append(payment_id)
        return "ok"

    held = HeldLock(pg_url, f"SELECT * FROM {pg_schema}.receipt_chain WHERE id = 1 FOR UPDATE")
    try:
        with context(agent="agent-1"), pytest.raises(CTRLRunError, match="lock_timeout"):
            refund(payment_id="txn_1", amount=100)
    finally:
        held.release()
    assert ran == ["txn_1"] and store.receipts() == ()
    assert store.get_effect("refund:txn_1").state is ctrlrun.EffectState.EXECUTING
    with context(agent="agent-1"), pytest.raises(ctrlrun.DuplicateEffect):
        refund(payment_id="txn_1", amount=100)
    assert ran == ["txn_1"]
    store.close()


@needs_server
def test_a_statement_past_statement_timeout_is_nothing_written(pg_url, pg_schema):
    """With no lock timeout, a wait on a held row runs into the statement timeout instead."""
    store = _quick(pg_url, pg_schema, lock=None, statement=0.2)
    held = HeldLock(pg_url, f"SELECT * FROM {pg_schema}.receipt_chain WHERE id = 1 FOR UPDATE")
    try:
        with pytest.raises(CTRLRunError, match=r"statement_timeout \(0.2 s\)") as info:
            store.put_receipt(make_receipt(1))
        assert not isinstance(info.value, ctrlrun.AmbiguousWrite)
        assert "nothing was written: retry" in str(info.value)
    finally:
        held.release()
    store.put_receipt(make_receipt(1))
    assert len(store.receipts()) == 1
    store.close()


@needs_server
def test_a_session_idle_in_its_transaction_is_ended_by_the_server(pg_url, pg_schema, monkeypatch):
    """A write stopped between two of its messages: the server ends the session after the
    idle-in-transaction timeout; the next message hears why, and nothing was written."""
    import select

    from ctrlrun._time import utc_now

    from .test_store_conformance import granted_request, make_action

    setup = PostgresStateStore(pg_url, schema=pg_schema)  # a loaded host must not trip the timeout
    request = granted_request(setup, utc_now, make_action())
    setup.close()
    store = _quick(pg_url, pg_schema, idle_in_transaction=2)
    messages: list[str] = []

    def trace(text, params):
        messages.append(text)
        if len(messages) == 2:  # the transaction is open: wait until the server ends it
            dbapi = store._driver()[0]
            readable, _, _ = select.select([dbapi.fileno()], [], [], 60)
            assert readable, "the server did not end the idle session"

    store.trace = trace
    with pytest.raises(CTRLRunError) as info:
        store.consume_approval_and_reserve(
            request.request_id, make_action().action_hash, "k", "a1"
        )
    assert not isinstance(info.value, ctrlrun.AmbiguousWrite), info.value
    assert "idle_in_transaction_session_timeout (2 s)" in str(info.value)
    store.trace = None
    assert store.get_effect("k") is None  # nothing of it was written; the store goes on
    assert store.consume_approval_and_reserve(
        request.request_id, make_action().action_hash, "k", "a1"
    )[1].effect_key == "k"
    store.close()


# --------------------------------------------------------------------------- clock skew


class Ticks:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _skewed_server(store, seconds: float, monkeypatch) -> list[int]:
    """The server's clock as ``seconds`` ahead of this host's (the measurement faked)."""
    from ctrlrun._time import utc_now

    calls: list[int] = []

    def read():
        calls.append(1)
        local = utc_now()
        return local, local + timedelta(seconds=seconds), 0.001

    monkeypatch.setattr(store, "_read_clocks", read)
    return calls


@needs_server
def test_a_skewed_host_is_refused_and_recovers(pg_url, pg_schema, monkeypatch):
    store = PostgresStateStore(pg_url, schema=pg_schema)  # the real clock: judged
    ticks = store._ticks = Ticks()
    store._clock_due = 0.0
    calls = _skewed_server(store, 30, monkeypatch)
    with pytest.raises(ClockSkew) as info:
        store.reserve_effect("k", "a1")
    refusal = info.value
    assert refusal.server == store.target and refusal.limit == 5.0
    assert 29 < refusal.skew < 31 and refusal.host
    text = str(refusal)
    assert refusal.host in text and store.target in text and "NTP" in text
    assert "max_clock_skew" in text and "nothing was written" in text
    assert store.get_effect("k") is None  # reads go on: an operator can look
    calls.clear()
    _skewed_server(store, 0.2, monkeypatch)  # NTP fixed it
    assert store.reserve_effect("k", "a1").effect_key == "k"
    # measured again at most once per interval while the clocks agree
    calls = _skewed_server(store, 0.2, monkeypatch)
    for n in range(5):
        store.append_event(make_event())
    assert calls == []
    ticks.now += store.clock_check_interval
    store.append_event(make_event())
    assert calls == [1]
    store.close()


@needs_server
def test_the_skew_check_reads_the_real_server_clock(pg_url, pg_schema, monkeypatch):
    """A real measurement: this host's clock read 30 s fast is refused at the first write after
    open, and accepted once it reads true again; one cheap query each time, traced."""
    from ctrlrun._time import utc_now

    fast = lambda: utc_now() + timedelta(seconds=30)  # noqa: E731
    monkeypatch.setattr(PostgresStateStore, "_host_now", staticmethod(fast))
    store = PostgresStateStore(pg_url, schema=pg_schema)
    messages: list[str] = []
    store.trace = lambda text, params: messages.append(text)
    with pytest.raises(ClockSkew, match="30|29"):
        store.put_receipt(make_receipt(1))
    assert store.receipts() == ()
    monkeypatch.setattr(PostgresStateStore, "_host_now", staticmethod(utc_now))
    store.put_receipt(make_receipt(1))
    assert messages.count("SELECT clock_timestamp()") == 2  # the refusal's and the recovery's
    assert len(store.receipts()) == 1
    store.close()


@needs_server
def test_the_allowed_call_gains_no_message_for_the_clock(pg_url, pg_schema):
    store = PostgresStateStore(pg_url, schema=pg_schema)
    control = Control(Policy.from_yaml(POLICY), store)
    messages: list[str] = []
    store.trace = lambda text, params: messages.append(text)

    @protect("stripe.refund", control=control)
    def refund(payment_id: str, amount: int) -> str:
        return "ok"

    with context(agent="agent-1"):
        for n in range(3):
            refund(payment_id=f"txn_{n}", amount=100)
    assert len(messages) == 6 and "SELECT clock_timestamp()" not in messages  # measured at open
    store.close()


@needs_server
def test_no_skew_check_with_an_injected_clock_or_none(pg_url, pg_schema, clock, monkeypatch):
    for store in (
        PostgresStateStore(pg_url, schema=pg_schema, clock=clock),
        PostgresStateStore(pg_url, schema=pg_schema, max_clock_skew=None),
        open_store_url(f"{pg_url}{_joiner(pg_url)}ctrlrun_schema={pg_schema}"
                       "&ctrlrun_max_clock_skew=off"),
    ):
        store._clock_due = 0.0
        calls = _skewed_server(store, 3600, monkeypatch)
        store.append_event(make_event())
        assert calls == []
        store.close()
    wide = PostgresStateStore(pg_url, schema=pg_schema, max_clock_skew=120)
    wide._clock_due = 0.0
    _skewed_server(wide, 60, monkeypatch)
    wide.append_event(make_event())  # within what this deployment allows
    wide.close()
