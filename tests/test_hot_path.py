"""The allow path's cost in statements, and the shortcuts that keep it small doing what the long
way did. Statements are counted by the store's own trace hook; nothing here is timed."""

from __future__ import annotations

import enum
import json
import random
from collections import Counter, OrderedDict
from dataclasses import replace
from datetime import timedelta
from types import MappingProxyType
from typing import Any

import pytest

from ctrlrun import Control, Policy, context, protect
from ctrlrun.action import _FLOAT_FIX as FLOAT_FIX
from ctrlrun.action import canonical_bytes, check_value, new_id, sha256_hex
from ctrlrun.effects.records import LAPSED_LEASE_ERROR, EffectState
from ctrlrun.errors import AmbiguousEffect, DuplicateEffect, InvalidArgument
from ctrlrun.receipt import GENESIS_HASH, EventType, Receipt, verify_chain
from ctrlrun.store import SQLiteStateStore

from .test_store_conformance import make_event, make_receipt

LEASE = timedelta(minutes=5)
TICK = timedelta(microseconds=1)

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    decision: allow
"""


class SQLLog:
    """Every statement (by its first word) and every COMMIT/ROLLBACK a SQL store sends, from the
    store's own ``trace`` hook: one call per message, whose statements ``"; "`` separates."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.statements: list[str] = []
        self.ends: list[str] = []
        self.messages = 0

    def __enter__(self) -> SQLLog:
        self.store.trace = self._sent
        return self

    def __exit__(self, *exc: object) -> None:
        self.store.trace = None

    def _sent(self, text: str, parameters: Any) -> None:
        self.messages += 1
        for part in text.split("; "):
            if part in ("COMMIT", "ROLLBACK"):
                self.ends.append(part)
            else:
                self.statements.append(part)

    def verbs(self) -> Counter[str]:
        return Counter(s.lstrip().split(None, 1)[0].upper() for s in self.statements)


def allowed_calls(store: Any, clock: Any) -> Any:
    control = Control(Policy.from_yaml(POLICY), store, clock=clock)
    runs: list[str] = []

    @protect("stripe.refund", control=control)
    def refund(payment_id: str, amount: int) -> dict[str, Any]:
        runs.append(payment_id)
        return {"id": f"re_{payment_id}", "amount": amount}

    return refund, runs


def count_one_allowed_call(store: Any, clock: Any) -> tuple[Counter[str], list[str], int, int]:
    refund, runs = allowed_calls(store, clock)
    with context(agent="agent-1"):
        refund(payment_id="warm", amount=100)  # the first call of a process imports things
        before = store.transactions
        with SQLLog(store) as log:
            assert refund(payment_id="txn_1", amount=100) == {"id": "re_txn_1", "amount": 100}
    assert runs == ["warm", "txn_1"]
    assert store.get_effect("refund:txn_1").state is EffectState.COMMITTED
    assert verify_chain(store).ok and store.chain_head()[0] == 2
    return log.verbs(), log.ends, store.transactions - before, log.messages


# --------------------------------------------------------------------------- statements per call


def test_allowed_call_on_sqlite_sends_eight_statements_in_two_transactions(tmp_path, clock):
    """start: BEGIN IMMEDIATE, INSERT effect, INSERT events; finish: BEGIN IMMEDIATE, UPDATE
    effect (compare-and-set), INSERT events, UPDATE head (from the head this store last
    wrote, compare-and-set), INSERT receipt."""
    store = SQLiteStateStore(tmp_path / "state.db", clock=clock)
    try:
        verbs, ends, transactions, messages = count_one_allowed_call(store, clock)
    finally:
        store.close()
    assert transactions == 2 and ends == ["COMMIT", "COMMIT"]
    assert verbs == {"BEGIN": 2, "INSERT": 4, "UPDATE": 2}
    assert sum(verbs.values()) <= 8  # 17 before the hot path was rewritten


def test_a_head_another_writer_moved_is_read_afresh(tmp_path, clock):
    """Two stores on one file, taking turns: each finds the head moved by the other since its
    last receipt (its compare-and-set misses), reads it, and the chain stays whole."""
    first = SQLiteStateStore(tmp_path / "state.db", clock=clock)
    second = SQLiteStateStore(tmp_path / "state.db", clock=clock)
    try:
        calls = [allowed_calls(first, clock)[0], allowed_calls(second, clock)[0]]
        with context(agent="agent-1"):
            for i in range(6):
                calls[i % 2](payment_id=f"p{i}", amount=100)
            with SQLLog(first) as log:  # the second store wrote last: one extra UPDATE
                calls[0](payment_id="p6", amount=100)
        assert log.verbs() == {"BEGIN": 2, "INSERT": 4, "UPDATE": 4}
        report = verify_chain(first)
        assert report.ok and first.chain_head()[0] == 7 == report.verified
        assert [r.seq for r in first.receipts()] == list(range(1, 8))
    finally:
        first.close()
        second.close()


def test_events_come_back_with_ids_only_for_sinks(tmp_path, clock):
    """Without a sink the events' INSERTs return nothing (no id is read back); with one, the
    sink gets every event with the id it was stored under."""
    store = SQLiteStateStore(tmp_path / "state.db", clock=clock)
    seen: list[Any] = []

    class Sink:
        def on_event(self, event):
            seen.append(event)

        def on_receipt(self, receipt):
            pass

    try:
        for sinks in ((), (Sink(),)):
            control = Control(Policy.from_yaml(POLICY), store, clock=clock, sinks=sinks)

            @protect("stripe.refund", control=control)
            def refund(payment_id: str, amount: int) -> str:
                return "ok"

            with context(agent="agent-1"), SQLLog(store) as log:
                refund(payment_id=f"txn_{len(sinks)}", amount=100)
            inserts = [s for s in log.statements if "INSERT INTO events" in s]
            assert len(inserts) == 2
            assert all(("RETURNING" in s) == bool(sinks) for s in inserts)
        stored = {e.event_id: e for e in store.events()}
        assert len(seen) == 5 and all(stored[e.event_id] == e for e in seen)
    finally:
        store.close()


@pytest.mark.postgres
def test_allowed_call_on_postgres_sends_two_messages_in_two_transactions(
    pg_url, pg_schema, clock
):
    """Each transaction is one statement (data-modifying CTEs) sent with its BEGIN and COMMIT:
    the start's effect with its events; the finish's outcome, events, the receipt (placed by the
    server after the head it locks) and the head moved to it."""
    from ctrlrun.postgres import PostgresStateStore

    store = PostgresStateStore(pg_url, schema=pg_schema, clock=clock)
    try:
        verbs, ends, transactions, messages = count_one_allowed_call(store, clock)
    finally:
        store.close()
    assert transactions == 2 and ends == ["COMMIT", "COMMIT"]
    assert verbs == {"BEGIN": 2, "WITH": 2}
    assert messages == 2  # BEGIN and COMMIT ride with the statements


def test_refused_start_reads_the_record_only_after_the_insert_conflicts(tmp_path, clock):
    store = SQLiteStateStore(tmp_path / "state.db", clock=clock)
    try:
        store.start_attempt(action_id="a1", effect_key="k", lease=LEASE)
        with SQLLog(store) as log:
            with pytest.raises(DuplicateEffect) as info:
                store.start_attempt(
                    action_id="a2", effect_key="k", lease=LEASE, events=lambda a, r: [make_event()]
                )
        assert info.value.state == "in_progress"
        assert [s.split(None, 1)[0] for s in log.statements] == ["BEGIN", "INSERT", "SELECT"]
        assert log.ends == ["ROLLBACK"] and store.events() == ()
    finally:
        store.close()


# --------------------------------------------------------------------------- the finish shortcut


def test_finish_of_an_ambiguous_record_is_decided_on_the_stored_record(store, clock):
    """The compare-and-set on "executing" misses; the stored record decides (here: accepted)."""
    store.start_attempt(action_id="a1", effect_key="k", lease=LEASE)
    clock.advance(LEASE + TICK)
    with pytest.raises(AmbiguousEffect):
        store.reserve_effect("k", "a2")  # the lapsed lease is kept as ambiguous
    stored, receipt = store.finish_attempt(
        effect_key="k", action_id="a1", outcome=EffectState.AMBIGUOUS, error="timed out",
        events=[make_event(EventType.EXECUTION_AMBIGUOUS)], receipt=make_receipt(),
    )  # fmt: skip
    record = store.get_effect("k")
    assert record.state is EffectState.AMBIGUOUS and record.error == "timed out"
    assert record.attempt == 1 and len(stored) == 1 and receipt.seq == 1
    assert verify_chain(store).ok


def test_finish_after_a_lapsed_lease_nobody_took_commits(store, clock):
    store.start_attempt(action_id="a1", effect_key="k", lease=LEASE)
    clock.advance(LEASE + TICK)
    store.finish_attempt(effect_key="k", action_id="a1", outcome="committed", result={"v": 1})
    record = store.get_effect("k")
    assert (record.state, record.result, record.error) == (EffectState.COMMITTED, {"v": 1}, None)
    assert record.lease_expires_at is None and record.attempt == 1


def test_finish_keeps_what_it_does_not_write(store, clock):
    """A renewed attempt: attempt, created_at and the refusal taxonomy come from the record."""
    store.start_attempt(action_id="a1", effect_key="k", lease=LEASE)
    store.finish_attempt(effect_key="k", action_id="a1", outcome="failed", error="declined")
    created = store.get_effect("k").created_at
    clock.advance(seconds=1)
    store.start_attempt(action_id="a2", effect_key="k", lease=LEASE)  # failed: renewed
    store.finish_attempt(effect_key="k", action_id="a2", outcome="committed", result=7)
    record = store.get_effect("k")
    assert (record.attempt, record.created_at, record.result) == (2, created, 7)
    assert record.error is None  # the renewal cleared it; a commit writes no error
    with pytest.raises(DuplicateEffect):
        store.finish_attempt(effect_key="k", action_id="a2", outcome="committed")
    with pytest.raises(InvalidArgument, match="no such effect record"):
        store.finish_attempt(effect_key="nope", action_id="a2", outcome="failed")


def test_finish_refused_after_takeover_writes_nothing(store, clock):
    store.start_attempt(action_id="a1", effect_key="k", lease=LEASE)
    clock.advance(LEASE + TICK)
    with pytest.raises(AmbiguousEffect):
        store.reserve_effect("k", "a2")
    with pytest.raises(AmbiguousEffect):
        store.finish_attempt(
            effect_key="k", action_id="a9", outcome=EffectState.COMMITTED,
            events=[make_event()], receipt=make_receipt(),
        )  # fmt: skip
    assert store.events() == () and store.chain_head() == (0, GENESIS_HASH)
    assert store.get_effect("k").error == LAPSED_LEASE_ERROR


# --------------------------------------------------------------------------- events in one INSERT


def test_events_in_one_statement_keep_their_order_and_ids(store):
    same = make_event(EventType.ACTION_PROPOSED, n=1)
    batch = [same, make_event(EventType.POLICY_EVALUATED, n=2), same, same, make_event()]
    stored, receipt = store.record(events=batch, receipt=make_receipt())
    ids = [e.event_id for e in stored]
    assert ids == sorted(ids) and len(set(ids)) == 5
    assert [e.type for e in stored] == [e.type for e in batch]
    assert [e.data for e in stored] == [e.data for e in batch]
    assert store.events() == stored and receipt.seq == 1
    more, _ = store.record(events=[make_event()] * 3)
    more_ids = [e.event_id for e in more]
    assert more_ids == sorted(more_ids) and more_ids[0] > ids[-1]


def test_duplicate_receipt_in_a_finish_leaves_events_head_and_record(store):
    taken = store.put_receipt(make_receipt())
    store.start_attempt(action_id="a1", effect_key="k", lease=LEASE)
    with pytest.raises(InvalidArgument, match=taken.receipt_id):
        store.finish_attempt(
            effect_key="k", action_id="a1", outcome="committed",
            events=[make_event(), make_event()], receipt=make_receipt(receipt_id=taken.receipt_id),
        )  # fmt: skip
    assert store.chain_head() == (1, taken.hash) and store.events() == ()
    assert store.get_effect("k").state is EffectState.EXECUTING
    assert verify_chain(store).ok


# --------------------------------------------------------------------------- canonical bytes


def reference_check_value(value: Any, path: str) -> None:
    """``check_value`` as first written: every value checked with its path built."""
    from collections.abc import Mapping

    if value is None or isinstance(value, (bool, int)):
        return
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgument(
                f"{path} holds a string UTF-8 cannot encode (a lone surrogate); "
                "pass valid Unicode text"
            ) from None
        return
    if isinstance(value, float):
        raise InvalidArgument(f"{path} is a float ({value!r}); {FLOAT_FIX}")
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidArgument(
                    f"{path} has a {type(key).__name__} key {key!r}; mapping keys must be str"
                )
            reference_check_value(key, f"{path} key {key!r}")
            reference_check_value(item, f"{path}.{key}")
        return
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            reference_check_value(item, f"{path}[{index}]")
        return
    raise InvalidArgument(
        f"{path} is a {type(value).__name__}, which an action cannot carry; "
        "use str, int, bool, None, lists and str-keyed mappings"
    )


def reference_canonical_bytes(obj: Any) -> bytes:
    """The encoder as first written: check everything, then copy to plain types, then dump."""

    def plain(value: Any) -> Any:
        from collections.abc import Mapping

        if isinstance(value, Mapping):
            return {key: plain(item) for key, item in value.items()}
        if isinstance(value, (tuple, list)):
            return [plain(item) for item in value]
        return value

    reference_check_value(obj, "value")
    return json.dumps(
        plain(obj), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


class Color(enum.StrEnum):
    RED = "red"


class Size(enum.IntEnum):
    BIG = 3


class Odd:
    pass


def random_value(rnd: random.Random, depth: int = 0) -> Any:
    def key() -> Any:
        if rnd.random() < 0.15:
            return rnd.choice([1, None, Color.RED, "k\udc80", True])
        return rnd.choice(["a", "b", "é", "z", "ключ"])

    kind = rnd.randrange(14 if depth < 4 else 8)
    if kind == 0:
        return rnd.choice([None, True, False])
    if kind == 1:
        return rnd.randrange(-(10**20), 10**20)
    if kind == 2:
        return rnd.choice(["", "x", "é☃", "a\ud800b", "\x00", "🙂"])
    if kind == 3:
        return rnd.choice([1.5, float("nan"), -0.0]) if rnd.random() < 0.3 else "f"
    if kind == 4:
        return rnd.choice([Color.RED, Size.BIG])
    if kind == 5:
        return Odd() if rnd.random() < 0.1 else "o"
    if kind in (6, 7):
        return rnd.choice(["s", 0])
    size = rnd.randrange(4)
    if kind in (8, 9):
        return {key(): random_value(rnd, depth + 1) for _ in range(size)}
    if kind == 10:
        return MappingProxyType({key(): random_value(rnd, depth + 1) for _ in range(size)})
    if kind == 11:
        return OrderedDict((key(), random_value(rnd, depth + 1)) for _ in range(size))
    if kind == 12:
        return [random_value(rnd, depth + 1) for _ in range(size)]
    return tuple(random_value(rnd, depth + 1) for _ in range(size))


def outcome(encode: Any, value: Any) -> tuple[str, Any]:
    try:
        return "ok", encode(value)
    except Exception as exc:
        return type(exc).__name__, str(exc)


def test_canonical_bytes_and_check_value_match_the_first_versions():
    rnd = random.Random(20261130)
    refused = 0
    for _ in range(20000):
        value = random_value(rnd)
        got, want = outcome(canonical_bytes, value), outcome(reference_canonical_bytes, value)
        assert got == want, value
        refused += got[0] != "ok"
        checked = outcome(lambda v: check_value(v, "arguments"), value)
        assert checked == outcome(lambda v: reference_check_value(v, "arguments"), value), value
    assert 1000 < refused < 19000  # both kinds of cases were exercised


# --------------------------------------------------------------------------- receipt hashing


def typed(value: Any) -> Any:
    """``value`` with every part's exact type spelled out (``1``, ``True`` and ``"1"`` differ)."""
    if isinstance(value, dict):
        return ("dict", [(typed(k), typed(v)) for k, v in value.items()])
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [typed(v) for v in value])
    return (type(value).__name__, repr(value))


def test_receipt_json_copy_is_the_json_round_trip():
    from ctrlrun.evidence.receipt import _compact, _json_copy

    rnd = random.Random(7)
    for _ in range(5000):
        value = {"v": random_value(rnd), "w": random_value(rnd)}
        want = outcome(lambda v: json.loads(_compact(v)), value)
        got = outcome(lambda v: _json_copy(v)[0], value)
        assert got[0] == want[0], value
        if got[0] == "ok":
            assert typed(got[1]) == typed(want[1]), value
            plain = _json_copy(value)[1]
            assert plain == ("float" not in repr(typed(want[1]))), value


def reference_chained(receipt: Receipt, seq: int, prev_hash: str) -> Receipt:
    placed = replace(receipt, seq=seq, prev_hash=prev_hash, hash=None)
    return replace(placed, hash=sha256_hex(reference_canonical_bytes(placed.to_dict())))


def receipts_to_hash() -> list[Receipt]:
    base = make_receipt()
    return [
        base,
        replace(base, arguments={"amount": 100, "nested": {"a": [1, True, None, "☃"]}}),
        replace(base, arguments=MappingProxyType({"k": (1, 2)}), would_have={"x": "y"}),
        replace(base, principal={"agent": "a", "claims": {"roles": ("r",)}}, controls=("c1",)),
        replace(base, approvers=({"user": "alice", "at": "t"},), budget_charges=({"c": 1},)),
        replace(base, extra={"future": {"k": [1]}, "also": "x"}),
        replace(base, extra={"seq": 99}),  # an extra key never overrides a field
        replace(base, execution=Color.RED, attempt=Size.BIG),
        replace(base, arguments={"amount": 1.5}),  # refused: a float
        replace(base, arguments={1: "a"}),  # a non-str key: JSON makes it "1", as it always did
        replace(base, approvers=({1: "a"},)),  # refused: a non-str key where JSON did not go
        replace(base, extra={"x": 2.5}),  # refused
        replace(base, execution=Odd()),  # refused: not a JSON type
        replace(base, error="lone \udc80 surrogate"),  # refused: not UTF-8
        replace(base, controls=(MappingProxyType({"k": "v"}),)),
        replace(base, would_have=looped()),  # refused: the JSON encoder finds the cycle
    ]


def looped() -> dict[str, Any]:
    loop: dict[str, Any] = {"a": 1}
    loop["self"] = [loop]
    return loop


@pytest.mark.parametrize("index", range(len(receipts_to_hash())))
def test_chained_matches_the_reference_and_stores_its_own_document(index):
    receipt = receipts_to_hash()[index]
    prev = "sha256:" + "1" * 64
    got, want = outcome(lambda r: r.chained(7, prev), receipt), outcome(
        lambda r: reference_chained(r, 7, prev), receipt
    )
    assert got[0] == want[0] and (got[0] != "ok" or got[1] == want[1])
    if got[0] != "ok":
        assert got == want
        return
    placed = got[1]
    assert placed.hash == want[1].hash and placed.hash == placed.chain_hash()
    assert (placed.seq, placed.prev_hash, placed.extra) == (7, prev, receipt.extra)
    again, document = receipt._placed(7, prev)
    assert again == placed and again.hash == placed.hash
    assert document == placed.to_dict()
    assert json.dumps(document, separators=(",", ":"), ensure_ascii=False) == placed.to_json()


def test_receipt_round_trip_still_verifies(store):
    def hashes(receipt: Receipt) -> bool:
        return outcome(lambda r: reference_chained(r, 1, ""), receipt)[0] == "ok"

    hashable = [r for r in receipts_to_hash() if hashes(r)]
    placed = [store.put_receipt(replace(r, receipt_id=new_id("ctr"))) for r in hashable]
    assert [r.seq for r in placed] == list(range(1, len(hashable) + 1)) and len(placed) >= 8
    assert verify_chain(store).ok
    assert [r.hash for r in store.receipts()] == [r.hash for r in placed]


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_taken_receipt_id_in_the_straight_finish_moves_no_head(tmp_path, clock, monkeypatch, kind):
    """The straight finish refuses a receipt whose id is stored and keeps none of it; what the
    pipeline then records, and the next call, chain after the head as stored."""
    from ctrlrun import InMemoryStateStore

    store = InMemoryStateStore(clock=clock) if kind == "memory" else SQLiteStateStore(
        tmp_path / "state.db", clock=clock
    )  # fmt: skip
    refund, runs = allowed_calls(store, clock)
    with context(agent="agent-1"):
        refund(payment_id="p0", amount=100)
        (first,) = store.receipts()
        with monkeypatch.context() as patched:
            patched.setattr("ctrlrun.control.straight.new_id", lambda prefix: first.receipt_id)
            with pytest.raises(InvalidArgument, match=first.receipt_id):
                refund(payment_id="p1", amount=100)
        refund(payment_id="p2", amount=100)
    receipts = store.receipts()
    assert receipts[0] == first and len({r.receipt_id for r in receipts}) == len(receipts)
    assert [r.seq for r in receipts] == list(range(1, len(receipts) + 1))
    assert [r.result for r in receipts][::len(receipts) - 1] == ["committed", "committed"]
    assert verify_chain(store).ok and store.chain_head()[0] == len(receipts)
