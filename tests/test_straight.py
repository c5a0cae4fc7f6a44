"""The allowed call's straight path writes what the pipeline writes: the same events, and a
receipt whose stored line and hash are byte for byte what ``Receipt`` gives for its values."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctrlrun import Control, InMemoryStateStore, Policy, context, protect
from ctrlrun.action import Action, Principal
from ctrlrun.receipt import Receipt, verify_chain

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  shop.refund:
    effect: "refund:{order}"
    resource: "order/{order}"
    rules:
      - when: { amount_lte: 1000 }
        decision: allow
      - decision: deny
"""

text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
leaf = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), text)
nested = st.recursive(
    leaf, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=8,
)  # fmt: skip


def _protected(store: Any, **options: Any) -> Any:
    control = Control(Policy.from_yaml(POLICY), store)

    @protect("shop.refund", control=control, **options)
    def refund(order: str, amount: int, note: Any = None) -> dict[str, Any]:
        return {"order": order, "note": note}

    return control, refund


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(order=text.filter(bool), amount=st.integers(-5, 1000), note=nested,
       user=st.one_of(st.none(), st.from_regex(r"[a-z\u00fc]{1,6}", fullmatch=True)))  # fmt: skip
def test_straight_receipt_is_the_receipt_class_byte_for_byte(order, amount, note, user):
    store = InMemoryStateStore()
    _, refund = _protected(store, task="t-{order}")
    with context(agent="agent-ü", user=user):
        assert refund(order=order, amount=amount, note=note) == {"order": order, "note": note}
    (stored,) = store.receipts()
    assert stored.result == "committed" and stored.task == f"t-{order}"
    assert stored.arguments == json.loads(json.dumps({"amount": amount, "note": note, "order": order}))
    rebuilt, _ = Receipt.from_dict(stored.to_dict())._placed(stored.seq, stored.prev_hash)
    assert rebuilt.to_json() == stored.to_json() and rebuilt.hash == stored.hash
    assert verify_chain(store).ok


def test_a_call_sites_kept_formats_write_each_calls_own_receipt():
    """The formats kept for one protected function (its name written, and its null resource)
    serve its next calls: each receipt is still the Receipt class's, ``%`` in any text kept."""
    store = InMemoryStateStore()
    policy = Policy.from_yaml(POLICY.replace('    resource: "order/{order}"\n', ""))
    control = Control(policy, store, environment="prod%(x)s%%")
    refund = protect("shop.refund", control=control, task="t-%(hop)s%")(
        lambda order, amount: {"order": order}
    )
    orders = ["o-%(seq)s", "o-%", "o-%%(hop)s", "o-4"]
    with context(agent="agent-%(receipt_id)s", user="%%u"):
        for order in orders:
            refund(order=order, amount=5)
    receipts = store.receipts()
    assert [r.effect_key for r in receipts] == [f"refund:{o}" for o in orders]
    assert {(r.task, r.environment, r.principal.agent, r.principal.user) for r in receipts} == {
        ("t-%(hop)s%", "prod%(x)s%%", "agent-%(receipt_id)s", "%%u")
    }
    for stored in receipts:
        rebuilt, _ = Receipt.from_dict(stored.to_dict())._placed(stored.seq, stored.prev_hash)
        assert rebuilt.to_json() == stored.to_json() and rebuilt.hash == stored.hash
    assert verify_chain(store).ok


def test_straight_path_writes_the_pipelines_events_and_receipt():
    """One call by ``@protect`` (straight) and the same action through ``Control.run`` (the
    pipeline): equal events and receipts but for ids and times."""
    store = InMemoryStateStore()
    control, refund = _protected(store)
    with context(agent="agent-1"):
        refund(order="o-1", amount=5)
    action = Action("shop.refund", {"order": "o-2", "amount": 5, "note": None},
                    Principal("agent-1"), "order/o-2")  # fmt: skip
    control.run(action, lambda: {"order": "o-2", "note": None}, "refund:o-2")
    first, second = store.receipts()
    skip = {"receipt_id", "action_id", "action_hash", "arguments", "effect_key", "resource",
            "started_at", "finished_at", "seq", "prev_hash"}  # fmt: skip
    assert {k: v for k, v in first.to_dict().items() if k not in skip} == {
        k: v for k, v in second.to_dict().items() if k not in skip
    }
    events = store.events()
    shapes = [(e.type, tuple(e.data)) for e in events]
    assert shapes[:5] == shapes[5:] and len(events) == 10
    assert verify_chain(store).ok


def test_sinks_get_objects_built_from_the_rows():
    store = InMemoryStateStore()
    seen: list[Any] = []

    class Sink:
        def on_event(self, event):
            seen.append(event)

        def on_receipt(self, receipt):
            seen.append(receipt)

    control = Control(Policy.from_yaml(POLICY), store, sinks=(Sink(),))

    @protect("shop.refund", control=control)
    def refund(order: str, amount: int) -> str:
        return "ok"

    with context(agent="agent-1"):
        refund("o-1", amount=7)
    assert [type(x).__name__ for x in seen] == ["Event"] * 5 + ["Receipt"]
    assert list(store.events()) == seen[:5]
    assert seen[5].to_json() == store.receipts()[0].to_json() and seen[5].hash


ascii_text = st.text(st.characters(min_codepoint=0, max_codepoint=127), max_size=8)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(ascii_text, st.one_of(st.none(), st.booleans(), st.integers(), ascii_text,
                                             text), max_size=6))  # fmt: skip
def test_flat_arguments_take_a_shortcut_to_the_same_canonical_form(arguments):
    """A plain dict of flat ASCII values skips the general checks; a read-only mapping of the
    same values takes them. Both give the same canonical bytes, hash and frozen arguments."""
    from types import MappingProxyType

    principal = Principal("agent-1", "u")
    short = Action("a.b", dict(arguments), principal, action_id="act_1")
    general = Action("a.b", MappingProxyType(dict(arguments)), principal, action_id="act_1")
    assert short._canonical == general._canonical and short.action_hash == general.action_hash
    assert dict(short.arguments) == dict(general.arguments)
    assert short._arguments_json == general._arguments_json
    assert short.canonical_arguments == general.canonical_arguments


def _draft() -> Any:
    """A receipt draft with every key of the document written (constants and values alike)."""
    from ctrlrun.evidence.drafts import ReceiptDraft, receipt_formats
    from ctrlrun.evidence.receipt import _DOCUMENT_KEYS

    constants = {key: None for key in _DOCUMENT_KEYS if key not in ("receipt_id", "principal", "seq", "prev_hash")}
    constants.update(schema="ctrlrun.receipt/v8", result="committed", controls=[], approvers=[],
                     budget_charges=[])  # fmt: skip
    values = {"receipt_id": '"ctr_1"', "principal": '{"agent":"a"}',
              "principal_sorted": '{"agent":"a"}'}  # fmt: skip
    return ReceiptDraft(values, receipt_formats(constants), receipt_id="ctr_1", action_id="act_1",
                        effect_key="k", result="committed", finished_at="t1")  # fmt: skip


def _same_moment_clock() -> Any:
    from datetime import datetime, timezone

    moment = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
    return lambda: moment


@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(result=nested, taken=st.booleans(), moved=st.booleans(), sink=st.booleans())
def test_the_memory_stores_two_shortcuts_write_what_its_general_path_writes(result, taken, moved, sink):
    from ctrlrun.effects.records import EffectState
    from ctrlrun.store.ops import StoreOps

    def run(store: InMemoryStateStore, start: Any, finish: Any) -> Any:
        def rows(approval: Any, reservation: Any) -> list[Any]:
            return [("t0", "EFFECT_RESERVED", "act_1", "k", None, '{"attempt":%d}' % reservation.attempt)]

        outcomes: list[Any] = []
        if taken:  # a key another attempt holds: the shortcut gives way to the general path
            StoreOps.start_attempt(store, action_id="act_0", effect_key="k", events=rows)
        try:
            outcomes.append(start(store, action_id="act_1", effect_key="k", events=rows,
                                  return_events=sink))  # fmt: skip
        except Exception as exc:
            outcomes.append(repr(exc))
        if moved:  # the record is no longer as the finishing attempt left it
            try:
                StoreOps.finish_attempt(store, effect_key="k", action_id="act_1",
                                        outcome=EffectState.FAILED, error="gone")  # fmt: skip
            except Exception as exc:  # act_1 holds nothing when the key was taken
                outcomes.append(repr(exc))
        draft = _draft()
        try:
            events, placed = finish(
                store, effect_key="k", action_id="act_1", outcome=EffectState.COMMITTED,
                result=result, events=(("t1", "EXECUTION_COMMITTED", "act_1", "k", None, "{}"),),
                receipt=draft, return_events=sink,
            )  # fmt: skip
            outcomes.append((events, placed.line, placed.hash))
        except Exception as exc:
            outcomes.append(repr(exc))
        data = store._data
        return outcomes, data.effects, data.events, data.receipts, data.head, store.transactions

    shortcut = run(InMemoryStateStore(clock=_same_moment_clock()),
                   InMemoryStateStore.start_attempt, InMemoryStateStore.finish_attempt)  # fmt: skip
    general = run(InMemoryStateStore(clock=_same_moment_clock()),
                  StoreOps.start_attempt, StoreOps.finish_attempt)  # fmt: skip
    assert shortcut == general


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(ascii_text, st.one_of(st.none(), st.booleans(), st.integers(), ascii_text,
                                             text), max_size=6))  # fmt: skip
def test_a_flat_result_is_stored_as_the_compact_encoder_writes_it(result):
    """A flat object returned by the function takes a shortcut to its column text: the same
    text, keys in their order, as the encoder gives."""
    from ctrlrun.store.codec import _UTF8_JSON, dumps

    assert dumps(result, "result") == _UTF8_JSON.encode(result)
    assert json.loads(dumps(result, "result")) == result


@settings(max_examples=300, deadline=None)
@given(st.one_of(nested, st.floats(allow_nan=True), st.tuples(leaf, leaf),
                 st.dictionaries(ascii_text, st.one_of(leaf, st.floats()), max_size=4)))  # fmt: skip
def test_a_results_columns_are_what_its_stored_form_encodes_to(result):
    """The columns written straight from a returned value are those of its stored form: the
    JSON text of ``stored_result`` and whether it is exact, for flat objects and all the rest."""
    from ctrlrun.effects.records import stored_result
    from ctrlrun.store.codec import dumps, result_columns

    stored, exact = stored_result(result)
    assert result_columns(result) == (None if stored is None else dumps(stored, "result"), int(exact))


def test_the_default_clock_reads_aware_utc_now():
    from datetime import datetime, timezone

    from ctrlrun._time import utc_now

    before = datetime.now(timezone.utc)
    moment = utc_now()
    assert type(moment) is datetime and moment.tzinfo is timezone.utc
    assert before <= moment <= datetime.now(timezone.utc)


def _sqlite_tables(path: Any) -> dict[str, list[Any]]:
    import sqlite3

    conn = sqlite3.connect(path)
    try:
        return {table: conn.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()
                for table in ("effects", "events", "receipts", "receipt_chain")}  # fmt: skip
    finally:
        conn.close()


@settings(max_examples=25, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(result=nested, taken=st.booleans(), moved=st.booleans(), sink=st.booleans())
def test_the_sqlite_stores_two_shortcuts_write_what_its_general_path_writes(result, taken, moved, sink):
    """The SQLite store's straight start and finish leave the same rows, answers and refusals as
    the general path, also when the key is taken or the record moved before the finish."""
    import tempfile
    from pathlib import Path

    from ctrlrun import SQLiteStateStore
    from ctrlrun.effects.records import EffectState
    from ctrlrun.store.ops import StoreOps

    def run(start: Any, finish: Any) -> Any:
        path = Path(tempfile.mkdtemp()) / "state.db"
        store = SQLiteStateStore(path, durability="normal", clock=_same_moment_clock())

        def rows(approval: Any, reservation: Any) -> list[Any]:
            return [("t0", "EFFECT_RESERVED", "act_1", "k", None, '{"attempt":%d}' % reservation.attempt)]

        outcomes: list[Any] = []
        if taken:
            StoreOps.start_attempt(store, action_id="act_0", effect_key="k", events=rows)
        try:
            outcomes.append(start(store, action_id="act_1", effect_key="k", events=rows,
                                  return_events=sink))  # fmt: skip
        except Exception as exc:
            outcomes.append(repr(exc))
        if moved:
            try:
                StoreOps.finish_attempt(store, effect_key="k", action_id="act_1",
                                        outcome=EffectState.FAILED, error="gone")  # fmt: skip
            except Exception as exc:
                outcomes.append(repr(exc))
        draft = _draft()
        try:
            events, placed = finish(
                store, effect_key="k", action_id="act_1", outcome=EffectState.COMMITTED,
                result=result, events=(("t1", "EXECUTION_COMMITTED", "act_1", "k", None, "{}"),),
                receipt=draft, return_events=sink,
            )  # fmt: skip
            outcomes.append((events, placed.line, placed.hash))
        except Exception as exc:
            outcomes.append(repr(exc))
        transactions = store.transactions
        store.close()
        return outcomes, _sqlite_tables(path), transactions

    shortcut = run(SQLiteStateStore.start_attempt, SQLiteStateStore.finish_attempt)
    general = run(StoreOps.start_attempt, StoreOps.finish_attempt)
    assert shortcut == general


_form_text = st.lists(st.sampled_from(list('ab{}"\'\\%\n`') + ['"""', "{x}", "%(k)"]), max_size=8).map("".join)


@settings(max_examples=200, deadline=None)
@given(texts=st.lists(_form_text, min_size=1, max_size=5),
       values=st.lists(st.text(max_size=8), min_size=4, max_size=4))  # fmt: skip
def test_a_compiled_writer_writes_what_the_percent_format_writes(texts, values):
    """Whatever the constant texts hold (quotes, braces, backslashes, ``%``), the compiled
    writer joins the same text as ``form % values``."""
    from ctrlrun.evidence.drafts import writer

    keys = ["seq", "prev_hash", "k_1", "action"]
    form = "".join(text.replace("%", "%%") + (f"%({keys[i]})s" if i < len(texts) - 1 else "")
                   for i, text in enumerate(texts))  # fmt: skip
    mapping = dict(zip(keys, values))
    assert writer(form, compiled=True)(mapping) == writer(form)(mapping) == form % mapping
