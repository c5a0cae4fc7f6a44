"""The operator acts chain: every act appends to it in its own transaction, and
``receipts --verify-chain`` cross-checks receipts against it."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import update

from ctrlrun import Control, Policy, context, protect, with_approval
from ctrlrun.evidence.acts import ActKind, act_document, act_hash
from ctrlrun.approvals.answers import resolve_events
from ctrlrun.receipt import verify_chain
from ctrlrun.errors import ApprovalRequired
from ctrlrun.store.memory import InMemoryStateStore
from ctrlrun.store.sqlite import SQLiteStateStore
from ctrlrun.store.verifymark import verify_and_mark

from ._cli_helpers import invoke, sql
from .policies import REFUND_POLICY


class World:
    """A Control over ``store`` with the refund policy: allow ≤ 50,000, approve ≤ 500,000."""

    def __init__(self, store, clock):
        self.store = store
        self.control = Control(Policy.from_yaml(REFUND_POLICY), store, clock=clock)
        self.lose = False

        @protect("stripe.refund", effect="refund:{payment_id}", control=self.control)
        def refund(payment_id: str, amount: int) -> str:
            if self.lose:
                raise TimeoutError("reply lost")
            return f"re_{payment_id}"

        self.refund = refund

    def call(self, payment_id, amount, approval=None):
        with context(agent="support-agent"):
            if approval is None:
                return self.refund(payment_id, amount)
            with with_approval(approval):
                return self.refund(payment_id, amount)

    def ask(self, payment_id, amount=400_000):
        with pytest.raises(ApprovalRequired) as info:
            self.call(payment_id, amount)
        return info.value.request_id

    def ambiguous(self, payment_id):
        self.lose = True
        with pytest.raises(TimeoutError):
            self.call(payment_id, 1_000)
        self.lose = False
        return f"refund:{payment_id}"


@pytest.fixture
def world(store, clock):
    return World(store, clock)


def _names(report):
    return [b.name for b in report.breaks]


def _forge(store, table, key_column, key, **values):
    """Edit one row behind the store's back, as SQL (or a debugger on a memory store) would."""
    if isinstance(store, InMemoryStateStore):
        rows = {"approvals": store._data.approvals, "effects": store._data.effects}[table]
        rows[key].update(values)
        return
    from ctrlrun.store import schema

    t = getattr(schema, table)
    with store.engine.connect() as conn:
        conn.execute(update(t).where(t.c[key_column] == key).values(**values))
        conn.commit()


def test_every_operator_act_is_chained_in_order(world):
    store = world.store
    granted = world.ask("txn_1")
    store.grant_approval(granted, "alice")
    denied = world.ask("txn_2")
    store.deny_approval(denied, "bob")
    key = world.ambiguous("txn_3")
    store.resolve_effect(key, "failed", "carol", events=resolve_events("carol", "human"))
    store.place_hold("legal-1", 1, None, reason="litigation", by="dana")
    store.release_hold("legal-1", by="erin")
    acts = list(store.iter_acts())
    assert [(a.kind, a.subject, a.by) for a in acts] == [
        ("grant", granted, "alice"), ("deny", denied, "bob"), ("resolve", key, "carol"),
        ("hold_place", "legal-1", "dana"), ("hold_release", "legal-1", "erin"),
    ]  # fmt: skip
    assert [a.seq for a in acts] == [1, 2, 3, 4, 5]
    previous = "sha256:" + "0" * 64
    for act in acts:  # each hashes to its stored hash and points back to the one before
        document = act_document(act.seq, act.prev_hash, act.kind, act.subject, act.by, act.at,
                                act.receipt_seq, act.detail)  # fmt: skip
        assert act_hash(document) == act.hash == act.rehash() and act.prev_hash == previous
        previous = act.hash
    assert acts[0].detail["action_hash"] == store.get_approval(granted).action_hash
    assert acts[2].detail == {"state": "failed", "attempt": 1, "action_id": store.get_effect(key).action_id}
    assert store.acts_head() == (5, acts[-1].hash)
    report = verify_chain(store)
    assert report.ok, report.breaks
    assert (report.acts_verified, report.acts_head_seq, report.not_covered) == (5, 5, None)


def test_the_allowed_call_writes_no_act(world):
    for n in range(5):
        world.call(f"txn_{n}", 100)
    assert world.store.acts_head()[0] == 0 and verify_chain(world.store).ok


def test_a_spent_grant_verifies(world):
    request_id = world.ask("txn_1")
    world.store.grant_approval(request_id, "alice")
    assert world.call("txn_1", 400_000, approval=request_id) == "re_txn_1"
    report = verify_chain(world.store)
    assert report.ok, report.breaks


def test_an_approval_forged_and_spent_is_approval_unrecorded(world):
    store = world.store
    request_id = world.ask("txn_1")
    _forge(store, "approvals", "approval_id", request_id, status="granted", approver="mallory",
           granted_at="2026-11-30T09:00:00.000000Z")  # fmt: skip
    assert world.call("txn_1", 400_000, approval=request_id) == "re_txn_1"  # the forgery works...
    report = verify_chain(store)  # ...and the cross-check names it
    assert _names(report) == ["approval_unrecorded"]
    (found,) = report.breaks
    assert found.seq == store.chain_head()[0] and request_id in found.detail and "mallory" in found.detail
    assert not report.ok and json.loads(json.dumps(report.to_dict()))["ok"] is False


def test_a_grant_by_someone_else_does_not_cover_the_spend(world):
    """The act must name the approver the receipt names."""
    store = world.store
    request_id = world.ask("txn_1")
    store.grant_approval(request_id, "alice")
    _forge(store, "approvals", "approval_id", request_id, approver="mallory")
    world.call("txn_1", 400_000, approval=request_id)
    assert _names(verify_chain(store)) == ["approval_unrecorded"]


@pytest.mark.parametrize("how", ["state only", "state and resolver"])
def test_an_effect_resolved_through_sql_is_resolution_unrecorded(world, how):
    store = world.store
    key = world.ambiguous("txn_1")
    values = {"state": "committed"}
    if how == "state and resolver":
        values["resolved_by"] = "cli:local"
    _forge(store, "effects", "effect_key", key, **values)
    report = verify_chain(store)
    assert _names(report) == ["resolution_unrecorded"]
    (found,) = report.breaks
    assert found.seq == store.chain_head()[0] and key in found.detail


def test_a_resolve_act_covers_the_resolution(world):
    key = world.ambiguous("txn_1")
    world.store.resolve_effect(key, "committed", "cli:local")
    assert verify_chain(world.store).ok


def test_an_edited_act_is_content_altered(tmp_path, clock):
    store = SQLiteStateStore(tmp_path / "s.db", clock=clock)
    world = World(store, clock)
    store.grant_approval(world.ask("txn_1"), "alice")
    store.deny_approval(world.ask("txn_2"), "bob")
    text = sql(store._path, "SELECT json FROM acts WHERE seq = 1")[0][0]
    sql(store._path, "UPDATE acts SET json = ? WHERE seq = 1", text.replace("alice", "mallory"))
    report = verify_chain(store)
    assert _names(report) == ["content_altered", "link_broken"] and report.breaks[0].seq == 1
    assert report.breaks[0].detail.startswith("acts chain:")
    sql(store._path, "DELETE FROM acts WHERE seq = 1")
    assert "missing" in _names(verify_chain(store))
    store.close()


def test_the_incremental_check_costs_what_came_after_the_mark(tmp_path, clock):
    store = SQLiteStateStore(tmp_path / "s.db", clock=clock)
    world = World(store, clock)
    first = world.ask("txn_1")
    store.grant_approval(first, "alice")
    world.call("txn_1", 400_000, approval=first)
    assert verify_and_mark(store).ok
    request_id = world.ask("txn_2")
    _forge(store, "approvals", "approval_id", request_id, status="granted", approver="mallory",
           granted_at="2026-11-30T09:00:00.000000Z")  # fmt: skip
    world.call("txn_2", 400_000, approval=request_id)
    store.deny_approval(world.ask("txn_3"), "bob")
    report = verify_chain(store, since_verified=True)
    assert report.check == "incremental" and _names(report) == ["approval_unrecorded"]
    assert report.acts_verified == 2  # the act at the mark, re-hashed, and the one after it
    # an edit of the act at the mark is caught by the incremental check too
    sql(store._path, "UPDATE acts SET json = replace(json, 'alice', 'eve') WHERE seq = 1")
    assert "content_altered" in _names(verify_chain(store, since_verified=True))
    store.close()


def test_a_store_made_before_the_acts_chain_verifies_clean(tmp_path, clock):
    """An older store's grants and resolutions have no acts: not covered, never a break."""
    db = tmp_path / "old.db"
    # write history with this build, then take the acts tables away as 0006 had none
    store = SQLiteStateStore(db, clock=clock)
    world = World(store, clock)
    granted = world.ask("txn_1")
    store.grant_approval(granted, "alice")
    key = world.ambiguous("txn_2")
    store.resolve_effect(key, "committed", "cli:local")
    pending = world.ask("txn_3")
    store.close()
    for table in ("acts", "acts_chain", "acts_legacy", "prune_checkpoint", "holds", "anchors"):
        sql(db, f"DROP TABLE {table}")
    for column in ("acts_seq", "acts_hash"):
        sql(db, f"ALTER TABLE verified_mark DROP COLUMN {column}")
    for column in ("action_hash", "result_exact"):  # and what 0008 added after it
        sql(db, f"ALTER TABLE effects DROP COLUMN {column}")
    sql(db, "DROP INDEX receipts_effect_key_seq")  # and what 0009 changed
    sql(db, "CREATE INDEX receipts_effect_key ON receipts (effect_key)")
    sql(db, "DELETE FROM schema_version WHERE migration_id IN "
            "('0007_evidence', '0008_replayable_effects', '0009_effect_receipts_index')")
    store = SQLiteStateStore(db, clock=clock)  # 0007 to 0009 again, over a store with history
    world = World(store, clock)
    head = store.chain_head()[0]
    report = verify_chain(store)
    assert report.ok, report.breaks
    assert report.not_covered == head and report.acts_head_seq == 0
    world.call("txn_1", 400_000, approval=granted)  # a grant made before the upgrade, spent after
    store.grant_approval(pending, "bob")  # answered after: an act, and the spend is covered
    world.call("txn_3", 400_000, approval=pending)
    report = verify_chain(store)
    assert report.ok, report.breaks
    result = invoke(["receipts", "--verify-chain", "--store-url", f"sqlite:///{db}"], clock=clock)
    assert result.code == 0, result.err
    assert f"receipts 1..{head} predate the acts chain (not covered)" in result.out
    store.close()


def test_verify_chain_cli_reports_the_forgery(project):
    request_id = project.request(payment_id="txn_2", amount=400_000)
    sql(project.db, "UPDATE approvals SET status = 'granted', approver = 'cli:local', "
        "granted_at = '2026-11-30T09:00:00.000000Z' WHERE approval_id = ?", request_id)
    project.call(payment_id="txn_2", amount=400_000, approval=request_id)
    result = invoke(["receipts", "--verify-chain"], clock=project.clock)
    assert result.code == 1
    assert "approval_unrecorded at seq" in result.out and request_id in result.out
    line = invoke(["receipts", "--verify-chain", "--json"], clock=project.clock)
    document = json.loads(line.out)
    assert line.code == 1 and [b["name"] for b in document["breaks"]] == ["approval_unrecorded"]
    assert document["acts_head_seq"] == 0 and line.out.count("\n") == 1


def test_cli_answers_are_recorded_as_acts(project):
    request_id = project.request(payment_id="txn_2", amount=400_000)
    assert invoke(["approve", request_id], clock=project.clock).code == 0
    key = project.ambiguous("txn_9")
    assert invoke(["resolve", key, "--failed"], clock=project.clock).code == 0
    kinds = [(a.kind, a.by) for a in project.store.iter_acts()]
    assert kinds == [(ActKind.GRANT, "cli:local"), (ActKind.RESOLVE, "cli:local")]
    project.call(payment_id="txn_2", amount=400_000, approval=request_id)
    result = invoke(["receipts", "--verify-chain"], clock=project.clock)
    assert result.code == 0 and "acts: 2 of 2 operator acts verified" in result.out
