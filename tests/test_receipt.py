"""Receipts, the chain and its verification, events, and the JSONL sink."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ctrlrun import Control, InMemoryStateStore, JSONLEventSink, Policy, SQLiteStateStore, context, protect
from ctrlrun.receipt import (
    GENESIS_HASH,
    RECEIPT_SCHEMA,
    EventType,
    Receipt,
    ReceiptResult,
    verify_chain,
)

from .clock import Clock

POLICY = "schema: ctrlrun.policy/v2\nactions:\n  customer.read: { decision: allow }\n"
KEYS = (
    "schema receipt_id action_id action action_hash principal resource arguments environment "
    "decision decision_reason approval_id approver effect_key attempt result execution would_have "
    "error started_at finished_at seq prev_hash policy_hash policy_version controls "
    "precondition_at_request precondition_at_recheck approvers authority_grant_id task scope_hash "
    "budget_charges hop edited_from edit_diff"
).split()


def fill(store, count, tmp_path=None, sinks=()):
    control = Control(Policy.from_yaml(POLICY), store, clock=Clock(), sinks=sinks)

    @protect("customer.read", control=control)
    def read(customer_id: str, note: str = "é ✓") -> str:
        return customer_id

    with context(agent="a", user="u"):
        for i in range(count):
            read(f"c{i}")


def test_document_has_36_keys_in_order(tmp_path):
    store = InMemoryStateStore(clock=Clock())
    fill(store, 1)
    (receipt,) = store.receipts()
    document = json.loads(receipt.to_json())
    assert list(document) == KEYS
    assert document["schema"] == RECEIPT_SCHEMA
    assert document["finished_at"].endswith("Z") and len(document["finished_at"]) == 24
    assert document["principal"] == {
        "agent": "a", "user": "u", "claims": {}, "issuer": None, "expires_at": None,
    }  # fmt: skip
    assert "é ✓" in receipt.to_json()  # non-ASCII as itself
    assert receipt.to_json() == json.dumps(document, separators=(",", ":"), ensure_ascii=False)
    assert receipt.hash == receipt.chain_hash() and "hash" not in document
    again = Receipt.from_json(receipt.to_json(), hash=receipt.hash)
    assert again.to_json() == receipt.to_json() and again.chain_hash() == receipt.hash


def test_enums_and_event_types():
    assert [r.value for r in ReceiptResult] == [
        "committed", "failed", "ambiguous", "denied", "blocked", "observed",
    ]  # fmt: skip
    assert len(EventType) == 28


def test_extra_key_is_kept_and_changes_the_hash():
    store = InMemoryStateStore(clock=Clock())
    fill(store, 1)
    (receipt,) = store.receipts()
    document = json.loads(receipt.to_json())
    document["smuggled"] = True
    tampered = Receipt.from_dict(document, hash=receipt.hash)
    assert tampered.chain_hash() != receipt.hash


def test_chain_links_and_head():
    store = InMemoryStateStore(clock=Clock())
    assert store.chain_head() == (0, GENESIS_HASH)
    report = verify_chain(store)
    assert report.ok and report.to_dict()["verified"] == 0
    fill(store, 3)
    receipts = store.receipts()
    assert receipts[0].prev_hash == GENESIS_HASH
    assert [r.prev_hash for r in receipts[1:]] == [r.hash for r in receipts[:-1]]
    assert store.chain_head() == (3, receipts[-1].hash)
    report = verify_chain(store).to_dict()
    assert report == {
        "ok": True, "verified": 3, "chained": 3, "unchained": 0, "head_seq": 3,
        "head_hash": receipts[-1].hash, "breaks": [], "more_breaks": 0,
        "check": "full", "from_seq": 1, "to_seq": 3, "pruned_through": None,
        "acts_verified": 0, "acts_head_seq": 0, "acts_head_hash": "sha256:" + "0" * 64, "not_covered": None,
    }  # fmt: skip


def tampered(tmp_path, sql, params=()):
    path = tmp_path / "state.db"
    store = SQLiteStateStore(path, clock=Clock())
    fill(store, 5)
    store.close()
    with sqlite3.connect(path) as db:
        if params:
            db.execute(sql, params)
        else:
            db.executescript(sql)
    store = SQLiteStateStore(path, clock=Clock())
    try:
        return [(b.name, b.seq) for b in verify_chain(store).breaks]
    finally:
        store.close()


def edit_json(seq):
    return (
        "UPDATE receipts SET json = replace(json, '\"attempt\":1', '\"attempt\":2') WHERE seq = ?",
        (seq,),
    )


@pytest.mark.parametrize(
    ("sql", "params", "expected"),
    [
        (*edit_json(3), [("content_altered", 3), ("link_broken", 4)]),
        (*edit_json(5), [("content_altered", 5), ("head_mismatch", 5)]),
        ("DELETE FROM receipts WHERE seq = 3", (), [("missing", 3), ("link_broken", 4)]),
        ("DELETE FROM receipts WHERE seq = 5", (), [("head_mismatch", 5)]),
        ("DELETE FROM receipt_chain", (), [("head_mismatch", None)]),
        ("UPDATE receipts SET hash = NULL WHERE seq = 2", (), [("hash_missing", 2)]),
        (
            "UPDATE receipts SET seq = 100 WHERE seq = 2; UPDATE receipts SET seq = 2 WHERE seq = 3;"
            " UPDATE receipts SET seq = 3 WHERE seq = 100;",
            (),
            [("link_broken", 2), ("link_broken", 3), ("link_broken", 4)],
        ),
        ("UPDATE receipts SET seq = NULL WHERE seq = 5", (), [("unchained", None), ("head_mismatch", 5)]),
    ],
    ids=["edit-middle", "edit-last", "delete-middle", "delete-last", "delete-head", "null-hash",
         "swap-seq", "unchain"],  # fmt: skip
)
def test_single_tamper_is_named(tmp_path, sql, params, expected):
    assert tampered(tmp_path, sql, params) == expected


def test_unreadable_row_is_walked_past(tmp_path):
    breaks = tampered(tmp_path, "UPDATE receipts SET json = '{not json' WHERE seq = 2")
    assert breaks == [("content_altered", 2), ("link_broken", 3)]


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_jsonl_sink(tmp_path, kind):
    """One append per transaction (on_batch), lines equal to what the store holds."""
    sink = JSONLEventSink(tmp_path / "evidence")
    store = InMemoryStateStore(clock=Clock()) if kind == "memory" else SQLiteStateStore(
        tmp_path / "state.db", clock=Clock()
    )
    fill(store, 2, sinks=[sink])
    receipts = (tmp_path / "evidence" / "receipts.jsonl").read_text(encoding="utf-8").splitlines()
    assert receipts == [r.to_json() for r in store.receipts()]
    events = (tmp_path / "evidence" / "events.jsonl").read_text(encoding="utf-8").splitlines()
    assert events == [e.to_json() for e in store.events()]
    first = json.loads(events[0])
    assert list(first) == ["event_id", "ts", "type", "action_id", "effect_key", "approval_id", "data"]


def test_a_v7_document_reads_and_hashes_as_written():
    store = InMemoryStateStore(clock=Clock())
    fill(store, 1)
    document = json.loads(store.receipts()[0].to_json())
    del document["edited_from"], document["edit_diff"]
    document["schema"] = "ctrlrun.receipt/v7"
    old = Receipt.from_dict(document)
    assert json.loads(old.to_json()) == document and len(document) == 34
    from ctrlrun.action import canonical_bytes, sha256_hex

    assert old.chain_hash() == sha256_hex(canonical_bytes(document))


def test_timestamps_are_utc_milliseconds_truncated():
    from datetime import datetime, timedelta, timezone

    from ctrlrun._time import format_ts

    assert format_ts(datetime(2026, 11, 30, 9, 56, 59, 597999, tzinfo=timezone.utc)) == "2026-11-30T09:56:59.597Z"
    plus_one = timezone(timedelta(hours=1))
    assert format_ts(datetime(2026, 11, 30, 10, 0, 0, 1000, tzinfo=plus_one)) == "2026-11-30T09:00:00.001Z"


@given(
    st.datetimes(
        min_value=datetime(1, 1, 2),
        timezones=st.sampled_from([timezone.utc, timezone(timedelta(hours=5, minutes=30))]),
    )
)
def test_timestamps_are_what_isoformat_writes(moment):
    """The hand-written formats equal isoformat's, at every date (year 1 included)."""
    from ctrlrun._time import format_precise, format_ts

    utc = moment.astimezone(timezone.utc)
    assert format_ts(moment) == utc.replace(tzinfo=None).isoformat(timespec="milliseconds") + "Z"
    assert format_precise(moment) == utc.isoformat(timespec="microseconds")


def test_a_placed_receipts_line_is_the_stored_one_and_not_copied_on():
    store = InMemoryStateStore(clock=Clock())
    fill(store, 1)
    placed = store.put_receipt(replace(store.receipts()[0], receipt_id="ctr_copy"))
    assert placed.to_json() == json.dumps(placed.to_dict(), separators=(",", ":"), ensure_ascii=False)
    moved = placed.chained(7, "sha256:" + "1" * 64)
    assert json.loads(moved.to_json())["seq"] == 7 and json.loads(placed.to_json())["seq"] == 2
