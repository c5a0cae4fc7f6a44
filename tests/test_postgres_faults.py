"""The Postgres store under faults: the chain head's lock never outlives a message, every wait
is bounded (timeouts as startup options, keepalives), a skewed clock is refused, and real
processes keep going while another is frozen or its connection is blackholed."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

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
    url = pg_url + ("&" if "?" in pg_url else "?") + "options=-c%20lock_timeout%3D1234"
    store = PostgresStateStore(url, schema=pg_schema, clock=clock,
                               timeouts=PostgresTimeouts(lock=9, statement=2.5))  # fmt: skip
    try:
        assert _setting(store, "lock_timeout") == "1234ms"  # the URL wins
        assert _setting(store, "statement_timeout") == "2500ms"
    finally:
        store.close()
    quiet = open_store_url(
        f"{pg_url}{'&' if '?' in pg_url else '?'}ctrlrun_schema={pg_schema}"
        "&ctrlrun_startup_options=off", clock=clock,
    )  # fmt: skip
    try:
        assert _setting(quiet, "lock_timeout") == "0"  # the server's (or the role's) own
        assert quiet.timeouts.startup_options is False
    finally:
        quiet.close()
