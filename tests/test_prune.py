"""Prune and holds: a prefix deleted in batches behind a checkpoint, every refusal decided
before anything is written, and a chain that verifies across the gap."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import insert, update

from ctrlrun.evidence.acts import ActKind
from ctrlrun.receipt import verify_chain
from ctrlrun.evidence.retention import PruneRefused, parse_duration
from ctrlrun.store.memory import InMemoryStateStore
from ctrlrun.store.sqlite import SQLiteStateStore

from ._cli_helpers import invoke, sql
from .test_acts_chain import World

DAY = timedelta(days=1)
SRC = str(Path(__file__).resolve().parents[1] / "src")


@pytest.fixture
def world(store, clock):
    return World(store, clock)


def fill(world, n, prefix="txn"):
    for i in range(n):
        world.call(f"{prefix}_{i}", 100)


def state_of(store):
    """Everything a prune could touch, to show a refused one touched nothing."""
    return (
        [(r.seq, r.hash) for r in store.receipts()], store.chain_head(), store.acts_head(),
        store.prune_checkpoint(), store.holds(), len(store.events()),
    )  # fmt: skip


def _set_receipt(store, seq, **values):
    if isinstance(store, InMemoryStateStore):
        (row,) = [r for r in store._data.receipts.values() if r["seq"] == seq]
        row.update(values)
        return
    from ctrlrun.store.schema import receipts

    with store.engine.connect() as conn:
        conn.execute(update(receipts).where(receipts.c.seq == seq).values(**values))
        conn.commit()


def _charge(store, effect_key, at):
    row = {"grant_id": "g", "metric": "amount", "amount": 5, "effect_key": effect_key,
           "attempt": 1, "consumed_at": at, "released_at": None}  # fmt: skip
    if isinstance(store, InMemoryStateStore):
        store._data.ledger.append({"id": len(store._data.ledger) + 1, **row})
        return
    from ctrlrun.store.schema import budget_ledger

    with store.engine.connect() as conn:
        conn.execute(insert(budget_ledger).values(**row))
        conn.commit()


def test_a_pruned_chain_verifies_from_its_checkpoint_and_catches_an_edit_after_it(world):
    store = world.store
    fill(world, 30)
    hash_20 = store.receipt_hash_at(20)
    result = store.prune(20, older_than=DAY, by="ops", reason="retention", batch=7)
    assert (result.first, result.through, result.deleted, result.batches) == (1, 20, 20, 3)
    assert (store.prune_checkpoint().seq, store.prune_checkpoint().hash) == (20, hash_20)
    seqs = [r.seq for r in store.receipts()]
    assert seqs == list(range(21, 32))  # 21..30 kept, and the prune's own receipt at 31
    prune_receipt = store.receipts()[-1]
    assert prune_receipt.action == "ctrlrun.retention.prune" and prune_receipt.receipt_id == result.receipt_id
    assert dict(prune_receipt.arguments) == {"by": "ops", "reason": "retention", "from_seq": 1, "through": 20}
    (act,) = store.iter_acts()
    assert (act.kind, act.subject, act.by) == (ActKind.PRUNE, result.receipt_id, "ops")
    assert act.detail == {"from_seq": 1, "through": 20, "reason": "retention"}
    report = verify_chain(store)
    assert report.ok, report.breaks
    assert (report.check, report.from_seq, report.to_seq, report.pruned_through) == ("full", 21, 31, 20)
    assert report.to_dict()["pruned_through"] == 20
    # a second prune moves the checkpoint on
    store.prune(25, older_than=DAY, by="ops", reason="again")
    assert verify_chain(store).ok and store.prune_checkpoint().seq == 25
    _set_receipt(store, 28, json=store.receipts()[2].to_json().replace("txn_27", "txn_X"))
    assert "content_altered" in [b.name for b in verify_chain(store).breaks]


def test_the_first_kept_receipt_must_point_to_the_checkpoint(world):
    store = world.store
    fill(world, 10)
    store.prune(5, older_than=DAY, by="ops", reason="r")
    sixth = store.receipts()[0]
    _set_receipt(store, 6, json=sixth.to_json().replace(sixth.prev_hash, "sha256:" + "1" * 64))
    names = [b.name for b in verify_chain(store).breaks]
    assert "link_broken" in names or "content_altered" in names


REFUSALS = ["hold", "head", "checkpoint", "break", "unsettled", "pending", "ledger", "missing"]


@pytest.mark.parametrize("reason", REFUSALS)
def test_every_refusal_leaves_every_row_in_place(world, clock, reason):
    store = world.store
    fill(world, 12)
    through, seq = 10, None
    if reason == "hold":
        store.place_hold("legal", 5, 8, reason="litigation", by="counsel")
        seq = 5
    elif reason == "head":
        through = seq = store.chain_head()[0]
    elif reason == "checkpoint":
        store.prune(6, older_than=DAY, by="ops", reason="first")
        through = seq = 4
    elif reason == "break":
        _set_receipt(store, 10, hash="sha256:" + "2" * 64)  # the stored hash, not the content
        seq = 11
    elif reason == "unsettled":
        key = world.ambiguous("lost")
        fill(world, 2, "late")
        through = store.chain_head()[0] - 1
        seq = [r.seq for r in store.receipts() if r.effect_key == key][0]
    elif reason == "pending":
        request_id = world.ask("big")
        with pytest.raises(Exception):
            world.call("big", 400_000, approval=request_id)  # a blocked receipt names it
        seq = store.chain_head()[0]
        fill(world, 1, "late")
        through = seq
    elif reason == "ledger":
        seq = 7
        _charge(store, store.receipts()[seq - 1].effect_key, store.receipts()[seq - 1].finished_at)
        _charge(store, "other", "2020-01-01T00:00:00.000000Z")
    elif reason == "missing":
        from ctrlrun.store.schema import receipts

        if isinstance(store, InMemoryStateStore):
            del store._data.receipts[store.receipts()[9].receipt_id]
        else:
            with store.engine.connect() as conn:
                conn.execute(receipts.delete().where(receipts.c.seq == 10))
                conn.commit()
        seq = 10
    before = state_of(store)
    with pytest.raises(PruneRefused) as refused:
        store.prune(through, older_than=DAY, by="ops", reason="retention",
                    anchor=lambda s, h: pytest.fail("anchored before a refusal"))  # fmt: skip
    assert refused.value.reason == reason and refused.value.seq == seq
    assert f"seq {seq}" in str(refused.value)
    assert state_of(store) == before


def test_holds_are_placed_listed_and_released_and_recorded(world):
    store = world.store
    fill(world, 10)
    store.place_hold("a", 3, None, reason="open ended", by="counsel")
    store.place_hold("b", 50, 60, reason="above the head", by="counsel")
    with pytest.raises(PruneRefused, match="hold 'a' keeps seq 3.."):
        store.prune(8, older_than=DAY, by="ops", reason="r")
    store.prune(2, older_than=DAY, by="ops", reason="below the hold")
    released = store.release_hold("a", by="counsel-2")
    assert not released.live and released.released_by == "counsel-2"
    store.prune(8, older_than=DAY, by="ops", reason="after release")
    with pytest.raises(Exception, match="already released"):
        store.release_hold("a", by="x")
    with pytest.raises(Exception, match="already exists"):
        store.place_hold("b", 1, None, reason="again", by="x")
    kinds = [a.kind for a in store.iter_acts()]
    assert kinds == ["hold_place", "hold_place", "prune", "hold_release", "prune"]
    assert verify_chain(store).ok


def test_duration_parsing():
    assert parse_duration("90d") == timedelta(days=90) and parse_duration("45s") == timedelta(seconds=45)
    for bad in ("", "9", "1w", "-1d", "1.5h"):
        with pytest.raises(Exception, match="is not an integer and a unit"):
            parse_duration(bad)


# ---------------------------------------------------------------- the CLI


def test_prune_and_hold_commands(project):
    for i in range(8):
        project.call(payment_id=f"txn_{i}", amount=100)
    url = ["--store-url", f"sqlite:///{project.db}"]
    placed = invoke(["hold", "place", "--id", "audit", "--from-seq", "6", "--reason", "audit 2026",
                     "--by", "counsel", *url], clock=project.clock)  # fmt: skip
    assert placed.code == 0 and placed.out == "hold audit placed on seq 6.. by counsel\n"
    listed = invoke(["hold", "list", "--json", *url], clock=project.clock)
    assert json.loads(listed.out)["hold_id"] == "audit" and json.loads(listed.out)["live"] is True
    refused = invoke(["prune", "--through", "7", "--older-than", "1d", "--by", "ops", "--reason", "r", *url],
                     clock=project.clock)  # fmt: skip
    assert refused.code == 1 and "hold 'audit' keeps seq 6.." in refused.err and "seq 6" in refused.err
    as_json = invoke(["prune", "--through", "7", "--older-than", "1d", "--by", "ops", "--reason", "r",
                      "--json", *url], clock=project.clock)  # fmt: skip
    document = json.loads(as_json.out)
    assert as_json.code == 1 and (document["status"], document["reason"], document["seq"]) == ("refused", "hold", 6)
    done = invoke(["prune", "--through", "5", "--older-than", "1d", "--by", "ops", "--reason", "retention", *url],
                  clock=project.clock)  # fmt: skip
    assert done.code == 0, done.err
    assert done.out.splitlines()[0] == "pruned seq 1..5: 5 receipts in 1 batch"
    verified = invoke(["receipts", "--verify-chain", *url], clock=project.clock)
    assert verified.code == 0 and "full check of seq 6..9 (pruned through seq 5)" in verified.out
    released = invoke(["hold", "release", "--id", "audit", "--by", "counsel", *url], clock=project.clock)
    assert released.code == 0 and "released by counsel" in released.out
    assert "released by counsel" in invoke(["hold", "list", *url], clock=project.clock).out
    bad = invoke(["prune", "--through", "7", "--older-than", "soon", "--by", "o", "--reason", "r", *url])
    assert bad.code == 2 and "is not an integer and a unit" in bad.err


# ---------------------------------------------------------------- real processes

_PRUNER = textwrap.dedent(
    """
    import os, signal, sys
    from datetime import timedelta
    from ctrlrun.store.sqlite import SQLiteStateStore
    store = SQLiteStateStore(sys.argv[1])
    kill_at = int(sys.argv[3])
    def after(seq):
        print(seq, flush=True)
        if seq >= kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
    store.prune(int(sys.argv[2]), older_than=timedelta(0), by="ops", reason="r", batch=10, after_batch=after)
    """
)


def _python(*args, **kwargs):
    env = {**os.environ, "PYTHONPATH": SRC}
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=120, **kwargs)


def test_a_prune_killed_between_batches_leaves_a_chain_that_verifies(tmp_path, clock):
    db = tmp_path / "s.db"
    store = SQLiteStateStore(db, clock=clock)
    fill(World(store, clock), 60)
    store.close()
    killed = _python("-c", _PRUNER, str(db), "50", "30")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert killed.stdout.split() == ["10", "20", "30"]
    store = SQLiteStateStore(db, clock=clock)
    assert store.prune_checkpoint().seq == 30
    assert [r.seq for r in store.receipts()][0] == 31  # a smaller prune, never a gap
    report = verify_chain(store)
    assert report.ok, report.breaks
    assert report.pruned_through == 30
    finished = store.prune(50, older_than=DAY, by="ops", reason="finish")
    assert finished.first == 31 and verify_chain(store).ok
    assert [a.kind for a in store.iter_acts()] == ["prune", "prune"]
    store.close()


_CALLER = textwrap.dedent(
    """
    import sys
    from ctrlrun import Control, Policy, context, protect
    from ctrlrun.store.sqlite import SQLiteStateStore
    store = SQLiteStateStore(sys.argv[1])
    policy = Policy.from_yaml(open(sys.argv[2]).read())
    control = Control(policy, store)

    @protect("stripe.refund", effect="refund:{payment_id}", control=control)
    def refund(payment_id, amount):
        return payment_id

    print("ready", flush=True)
    sys.stdin.readline()
    with context(agent="support-agent"):
        for i in range(int(sys.argv[3])):
            refund(f"{sys.argv[4]}_{i}", 100)
    print("done", flush=True)
    """
)


def test_callers_keep_running_while_a_prune_deletes(tmp_path, clock):
    from .policies import REFUND_POLICY

    db = tmp_path / "s.db"
    policy = tmp_path / "policy.yaml"
    policy.write_text(REFUND_POLICY)
    store = SQLiteStateStore(db, clock=clock)
    fill(World(store, clock), 1500)
    env = {**os.environ, "PYTHONPATH": SRC}
    callers = [
        subprocess.Popen([sys.executable, "-c", _CALLER, str(db), str(policy), "150", f"w{n}"],
                         env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for n in range(2)
    ]  # fmt: skip
    for caller in callers:
        assert caller.stdout.readline().strip() == "ready"
        caller.stdin.write("go\n")
        caller.stdin.flush()
    result = store.prune(1400, older_than=timedelta(0), by="ops", reason="r", batch=50)
    for caller in callers:
        assert caller.stdout.readline().strip() == "done"
        assert caller.wait(timeout=120) == 0
    assert result.deleted == 1400 and result.batches == 28
    report = verify_chain(store)
    assert report.ok, report.breaks
    kept = [r for r in store.receipts() if r.effect_key and r.effect_key.startswith("refund:w")]
    assert len(kept) == 300  # every caller's call ran and left its receipt
    store.close()
