"""``ctrlrun resolve`` and ``ctrlrun effects``."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

import ctrlrun
from ctrlrun import EffectState
from ctrlrun._time import format_ts
from ctrlrun.evidence.receipt import EventType

from ._cli_helpers import invoke, later


def _snapshot(project, key):
    return project.store.get_effect(key), len(project.store.events()), len(project.store.receipts())


def test_resolve_committed(project):
    key = project.ambiguous("txn_30")
    record = project.store.get_effect(key)
    events, receipts = len(project.store.events()), len(project.store.receipts())
    result = invoke(["resolve", key, "--committed"], clock=project.clock)
    assert result.code == 0, result.err
    assert result.out == "refund:txn_30 resolved committed by cli:local\n"
    resolved = project.store.get_effect(key)
    assert resolved.state is EffectState.COMMITTED and resolved.resolved_by == "cli:local"
    assert len(project.store.receipts()) == receipts  # an event, never a receipt
    assert len(project.store.events()) == events + 1
    event = project.store.events()[-1]
    assert event.type is EventType.EFFECT_RESOLVED
    assert event.action_id == record.action_id and event.effect_key == key
    assert dict(event.data) == {"state": "committed", "resolver": "cli:local", "resolved_by": "human"}
    assert list(event.data) == ["state", "resolver", "resolved_by"]
    with pytest.raises(ctrlrun.DuplicateEffect):
        project.call(payment_id="txn_30", amount=1_000)


def test_resolve_failed_permits_a_retry(project):
    key = project.ambiguous("txn_7")
    result = invoke(["resolve", key, "--failed"], clock=project.clock)
    assert result.code == 0, result.err
    assert result.lines == [
        "refund:txn_7 resolved failed by cli:local",
        "a retry of this effect is now permitted",
    ]
    assert project.store.events()[-1].data["state"] == "failed"
    project.call(payment_id="txn_7", amount=1_000)
    assert project.store.get_effect(key).attempt == 2
    assert len(project.remote) == 2


@pytest.mark.parametrize("flags", [[], ["--committed", "--failed"]])
def test_resolve_needs_exactly_one_flag(project, flags):
    key = project.ambiguous()
    before = _snapshot(project, key)
    result = invoke(["resolve", key, *flags], clock=project.clock)
    assert result.code == 2
    assert "Usage:" in result.err and "--committed" in result.err
    assert _snapshot(project, key) == before


def test_resolve_unknown_key(project):
    result = invoke(["resolve", "refund:nope", "--failed"], clock=project.clock)
    assert result.code == 1
    assert result.err.startswith("Error: no effect refund:nope")
    assert project.store.events() == ()


@pytest.mark.parametrize("flag", ["--committed", "--failed"])
def test_resolve_refuses_an_effect_that_is_not_ambiguous(project, flag):
    project.call(payment_id="txn_1", amount=100)
    before = _snapshot(project, "refund:txn_1")
    result = invoke(["resolve", "refund:txn_1", flag], clock=project.clock)
    assert result.code == 1
    assert result.err.startswith("Error: effect refund:txn_1 is committed, not ambiguous")
    assert _snapshot(project, "refund:txn_1") == before


def test_resolve_twice(project):
    key = project.ambiguous()
    assert invoke(["resolve", key, "--committed"], clock=project.clock).code == 0
    again = invoke(["resolve", key, "--failed"], clock=project.clock)
    assert again.code == 1 and "is committed, not ambiguous" in again.err


def test_resolve_refuses_a_reserved_record(project):
    project.store.reserve_effect("job:1", "act_x")
    result = invoke(["resolve", "job:1", "--failed"], clock=project.clock)
    assert result.code == 1 and "job:1 is reserved" in result.err


# ------------------------------------------------------------------- effects


def test_effects_lists_records_in_creation_order(project):
    project.call(payment_id="txn_1", amount=100)
    project.clock.advance(seconds=1)
    key = project.ambiguous("txn_2")
    project.clock.advance(seconds=1)
    project.store.reserve_effect("job:run", "act_holder", lease=timedelta(minutes=5))
    project.store.begin_execution("job:run", "act_holder")
    invoke(["resolve", key, "--failed"], clock=project.clock)
    one = project.store.get_effect("refund:txn_1")
    two = project.store.get_effect(key)
    result = invoke(["effects"], clock=project.clock)
    assert result.code == 0, result.err
    assert result.lines == [
        f"refund:txn_1  committed  attempt 1  {one.action_id}  2026-11-30T09:00:00.000Z",
        f"refund:txn_2  failed  attempt 1  {two.action_id}  2026-11-30T09:00:02.000Z  "
        "resolved by cli:local",
        "job:run  executing  attempt 1  act_holder  2026-11-30T09:00:02.000Z",
    ]
    lapsed = invoke(["effects", "--state", "executing"], clock=later(project.clock, minutes=5, seconds=1))
    assert lapsed.lines == [
        "job:run  executing  attempt 1  act_holder  2026-11-30T09:00:02.000Z  (lease expired)"
    ]
    assert project.store.get_effect("job:run").state is EffectState.EXECUTING  # a read moves nothing


def test_effects_filters_by_state(project):
    project.call(payment_id="txn_1", amount=100)
    project.ambiguous("txn_2")
    result = invoke(["effects", "--state", "ambiguous"], clock=project.clock)
    assert [line.split("  ")[:2] for line in result.lines] == [["refund:txn_2", "ambiguous"]]
    assert invoke(["effects", "--state", "failed"], clock=project.clock).out == "no effects are failed\n"
    assert invoke(["effects", "--state", "new"], clock=project.clock).out == "no effects are new\n"


def test_effects_json(project):
    project.call(payment_id="txn_1", amount=100)
    project.clock.advance(seconds=1)
    key = project.ambiguous("txn_2")
    project.clock.advance(seconds=1)
    project.store.reserve_effect("job:run", "act_holder", lease=timedelta(minutes=5))
    project.store.begin_execution("job:run", "act_holder")
    invoke(["resolve", key, "--committed"], clock=project.clock)
    one, two = project.store.get_effect("refund:txn_1"), project.store.get_effect(key)
    result = invoke(["effects", "--json"], clock=later(project.clock, minutes=5, seconds=1))
    assert result.code == 0 and result.err == ""
    documents = [json.loads(line) for line in result.lines]
    assert list(documents[0]) == [
        "effect_key", "state", "attempt", "action_id", "action_hash", "created_at", "updated_at",
        "lease_expires_at", "lease_expired", "resolved_by", "error", "result_exact", "budget_charges",
    ]  # fmt: skip
    assert all(document["budget_charges"] == [] for document in documents)  # no authority
    assert [{k: v for k, v in d.items() if k != "budget_charges"} for d in documents] == [
        {"effect_key": "refund:txn_1", "state": "committed", "attempt": 1, "action_id": one.action_id,
         "created_at": "2026-11-30T09:00:00.000Z", "updated_at": "2026-11-30T09:00:00.000Z",
         "lease_expires_at": None, "lease_expired": False, "resolved_by": None, "error": None,
         "action_hash": one.action_hash, "result_exact": True},
        {"effect_key": "refund:txn_2", "state": "committed", "attempt": 1, "action_id": two.action_id,
         "created_at": "2026-11-30T09:00:01.000Z", "updated_at": format_ts(two.updated_at),
         "lease_expires_at": None, "lease_expired": False, "resolved_by": "cli:local",
         "error": two.error, "action_hash": two.action_hash, "result_exact": False},
        {"effect_key": "job:run", "state": "executing", "attempt": 1, "action_id": "act_holder",
         "created_at": "2026-11-30T09:00:02.000Z", "updated_at": "2026-11-30T09:00:02.000Z",
         "lease_expires_at": "2026-11-30T09:05:02.000Z", "lease_expired": True, "resolved_by": None,
         "error": None, "action_hash": None, "result_exact": False},
    ]  # fmt: skip
    assert all(line == json.dumps(d, separators=(",", ":"), ensure_ascii=False)
               for line, d in zip(result.lines, documents))  # fmt: skip
    filtered = invoke(["effects", "--json", "--state", "executing"], clock=project.clock)
    assert [json.loads(line)["effect_key"] for line in filtered.lines] == ["job:run"]


def test_effects_empty(project):
    assert invoke(["effects"], clock=project.clock).out == "no effects yet\n"
    for flags, note in ((["--json"], "no effects yet\n"), (["--json", "--state", "new"], "no effects are new\n")):
        result = invoke(["effects", *flags], clock=project.clock)  # stdout is for programs only
        assert (result.code, result.out, result.err) == (0, "", note)


def test_effects_rejects_an_unknown_state(project):
    result = invoke(["effects", "--state", "done"], clock=project.clock)
    assert result.code == 2 and "Usage:" in result.err
