"""A committed key refused to the very action that committed it hands back what it returned.

``EffectRecord.action_hash`` names the action whose attempt holds or settled the key;
``result_exact`` says the stored result is the returned value type for type.
``DuplicateEffect(committed).replayable`` is both, for the refused call's action; ``result`` is
the stored value then, else ``None``. Runs on every store.
"""

from __future__ import annotations

import pickle
import sqlite3
from datetime import timedelta

import pytest

from ctrlrun import Control, DuplicateEffect, Policy, context, protect
from ctrlrun.action import Action, Principal
from ctrlrun.effects.records import EffectRecord, EffectState, plan_reservation, stored_result
from ctrlrun.store import SQLiteStateStore

POLICY = """
schema: ctrlrun.policy/v2
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    rules:
      - decision: allow
"""


def refund_with(control: Control, returned: object):
    @protect("stripe.refund", control=control)
    def refund(payment_id: str, amount: int) -> object:
        return returned

    return refund


def refused(call, *args) -> DuplicateEffect:
    with pytest.raises(DuplicateEffect) as caught:
        call(*args)
    assert caught.value.state == "committed"
    return caught.value


def test_the_same_action_replays_its_exact_result(store, clock):
    control = Control(Policy.from_yaml(POLICY), store, clock=clock)
    refund = refund_with(control, {"id": "re_1", "amounts": [1, 2], "meta": {"ok": True}})
    with context(agent="support-agent"):
        assert refund("txn_1", 100) == {"id": "re_1", "amounts": [1, 2], "meta": {"ok": True}}
        again = refused(refund, "txn_1", 100)
    record = store.get_effect("refund:txn_1")
    receipt = store.receipts()[0]
    assert record.action_hash == receipt.action_hash and record.result_exact is True
    assert again.replayable is True
    assert again.result == {"id": "re_1", "amounts": [1, 2], "meta": {"ok": True}}
    assert [r.result for r in store.receipts()] == ["committed", "blocked"]
    # it survives the trip a durable engine gives it
    back = pickle.loads(pickle.dumps(again))
    assert (back.replayable, back.result, back.effect_key) == (True, again.result, "refund:txn_1")


def test_another_action_on_the_same_key_is_not_replayed(store, clock):
    control = Control(Policy.from_yaml(POLICY), store, clock=clock)
    refund = refund_with(control, {"id": "re_1"})
    with context(agent="support-agent"):
        refund("txn_1", 100)
        other = refused(refund, "txn_1", 250)  # same key, other arguments: another action
        with context(agent="another-agent"):
            by_another = refused(refund, "txn_1", 100)  # another principal: another action
    assert (other.replayable, other.result) == (False, None)
    assert (by_another.replayable, by_another.result) == (False, None)


@pytest.mark.parametrize(
    "returned",
    [
        ("re_1", 2),  # a tuple comes back a list
        {1: "a"},  # an int key comes back text
        {"when": object()},  # no JSON at all: stored as its repr
        [1.5, {"x": (1,)}],  # a tuple inside
    ],
    ids=["tuple", "int-key", "repr", "nested-tuple"],
)
def test_a_result_the_store_cannot_give_back_exactly_is_not_replayed(store, clock, returned):
    control = Control(Policy.from_yaml(POLICY), store, clock=clock)
    refund = refund_with(control, returned)
    with context(agent="support-agent"):
        refund("txn_1", 100)
        again = refused(refund, "txn_1", 100)
    assert store.get_effect("refund:txn_1").result_exact is False
    assert (again.replayable, again.result) == (False, None)


def test_a_none_result_replays_as_none(store, clock):
    control = Control(Policy.from_yaml(POLICY), store, clock=clock)
    refund = refund_with(control, None)
    with context(agent="support-agent"):
        refund("txn_1", 100)
        again = refused(refund, "txn_1", 100)
    assert (again.replayable, again.result) == (True, None)


def test_a_key_resolved_by_hand_is_not_replayed(store, clock):
    control = Control(Policy.from_yaml(POLICY), store, clock=clock)

    @protect("stripe.refund", control=control)
    def refund(payment_id: str, amount: int) -> dict:
        raise TimeoutError("the provider never answered")

    with context(agent="support-agent"):
        with pytest.raises(TimeoutError):
            refund("txn_1", 100)
        assert store.get_effect("refund:txn_1").state is EffectState.AMBIGUOUS
        store.resolve_effect("refund:txn_1", "committed", "ops@example.com")
        again = refused(refund, "txn_1", 100)
    record = store.get_effect("refund:txn_1")
    assert record.action_hash is not None and record.result_exact is False
    assert (again.replayable, again.result) == (False, None)


def test_the_reservation_keeps_the_hash_of_the_action_that_holds_the_key(store):
    store.reserve_effect("k", "act_1", timedelta(minutes=5), action_hash="sha256:" + "a" * 64)
    assert store.get_effect("k").action_hash == "sha256:" + "a" * 64
    store.begin_execution("k", "act_1")
    store.commit_effect("k", "act_1", {"n": 1})
    record = store.get_effect("k")
    assert (record.state, record.result, record.result_exact) == (EffectState.COMMITTED, {"n": 1}, True)


def test_the_rule_replays_only_the_committing_action(clock):
    now = clock()
    record = EffectRecord("k", EffectState.COMMITTED, "act_1", 1, now, now, None, {"id": 1},
                          action_hash="sha256:a", result_exact=True)  # fmt: skip
    same = plan_reservation(record, "k", "act_2", timedelta(minutes=5), now, action_hash="sha256:a")
    other = plan_reservation(record, "k", "act_2", timedelta(minutes=5), now, action_hash="sha256:b")
    unknown = plan_reservation(record, "k", "act_2", timedelta(minutes=5), now)
    assert isinstance(same.error, DuplicateEffect) and same.error.replayable and same.error.result == {"id": 1}
    for plan in (other, unknown):
        assert isinstance(plan.error, DuplicateEffect)
        assert (plan.error.replayable, plan.error.result) == (False, None)
    older = EffectRecord("k", EffectState.COMMITTED, "act_1", 1, now, now, None, {"id": 1})
    assert not plan_reservation(older, "k", "act_2", timedelta(minutes=5), now).error.replayable  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "value, exact",
    [
        (None, True), ("a", True), (1, True), (True, True), (1.25, True),
        ({"a": [1, {"b": None}]}, True), ([], True),
        ((1,), False), ({1: 2}, False), (float("nan"), False), (object(), False),
        ({"a": (1,)}, False), (b"x", False),
    ],
)  # fmt: skip
def test_exactness_is_type_for_type(value, exact):
    assert stored_result(value)[1] is exact


def test_a_store_from_before_keeps_its_committed_keys_unreplayable(tmp_path, clock):
    path = tmp_path / "state.db"
    control = Control(Policy.from_yaml(POLICY), SQLiteStateStore(path, clock=clock), clock=clock)
    refund = refund_with(control, {"id": "re_1"})
    with context(agent="support-agent"):
        refund("txn_1", 100)
    control.store.close()
    with sqlite3.connect(path) as db:  # as the row was written before the two columns existed
        db.execute("UPDATE effects SET action_hash = NULL, result_exact = NULL")
    store = SQLiteStateStore(path, clock=clock)
    control = Control(Policy.from_yaml(POLICY), store, clock=clock)
    refund = refund_with(control, {"id": "re_1"})
    with context(agent="support-agent"):
        again = refused(refund, "txn_1", 100)
    assert store.get_effect("refund:txn_1").action_hash is None
    assert (again.replayable, again.result) == (False, None)
    store.close()


def test_actions_with_equal_content_share_a_hash():
    one = Action("stripe.refund", {"payment_id": "t", "amount": 1}, Principal("a"))
    two = Action("stripe.refund", {"amount": 1, "payment_id": "t"}, Principal("a"))
    assert one.action_hash == two.action_hash and one.action_id != two.action_id
