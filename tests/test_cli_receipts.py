"""``ctrlrun receipts``: listing, the JSON export, unreadable rows, and ``--verify-chain`` against tampering."""

from __future__ import annotations

import hashlib
import json

import pytest

import ctrlrun
from ctrlrun.receipt import GENESIS_HASH, verify_chain

from ._cli_helpers import invoke, sql


@pytest.fixture
def chain(project):
    """Four committed refunds: receipts seq 1..4."""
    for n in range(1, 5):
        project.call(payment_id=f"txn_{n}", amount=100 * n)
        project.clock.advance(seconds=1)
    return project


def _verify(project, *flags):
    return invoke(["receipts", "--verify-chain", *flags], clock=project.clock)


def test_listing(project):
    @ctrlrun.protect("customer.read", control=project.control)
    def read(customer_id: str) -> str:
        return customer_id

    project.call(payment_id="txn_1", amount=100)
    with ctrlrun.context(agent="reader"):
        read(customer_id="c1")
    with ctrlrun.context(agent="x"), pytest.raises(ctrlrun.ActionDenied):
        project.refund(payment_id="txn_2", amount=10**9)
    rows = project.store.receipts()
    result = invoke(["receipts"], clock=project.clock)
    assert result.code == 0, result.err
    assert result.lines == [
        f"2026-11-30T09:00:00.000Z  {rows[0].receipt_id}  stripe.refund  allow/committed  refund:txn_1  support-agent",
        f"2026-11-30T09:00:00.000Z  {rows[1].receipt_id}  customer.read  allow/committed  -  reader",
        f"2026-11-30T09:00:00.000Z  {rows[2].receipt_id}  stripe.refund  deny/denied  refund:txn_2  x",
    ]  # fmt: skip


def test_last(chain):
    rows = chain.store.receipts()
    result = invoke(["receipts", "--last", "2"], clock=chain.clock)
    assert [line.split("  ")[1] for line in result.lines] == [r.receipt_id for r in rows[-2:]]
    assert invoke(["receipts", "--last", "10"]).lines == invoke(["receipts"]).lines
    as_json = invoke(["receipts", "--last", "1", "--json"]).lines
    assert as_json == [rows[-1].to_json()]


@pytest.mark.parametrize("value", ["0", "-1", "x"])
def test_last_must_be_a_positive_integer(chain, value):
    result = invoke(["receipts", "--last", value])
    assert result.code == 2 and "Usage:" in result.err


def test_empty_store(project):
    for flags in ([], ["--last", "3"]):
        result = invoke(["receipts", *flags])
        assert result.code == 0 and result.out == "no receipts yet\n"
    for flags in (["--json"], ["--json", "--last", "3"]):  # stdout is for programs only
        result = invoke(["receipts", *flags])
        assert (result.code, result.out, result.err) == (0, "", "no receipts yet\n")


def test_json_lines_are_the_stored_documents_byte_for_byte(chain):
    result = invoke(["receipts", "--json"])
    assert result.code == 0
    stored = [row[0] for row in sql(chain.db, "SELECT json FROM receipts ORDER BY seq")]
    exported = (chain.db.parent / "receipts.jsonl").read_text(encoding="utf-8").splitlines()
    assert result.lines == stored == exported
    assert all(len(json.loads(line)) == 36 for line in result.lines)


def test_the_export_verifies_with_json_and_sha256_only(chain):
    lines = invoke(["receipts", "--json"]).lines
    report = json.loads(_verify(chain, "--json").out)
    previous = GENESIS_HASH
    for seq, line in enumerate(lines, start=1):
        document = json.loads(line)
        assert document["seq"] == seq and document["prev_hash"] == previous
        canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        previous = "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()
    assert report["head_hash"] == previous and report["head_seq"] == len(lines) == 4


def test_an_unreadable_row_prints_in_place(chain):
    rows = chain.store.receipts()
    sql(chain.db, "UPDATE receipts SET json = '{not json' WHERE seq = 2")
    result = invoke(["receipts"])
    assert result.code == 0, result.err
    assert len(result.lines) == 4
    assert result.lines[1] == f"seq 2  {rows[1].receipt_id}  UNREADABLE  this row could not be read (JSONDecodeError)"
    assert rows[0].receipt_id in result.lines[0] and rows[2].receipt_id in result.lines[2]
    as_json = invoke(["receipts", "--json"]).lines
    assert json.loads(as_json[1]) == {
        "seq": 2,
        "receipt_id": rows[1].receipt_id,
        "refusal": "this row could not be read (JSONDecodeError)",
        "hash": rows[1].hash,
    }
    assert as_json[0] == rows[0].to_json() and as_json[3] == rows[3].to_json()


# ------------------------------------------------------------------- --verify-chain


def test_verify_intact(chain):
    result = _verify(chain)
    assert result.code == 0, result.err
    assert result.lines == ["chain: 4 of 4 receipts verified", "full check of seq 1..4", "the chain is intact"]
    as_json = _verify(chain, "--json")
    assert as_json.code == 0
    assert as_json.out == json.dumps(verify_chain(chain.store).to_dict(), separators=(",", ":")) + "\n"


def test_verify_empty_store(project):
    result = _verify(project)
    assert result.code == 0
    assert result.lines == ["chain: 0 of 0 receipts verified", "full check of an empty chain", "the chain is intact"]


def test_verify_ignores_last(chain):
    assert invoke(["receipts", "--verify-chain", "--last", "1"]).lines[0] == "chain: 4 of 4 receipts verified"


def _broken(project, *flags):
    result = _verify(project, *flags)
    assert result.code == 1
    assert result.err.startswith("Error: the receipt chain does not verify")
    return result


def _names(result):
    """``[(name, seq)]`` of the break lines."""
    found = []
    for line in result.lines[1:]:
        if not line.startswith("  ") or line.startswith("   "):
            continue
        head = line.strip().split(":", 1)[0]
        name, _, seq = head.partition(" at seq ")
        found.append((name, int(seq) if seq else None))
    return found


def _edit(project, seq):
    sql(project.db, "UPDATE receipts SET json = replace(json, ?, ?) WHERE seq = ?",
        f'"payment_id":"txn_{seq}"', '"payment_id":"txn_X"', seq)  # fmt: skip


@pytest.mark.parametrize("seq", [1, 2, 3])
def test_edit_a_receipt(chain, seq):
    _edit(chain, seq)
    result = _broken(chain)
    assert _names(result) == [("content_altered", seq), ("link_broken", seq + 1)]
    assert result.lines[0] == "chain: 2 of 4 receipts verified"
    assert "the chain is intact" not in result.out


def test_edit_the_last_receipt(chain):
    _edit(chain, 4)
    assert _names(_broken(chain)) == [("content_altered", 4), ("head_mismatch", 4)]


def test_delete_a_middle_row(chain):
    sql(chain.db, "DELETE FROM receipts WHERE seq = 2")
    result = _broken(chain)
    assert _names(result) == [("missing", 2), ("link_broken", 3)]
    assert result.lines[0] == "chain: 2 of 3 receipts verified"


def test_delete_the_last_row(chain):
    sql(chain.db, "DELETE FROM receipts WHERE seq = 4")
    assert _names(_broken(chain)) == [("head_mismatch", 4)]


def test_delete_the_head_row(chain):
    sql(chain.db, "DELETE FROM receipt_chain")
    result = _broken(chain)
    assert _names(result) == [("head_mismatch", None)]
    assert result.lines[-1].startswith("  head_mismatch: ")


def test_null_a_stored_hash(chain):
    sql(chain.db, "UPDATE receipts SET hash = NULL WHERE seq = 3")
    assert _names(_broken(chain)) == [("hash_missing", 3)]


def test_swap_two_rows_seq(chain):
    sql(chain.db, "UPDATE receipts SET seq = -1 WHERE seq = 2")
    sql(chain.db, "UPDATE receipts SET seq = 2 WHERE seq = 3")
    sql(chain.db, "UPDATE receipts SET seq = 3 WHERE seq = -1")
    result = _broken(chain)
    assert _names(result) == [("link_broken", 2), ("link_broken", 3), ("link_broken", 4)]


def test_an_unreadable_row_breaks_the_chain(chain):
    sql(chain.db, "UPDATE receipts SET json = '{not json' WHERE seq = 2")
    assert _names(_broken(chain)) == [("content_altered", 2), ("link_broken", 3)]


def test_unchained_rows(chain):
    (document,) = sql(chain.db, "SELECT json FROM receipts WHERE seq = 1")[0]
    old = json.loads(document) | {"receipt_id": "ctr_" + "0" * 32, "seq": None}
    sql(chain.db, "INSERT INTO receipts (receipt_id, json) VALUES (?, ?)", old["receipt_id"], json.dumps(old))
    result = _broken(chain)
    assert result.lines[:2] == [
        "chain: 4 of 5 receipts verified",
        "       1 written before the chain existed (unchained)",
    ]
    assert _names(result) == [("unchained", None)]


def test_verify_json_when_broken(chain):
    _edit(chain, 2)
    result = _broken(chain, "--json")
    report = json.loads(result.out)
    assert report["ok"] is False
    assert [(b["name"], b["seq"]) for b in report["breaks"]] == [("content_altered", 2), ("link_broken", 3)]
