"""The acts cross-check of ``receipts --verify-chain`` reads a key's last receipt by one index
probe, so a page costs its 500 effects whatever the store (or a hot key) holds; and the Postgres
store names the timeout in force, and its URL mistakes, on one line."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import pytest

from ctrlrun import Control, Policy, SQLiteStateStore, context, protect
from ctrlrun.receipt import verify_chain
from ctrlrun.errors import DuplicateEffect, InvalidArgument

from .conftest import STORE_FACTORIES, drop_test_store

POLICY = "schema: ctrlrun.policy/v2\nactions:\n  note.delete:\n    decision: allow\n"
HOT = 60  # duplicates of one key: each leaves a blocked receipt on it


def _fill(store: Any, clock: Any) -> None:
    control = Control(Policy.from_yaml(POLICY), store, clock=clock)

    @protect("note.delete", effect="note:{note_id}", control=control)
    def delete(note_id: str) -> str:
        return "deleted " + note_id

    with context(agent="agent-1"):
        for n in range(5):
            delete(note_id=f"n{n}")
        for _ in range(HOT):
            with pytest.raises(DuplicateEffect):
                delete(note_id="n0")


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan]
    for child in plan.get("Plans", ()):
        found += _nodes(child)
    return found


def test_sqlite_reads_a_keys_last_receipt_without_sorting_its_receipts(tmp_path, clock):
    store = SQLiteStateStore(tmp_path / "state.db", clock=clock)
    _fill(store, clock)
    statements = [store._statements.evidence_sql.resolved(since) for since in (False, True)]
    assert verify_chain(store).ok
    store.close()
    with sqlite3.connect(tmp_path / "state.db") as conn:
        for statement in statements:
            steps = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + statement.sql,
                                                    [None] * len(statement.names))]  # fmt: skip
            probes = [s for s in steps if s.startswith("SEARCH receipts USING") and "effect_key" in s]
            assert len(probes) == 2 and all("receipts_effect_key_seq" in s for s in probes), steps
            assert not any("TEMP B-TREE" in s for s in steps), steps


@pytest.mark.postgres
def test_postgres_reads_one_row_per_key_however_many_receipts_the_key_has(tmp_path, clock):
    """With the hot key's receipts analysed, each of the page's correlated lookups still reads
    one index entry (the key's newest) and sorts nothing."""
    store = STORE_FACTORIES["postgres"](tmp_path, clock)
    try:
        _fill(store, clock)
        (dbapi, _) = store._driver()
        statement = store._statements.evidence_sql.resolved(False)
        cursor = dbapi.cursor()
        cursor.execute(f'ANALYZE "{store.schema}".receipts')
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement.sql,
                       statement.bind({"after": "", "limit": 500, "since": None}))  # fmt: skip
        (document,) = cursor.fetchone()
        plan = (document if isinstance(document, list) else json.loads(document))[0]["Plan"]
        subplans = [n for n in _nodes(plan) if n.get("Parent Relationship") == "SubPlan"]
        assert len(subplans) == 2, plan
        for subplan in subplans:
            inner = _nodes(subplan)
            assert not [n for n in inner if n["Node Type"] == "Sort"], subplan
            scans = [n for n in inner if n.get("Relation Name") == "receipts"]
            assert scans and all(n["Index Name"] == "receipts_effect_key_seq" for n in scans), subplan
            assert all(n["Actual Rows"] <= 1 for n in scans), subplan
        assert verify_chain(store).ok
    finally:
        store.close()
        drop_test_store("postgres", tmp_path)


@pytest.mark.postgres
def test_a_statement_timeout_names_the_timeout_in_force(tmp_path, clock):
    """The URL's own ``statement_timeout`` wins over ``PostgresTimeouts``; the message says it."""
    from ctrlrun.postgres import PostgresStateStore
    from ctrlrun.store.pgerrors import driver_error

    from .conftest import create_pg_schema, drop_pg_schema, postgres_url

    url = postgres_url()
    schema = create_pg_schema(url)
    try:
        separator = "&" if "?" in url else "?"
        store = PostgresStateStore(f"{url}{separator}options=-c%20statement_timeout%3D42s",
                                   schema=schema, clock=clock)  # fmt: skip
        try:
            assert store.in_force["statement_timeout"] == "42s"
            (dbapi, _) = store._driver()
            cursor = dbapi.cursor()
            cursor.execute("SET statement_timeout = 1")
            with pytest.raises(Exception) as info:
                cursor.execute("SELECT pg_sleep(1)")
            message = str(driver_error(info.value, "verifying", store, transient=True))
            assert "statement_timeout (42 s)" in message and "15 s" not in message, message
        finally:
            store.close()
    finally:
        drop_pg_schema(url, schema)


def test_a_url_with_schema_names_ctrlrun_schema_on_one_line():
    pytest.importorskip("psycopg")
    from ctrlrun.postgres import PostgresStateStore

    with pytest.raises(InvalidArgument) as info:
        PostgresStateStore("postgresql://postgres@127.0.0.1:5432/test?schema=x")
    message = str(info.value)
    assert "ctrlrun_schema=" in message and "\n" not in message, message
    with pytest.raises(InvalidArgument) as info:
        PostgresStateStore("postgresql://postgres@127.0.0.1:5432/test?colour=x")
    assert "'colour'" in str(info.value) and "ctrlrun_prepared" in str(info.value)


def test_a_driver_message_of_several_lines_reads_as_one():
    from ctrlrun.store.pgerrors import message_of

    refused = OSError('connection to server at "127.0.0.1", port 5999 failed: Connection refused\n'
                      "\tIs the server running on that host and accepting TCP/IP connections?\n")  # fmt: skip
    text = message_of(refused)
    assert "\n" not in text and "\t" not in text
    assert text.endswith("Connection refused. Is the server running on that host and accepting TCP/IP connections?")
