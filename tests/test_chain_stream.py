"""The chain check in constant memory, over one read snapshot, and incremental from a verified mark."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ctrlrun
from ctrlrun import InMemoryStateStore, SQLiteStateStore
from ctrlrun.action import _CANONICAL_JSON
from ctrlrun.evidence.chain import BREAKS_KEPT, ChainWalk, _hash_of, _rehash, verify_rows
from ctrlrun.receipt import verify_chain
from ctrlrun.evidence.receipt import GENESIS_HASH, RECEIPT_SCHEMA_V7, UnreadableReceipt, _copy
from ctrlrun.store import codec
from ctrlrun.store.verifymark import read_mark, write_mark
from ctrlrun.store.verifymark import verify_and_mark

from ._cli_helpers import invoke
from .clock import Clock
from .conftest import STORE_FACTORIES, _admin, pg_schema_for, postgres_url
from .test_cli_read_only import _env, _fill, place  # noqa: F401 - the fixture
from .test_receipt import fill

ROOT = Path(__file__).resolve().parents[1]
SRC = Path(ctrlrun.__file__).resolve().parents[1]


def _template() -> dict:
    store = InMemoryStateStore(clock=Clock())
    fill(store, 1)
    return store.receipts()[0].to_dict()


# ---------------------------------------------------------------- constant memory


def _stored_rows(count: int):
    """``count`` valid chained stored rows, each made when asked for: the stored line and its
    canonical text are the template's with the receipt id, seq and prev_hash put in."""
    document = _template()
    document.update(receipt_id="@ID@", seq=-999999, prev_hash="@PREV@")

    def pattern(text: str) -> str:
        text = text.replace("%", "%%").replace("-999999", "%(seq)d")
        return text.replace("@ID@", "%(id)s").replace("@PREV@", "%(prev)s")

    stored = pattern(json.dumps(document, separators=(",", ":"), ensure_ascii=False))
    canonical = pattern(_CANONICAL_JSON.encode(document))
    prev = GENESIS_HASH
    for seq in range(1, count + 1):
        values = {"seq": seq, "id": f"ctr_{seq:032x}", "prev": prev}
        digest = ctrlrun.action.sha256_hex((canonical % values).encode("utf-8"))
        yield seq, values["id"], stored % values, digest
        prev = digest


def _peak(run):
    tracemalloc.start()
    try:
        result = run()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_200000_row_generator_verifies_under_a_fixed_memory_bound():
    # each row is ~1.1 KB of text: an implementation holding the rows needs > 250 MB here
    count, bound = 200_000, 4_000_000
    last = list(_stored_rows(1))[-1]  # noqa: F841 - the template is built outside the trace
    report, peak = _peak(lambda: verify_rows(_stored_rows(count), None))
    assert peak < bound, peak
    assert report.verified == report.chained == count and report.to_seq == count
    assert [b.name for b in report.breaks] == ["head_mismatch"]  # no head given


def test_a_receipt_generator_verifies_under_a_fixed_memory_bound():
    # a held Receipt costs ~1.9 KB: holding these 5,000 takes ~9.4 MB
    store = InMemoryStateStore(clock=Clock())
    fill(store, 1)
    (template,) = store.receipts()

    def receipts():
        prev = GENESIS_HASH
        for seq in range(1, 5_001):
            receipt = _copy(template, receipt_id=f"ctr_{seq:032x}", stored_seq=seq).chained(seq, prev)
            prev = receipt.hash
            yield receipt

    last = list(receipts())[-1]
    report, peak = _peak(lambda: verify_rows(receipts(), (5_000, last.hash)))
    assert peak < 1_000_000, peak
    assert report.ok and report.verified == 5_000


def test_breaks_past_the_first_hundred_are_counted_not_listed():
    rows = (UnreadableReceipt(seq=n, receipt_id=f"r{n}", error="ValueError: x") for n in range(1, 251))
    report = verify_rows(rows, (250, "sha256:" + "1" * 64))
    assert len(report.breaks) == BREAKS_KEPT and report.more_breaks == 151 and report.break_count == 251
    assert {b.name for b in report.breaks} == {"content_altered"} and report.to_dict()["more_breaks"] == 151


def test_a_row_out_of_seq_order_is_a_link_broken_and_moves_nothing():
    store = InMemoryStateStore(clock=Clock())
    fill(store, 5)
    rows = list(store.receipts())
    report = verify_rows([rows[0], rows[1], rows[3], rows[2], rows[4]], store.chain_head())
    assert [(b.name, b.seq) for b in report.breaks] == [("missing", 3), ("link_broken", 4), ("link_broken", 3)]
    assert report.verified == 3 and report.chained == 5


# ---------------------------------------------------------------- the stored line's hash


def _same_hash(text: str, stored: str = "sha256:x") -> None:
    fast = _rehash(1, "r1", text, stored)
    slow = _hash_of(codec.receipt_from_row({"seq": 1, "receipt_id": "r1", "json": text, "hash": stored}))
    assert fast == slow


def _edited(change):
    document = _template()
    change(document)
    return document


ODD_DOCUMENTS = {
    "as-written": lambda d: None,
    "v7": lambda d: (d.pop("edited_from"), d.pop("edit_diff"), d.update(schema=RECEIPT_SCHEMA_V7)),
    "v7-with-a-v8-key": lambda d: (d.pop("edit_diff"), d.update(schema=RECEIPT_SCHEMA_V7)),
    "missing-optional": lambda d: d.pop("hop"),
    "missing-required": lambda d: d.pop("action"),
    "controls-null": lambda d: d.update(controls=None),
    "controls-text": lambda d: d.update(controls="ab"),
    "approvers-object": lambda d: d.update(approvers={"b": 1, "a": 2}),
    "float": lambda d: d.update(arguments={"amount": 1.5}),
    "extra-key": lambda d: d.update(smuggled=True),
    "big-int": lambda d: d.update(attempt=10**30),
    "odd-decision": lambda d: d.update(decision="maybe", result="perhaps"),
    "principal-text": lambda d: d.update(principal="someone"),
    "principal-odd": lambda d: d.update(principal={"agent": "a", "zz": [1, {"y": 2, "x": None}]}),
    "shuffled": lambda d: [d.update({k: d.pop(k)}) for k in sorted(d)],
}


@pytest.mark.parametrize("name", sorted(ODD_DOCUMENTS))
def test_the_fast_hash_is_the_receipts_own(name):
    _same_hash(json.dumps(_edited(ODD_DOCUMENTS[name]), ensure_ascii=False))


@pytest.mark.parametrize(
    "text",
    ["{not json", "[1, 2]", "null", '{"a": NaN}', json.dumps(_template()).replace('"c0"', '"\\ud800"'),
     json.dumps(_template()).replace('"attempt": 1', '"attempt": Infinity')],
    ids=["not-json", "a-list", "null", "nan", "lone-surrogate", "infinity"],
)  # fmt: skip
def test_the_fast_hash_leaves_what_it_cannot_vouch_for_to_the_decoder(text):
    _same_hash(text)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=150, deadline=None)
@given(arguments=JSON, would_have=JSON, extra=st.dictionaries(st.text(max_size=4), JSON, max_size=2))
def test_the_fast_hash_is_the_receipts_own_for_any_values(arguments, would_have, extra):
    document = _template()
    document.update(extra, arguments=arguments, would_have=would_have)
    _same_hash(json.dumps(document, ensure_ascii=False))


# ---------------------------------------------------------------- the mark, on every store


def _edit(store, kind: str, tmp_path: Path, seq: int) -> None:
    """Change receipt ``seq``'s stored document behind the store's back."""
    old, new = '"attempt":1', '"attempt":2'
    if kind == "memory":
        (row,) = [r for r in store._data.receipts.values() if r["seq"] == seq]
        row["json"] = row["json"].replace(old, new)
    elif kind == "sqlite":
        with sqlite3.connect(tmp_path / "state.db") as db:
            db.execute("UPDATE receipts SET json = replace(json, ?, ?) WHERE seq = ?", (old, new, seq))
    else:
        schema = pg_schema_for(tmp_path)
        _admin(postgres_url(), f"UPDATE \"{schema}\".receipts SET json = replace(json, '{old}', '{new}') WHERE seq = {seq}")


def _named(report):
    return [(b.name, b.seq) for b in report.breaks]


def test_no_mark_means_a_full_check_and_a_pass_sets_it(store):
    fill(store, 4)
    assert read_mark(store) is None
    report = verify_and_mark(store, since_verified=True)
    assert report.ok and (report.check, report.from_seq, report.to_seq, report.pruned_through) == ("full", 1, 4, None)
    mark = read_mark(store)
    assert (mark.seq, mark.hash) == store.chain_head() and mark.verified_at.endswith("+00:00")


def test_an_incremental_check_walks_from_the_mark_and_moves_it(store):
    fill(store, 4)
    verify_and_mark(store)
    fill(store, 3)
    report = verify_and_mark(store, since_verified=True)
    assert report.ok and (report.check, report.from_seq, report.to_seq) == ("incremental", 4, 7)
    assert report.verified == report.chained == 4  # the receipt at the mark, then 5..7
    assert report.to_dict()["check"] == "incremental" and read_mark(store).seq == 7
    assert verify_chain(store).check == "full"  # a plain check always walks everything
    assert verify_and_mark(store, since_verified=True).to_dict()["from_seq"] == 7


@pytest.mark.parametrize("edited", [6, 4], ids=["after-the-mark", "at-the-mark"])
def test_since_verified_catches_an_edit_and_the_mark_stays(store, store_kind, tmp_path, edited):
    fill(store, 4)
    verify_and_mark(store)
    fill(store, 3)
    _edit(store, store_kind, tmp_path, edited)
    report = verify_and_mark(store, since_verified=True)
    assert _named(report) == [("content_altered", edited), ("link_broken", edited + 1)]
    assert read_mark(store).seq == 4 and report.check == "incremental"
    if edited == 4:  # the receipt at the mark no longer hashes to it
        assert "the receipt at the verified mark (seq 4) hashes to" in report.breaks[0].detail
    assert _named(verify_chain(store)) == _named(report)


def test_an_edit_before_the_mark_is_for_the_full_check(store, store_kind, tmp_path):
    fill(store, 4)
    verify_and_mark(store)
    _edit(store, store_kind, tmp_path, 2)
    assert verify_chain(store, since_verified=True).ok  # the mark is a convenience, not evidence
    assert _named(verify_chain(store)) == [("content_altered", 2), ("link_broken", 3)]


def test_a_mark_whose_receipt_is_gone(tmp_path):
    store = SQLiteStateStore(tmp_path / "state.db", clock=Clock())
    fill(store, 3)
    write_mark(store, 2, store.receipts()[1].hash, Clock()())
    with sqlite3.connect(tmp_path / "state.db") as db:
        db.execute("DELETE FROM receipts WHERE seq = 2")
    report = verify_chain(store, since_verified=True)
    assert _named(report) == [("content_altered", 2), ("link_broken", 3)] and "is gone" in report.breaks[0].detail
    store.close()


# ---------------------------------------------------------------- a concurrent writer

WRITER = (
    "import sys\n"
    "from ctrlrun.store import open_store_url\n"
    "from tests.test_receipt import fill\n"
    "store = open_store_url(sys.argv[1])\n"
    "fill(store, 5)\n"
    "store.close()\n"
)


def _url(kind: str, tmp_path: Path) -> str:
    if kind == "sqlite":
        return f"sqlite://{tmp_path / 'state.db'}"
    return f"{postgres_url()}?ctrlrun_schema={pg_schema_for(tmp_path)}"


def _walk_with_a_writer(store, url, monkeypatch):
    """``verify_chain(store)`` with another OS process appending 5 receipts after the head was
    read and before the receipts are, then 5 more mid-walk (each run to its end)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(SRC), str(ROOT)))}
    ran = []

    def write() -> None:
        done = subprocess.run([sys.executable, "-c", WRITER, url], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stderr
        ran.append(done)

    add_unchained, add_stored = ChainWalk.add_unchained, ChainWalk.add_stored

    def counted(walk, count):  # the snapshot has read the head, not yet a receipt
        write()
        add_unchained(walk, count)

    def walked(walk, seq, *columns):
        if seq == 3 and len(ran) == 1:
            write()
        add_stored(walk, seq, *columns)

    monkeypatch.setattr(ChainWalk, "add_unchained", counted)
    monkeypatch.setattr(ChainWalk, "add_stored", walked)
    report = verify_chain(store)
    monkeypatch.undo()
    assert len(ran) == 2
    return report


def test_a_concurrent_writer_causes_no_break(durable_kind, tmp_path, clock, monkeypatch):
    store = STORE_FACTORIES[durable_kind](tmp_path, clock)
    try:
        fill(store, 6)
        report = _walk_with_a_writer(store, _url(durable_kind, tmp_path), monkeypatch)
        assert report.ok and (report.to_seq, report.verified) == (6, 6)
        assert store.chain_head()[0] == 16 and verify_chain(store).to_seq == 16
    finally:
        store.close()


def test_a_real_break_is_reported_while_a_writer_appends(durable_kind, tmp_path, clock, monkeypatch):
    store = STORE_FACTORIES[durable_kind](tmp_path, clock)
    try:
        fill(store, 6)
        _edit(store, durable_kind, tmp_path, 2)
        report = _walk_with_a_writer(store, _url(durable_kind, tmp_path), monkeypatch)
        assert _named(report) == [("content_altered", 2), ("link_broken", 3)] and report.to_seq == 6
    finally:
        store.close()


# ---------------------------------------------------------------- the CLI


def _mark_at(db: Path):
    store = SQLiteStateStore(db, migrate=False, read_only=True)
    try:
        return read_mark(store)
    finally:
        store.close()


def test_since_verified_needs_verify_chain(project):
    result = invoke(["receipts", "--since-verified"])
    assert result.code == 2 and "--since-verified needs --verify-chain" in result.err


def test_the_cli_moves_the_mark_and_checks_from_it(project):
    for n in range(1, 4):
        project.call(payment_id=f"txn_{n}", amount=100)
    assert invoke(["receipts", "--verify-chain", "--since-verified"]).lines[1] == "full check of seq 1..3"
    assert _mark_at(project.db).seq == 3
    project.call(payment_id="txn_4", amount=100)
    result = invoke(["receipts", "--verify-chain", "--since-verified"])
    assert result.code == 0 and result.lines == [
        "chain: 2 of 2 receipts verified", "incremental check of seq 3..4 (mark at 3)", "the chain is intact"]  # fmt: skip
    as_json = json.loads(invoke(["receipts", "--verify-chain", "--since-verified", "--json"]).out)
    assert {k: as_json[k] for k in ("check", "from_seq", "to_seq", "pruned_through")} == {
        "check": "incremental", "from_seq": 4, "to_seq": 4, "pruned_through": None}  # fmt: skip
    with sqlite3.connect(project.db) as db:
        db.execute("UPDATE receipts SET json = replace(json, '\"attempt\":1', '\"attempt\":2') WHERE seq = 4")
    failed = invoke(["receipts", "--verify-chain", "--since-verified"])
    assert failed.code == 1 and "  content_altered at seq 4: the receipt at the verified mark (seq 4)" in failed.out
    assert _mark_at(project.db).seq == 4


def test_a_store_that_may_not_be_written_keeps_its_mark_and_says_so(place):  # noqa: F811
    project, _ = _fill(place.directory)
    project.close()
    place.freeze()
    result = invoke(["receipts", "--verify-chain"], clock=project.clock, env=_env(place))
    assert result.code == 0 and result.lines[-1] == "the chain is intact"
    assert "note: the verified mark was not moved: " in result.err
    assert _mark_at(project.db) is None  # read as the CLI reads it (the place is still frozen)


class _OtherStore:
    """A store of another kind: only the protocol's reads, and a head read before the rows."""

    def __init__(self, inner, head=None):
        self.inner, self.head = inner, head

    def chain_head(self):
        return self.head or self.inner.chain_head()

    def receipts(self):
        return self.inner.receipts()


def test_a_store_of_another_kind_is_read_head_first():
    inner = InMemoryStateStore(clock=Clock())
    fill(inner, 3)
    assert verify_chain(_OtherStore(inner)).ok
    second = inner.receipts()[1]
    later = verify_chain(_OtherStore(inner, head=(2, second.hash)))  # seq 3 came after the head
    assert later.ok and (later.verified, later.to_seq) == (2, 2)
    assert verify_chain(_OtherStore(inner), since_verified=True).check == "full"
