"""``PostgresStateStore(prepared=True)``: writes as server-side prepared statements.

The rules themselves run on this store in the conformance suite (``postgres-prepared``); here:
the statement's prepared form, what goes over the wire, the URL setting, and a connection whose
prepared statements the server forgot (what a transaction-mode pooler does).
"""

from __future__ import annotations

import pytest

from ctrlrun import Control, Policy, context, protect
from ctrlrun.effects.records import EffectState
from ctrlrun.errors import InvalidArgument, StoreUnavailable
from ctrlrun.postgres import PostgresStateStore
from ctrlrun.receipt import verify_chain
from ctrlrun.store.prepared import prepare_form

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  payments.refund:
    effect: "refund:{payment_id}"
    rules:
      - decision: allow
"""


def test_prepare_form_numbers_the_placeholders_and_keeps_a_literal_percent():
    prepare, execute = prepare_form("SELECT a FROM t WHERE b = %s AND c LIKE 'x%%' AND d = %s")
    name = execute.split("(")[0].removeprefix("EXECUTE ")
    assert name.startswith("ctrlrun_") and len(name) == len("ctrlrun_") + 20
    assert prepare == f"PREPARE {name} AS SELECT a FROM t WHERE b = $1 AND c LIKE 'x%' AND d = $2"
    assert execute == f"EXECUTE {name}(%s, %s)"


def test_prepare_form_names_by_the_text_and_leaves_other_commands_alone():
    one = prepare_form("WITH x AS (SELECT 1) SELECT * FROM x")
    again = prepare_form("WITH x AS (SELECT 1) SELECT * FROM x")
    other = prepare_form("WITH x AS (SELECT 2) SELECT * FROM x")
    assert one == again and one is not None and other is not None and one[0] != other[0]
    assert one[1].startswith("EXECUTE ") and "(" not in one[1]  # no parameters
    for command in ("BEGIN", "COMMIT", "SET LOCAL lock_timeout = '1s'", "  ", ""):
        assert prepare_form(command) is None


@pytest.fixture
def prepared(pg_url, pg_schema, clock):
    store = PostgresStateStore(pg_url, schema=pg_schema, clock=clock, prepared=True)
    yield store
    store.close()


def _refund(store, clock):
    control = Control(Policy.from_yaml(POLICY), store, clock=clock)
    ran = []

    @protect("payments.refund", control=control)
    def refund(payment_id: str, amount: int) -> dict:
        ran.append(payment_id)
        return {"id": "re_" + payment_id, "amount": amount}

    return refund, ran


@pytest.mark.postgres
def test_an_allowed_call_prepares_once_then_sends_two_messages(prepared, clock):
    refund, ran = _refund(prepared, clock)
    sent: list[str] = []
    prepared.trace = lambda text, parameters: sent.append(text)
    with context(agent="agent-1"):
        assert refund("p1", 100) == {"id": "re_p1", "amount": 100}
        first = list(sent)
        sent.clear()
        refund("p2", 200)
    prepared.trace = None
    assert [t.split(" ", 1)[0] for t in first] == ["PREPARE", "BEGIN;", "PREPARE", "BEGIN;"]
    assert len(sent) == 2 and all(t.startswith("BEGIN; EXECUTE ctrlrun_") for t in sent)
    assert all(t.endswith("; COMMIT") for t in sent)  # the transaction is still one message
    assert ran == ["p1", "p2"]
    assert prepared.get_effect("refund:p2").state is EffectState.COMMITTED
    report = verify_chain(prepared)
    assert report.ok and report.verified == 2


@pytest.mark.postgres
def test_the_url_turns_it_on_and_refuses_an_unknown_value(pg_url, pg_schema, clock):
    joiner = "&" if "?" in pg_url else "?"
    store = PostgresStateStore(f"{pg_url}{joiner}ctrlrun_prepared=on", schema=pg_schema, clock=clock)
    try:
        assert store.prepares
    finally:
        store.close()
    plain = PostgresStateStore(pg_url, schema=pg_schema, clock=clock)
    try:
        assert not plain.prepares  # off unless asked for: PgBouncer in transaction mode stays safe
    finally:
        plain.close()
    with pytest.raises(InvalidArgument, match="ctrlrun_prepared is 'sometimes'"):
        PostgresStateStore(f"{pg_url}{joiner}ctrlrun_prepared=sometimes", schema=pg_schema)


def _forget_prepared(store) -> None:
    """What a transaction-mode pooler does to a client: the next server connection never saw
    its PREPARE."""
    dbapi, _ = store._driver()
    dbapi.execute("DEALLOCATE ALL")


@pytest.mark.postgres
def test_a_forgotten_statement_fails_the_start_whole_and_is_prepared_again(prepared, clock):
    refund, ran = _refund(prepared, clock)
    with context(agent="agent-1"):
        refund("p1", 100)
        _forget_prepared(prepared)
        with pytest.raises(StoreUnavailable, match="ctrlrun_prepared=off") as refused:
            refund("p2", 200)
        assert "nothing was written" in str(refused.value)
        assert ran == ["p1"] and prepared.get_effect("refund:p2") is None
        refund("p2", 200)  # prepared again on this connection
    assert ran == ["p1", "p2"]
    assert prepared.get_effect("refund:p2").state is EffectState.COMMITTED
    assert verify_chain(prepared).ok


@pytest.mark.postgres
def test_a_forgotten_statement_after_the_function_ran_is_retried_not_lost(prepared, clock):
    control = Control(Policy.from_yaml(POLICY), prepared, clock=clock)
    prepared._sleep = lambda seconds: None  # the outcome's retry waits on no real clock

    @protect("payments.refund", control=control)
    def refund(payment_id: str, amount: int) -> dict:
        if payment_id == "p1":
            _forget_prepared(prepared)  # between the start and the finish
        return {"id": "re_" + payment_id}

    with context(agent="agent-1"):
        refund("p0", 1)  # both statements prepared
        assert refund("p1", 100) == {"id": "re_p1"}
    record = prepared.get_effect("refund:p1")
    assert record.state is EffectState.COMMITTED
    report = verify_chain(prepared)
    assert report.ok and report.verified == 2


@pytest.mark.postgres
@pytest.mark.parametrize("when", ["after", "before"])
def test_an_unanswered_prepared_finish_is_read_back_and_never_written_twice(
    prepared, clock, monkeypatch, when
):
    """The lost COMMIT's handling is the same with EXECUTE in the message: read back if it
    landed, sent again (on a fresh connection, prepared again there) if it did not."""
    import psycopg

    from .test_postgres import spy_messages

    finish_names: list[str] = []
    lost: list[str] = []

    def lose_the_first_finish(cursor, message, params):
        if message.startswith("PREPARE ") and " AS WITH finished" in message:
            finish_names.append(message.split()[1])
        finishing = any(message.startswith(f"BEGIN; EXECUTE {n}(") for n in finish_names)
        if finishing and not lost:
            lost.append(message)
            if when == "after":
                cursor.execute(message, params)  # carried out; only the answer is lost
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return cursor.execute(message, params)

    prepared._sleep = lambda seconds: None
    refund, ran = _refund(prepared, clock)
    messages = spy_messages(monkeypatch, prepared, lose_the_first_finish)
    with context(agent="agent-1"):
        assert refund("p1", 100) == {"id": "re_p1", "amount": 100}
    assert ran == ["p1"] and lost
    finishes = [m for m in messages if any(m.startswith(f"BEGIN; EXECUTE {n}(") for n in finish_names)]
    assert len(finishes) == (1 if when == "after" else 2)  # landed: read back, not sent again
    monkeypatch.undo()
    assert prepared.get_effect("refund:p1").state is EffectState.COMMITTED
    (receipt,) = prepared.receipts()
    assert receipt.result == "committed" and verify_chain(prepared).ok


# --------------------------------------------------------------------------- literal parameters

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from ctrlrun.store.pgliteral import Literals, literal  # noqa: E402

_values = st.one_of(
    # psycopg writes -2**63 as "-9223372036854775808::bigint", which the server refuses
    st.none(), st.booleans(), st.integers(min_value=-(2**63) + 1, max_value=2**63 - 1),
    st.text(alphabet=st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=20),
    st.sampled_from(["'", "\\", "\\'", "''", "'; DROP TABLE x; --", "%s", "%%", "E'\\\\'", "$1"]),
)  # fmt: skip


def test_literals_leave_what_they_cannot_write_to_the_driver():
    assert literal("nul\x00") is None and literal(1.5) is None and literal(b"x") is None
    assert literal(-3) == "(-3)" and literal(-(2**63)) == "(-9223372036854775808)" and literal(True) == "true" and literal(None) == "NULL"
    assert literal("it's") == "E'it''s'" and literal("a\\b") == "E'a\\\\b'"
    render = Literals().render
    assert render("SELECT %s, '%%'", ("x",)) == "SELECT 'x', '%'"
    assert render("SELECT %s", ("x", "y")) is None  # the driver explains a count mismatch
    assert render("SELECT %s", (2.5,)) is None


@pytest.mark.postgres
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_values, min_size=1, max_size=6))
def test_a_rendered_literal_reads_back_as_the_value(pg_url, values):
    """What the server reads from our literals is what the driver's own binding gives it."""
    import psycopg

    rendered = Literals().render
    statement = "SELECT " + ", ".join(
        "%s::bigint" if type(v) is int else "%s::boolean" if type(v) is bool else "%s::text"
        for v in values
    )
    text = rendered(statement, tuple(values))
    assert text is not None
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for conforming in ("on", "off"):
            conn.execute(f"SET standard_conforming_strings = {conforming}")
            ours = conn.execute(text).fetchone()
            theirs = psycopg.ClientCursor(conn).execute(statement, tuple(values)).fetchone()
            assert tuple(ours) == tuple(theirs) == tuple(values)
