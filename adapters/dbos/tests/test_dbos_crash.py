"""ctrlrun-dbos under real crashes: a process of the test application is killed (``SIGKILL``, by
its own test hook or by the test) at a named point, a fresh process recovers the workflow, and
the fake remote's fsynced log counts the effects. SQLite and Postgres; lease 2 s.

Also here, because they need a second process: a message sent while no process runs, a
workflow's refusal read from another process (it unpickles as itself), two executors racing on
one key, and a fork from the attempt step.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from dbos import DBOSClient

import ctrlrun
import ctrlrun_dbos
from ctrlrun import DuplicateEffect
from ctrlrun.effect import EffectState
from ctrlrun.store.postgres import PostgresStateStore
from ctrlrun.store.sqlite import SQLiteStateStore
from ctrlrun_dbos import PENDING_EVENT, answer
from refund_app import Settings, remote_lines

APP = Path(__file__).with_name("refund_app.py")
ALLOW, APPROVE = 50, 500  # the test policy allows up to 100 and asks a human up to 1000


def _env(settings: Settings, kill: str = "", executor: str | None = None) -> dict[str, str]:
    paths = [str(Path(m.__file__).resolve().parents[1]) for m in (ctrlrun, ctrlrun_dbos)]
    env = dict(os.environ, **settings.to_env(), PYTHONPATH=os.pathsep.join([*paths, str(APP.parent)]))
    env[Settings.ENV + "KILL"] = kill
    env[Settings.ENV + "EXECUTOR"] = executor or ""
    return env


def spawn(settings: Settings, *args: str, kill: str = "", executor: str | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(APP), *args], env=_env(settings, kill, executor),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


def finished(process: subprocess.Popen[str]) -> tuple[int, dict[str, Any]]:
    out, err = process.communicate(timeout=120)
    if process.returncode != 0:
        return process.returncode, {}
    assert out.strip(), err
    return 0, json.loads(out.strip().splitlines()[-1])


def run(settings: Settings, *args: str, kill: str = "") -> dict[str, Any]:
    code, results = finished(spawn(settings, *args, kill=kill))
    assert code == 0, f"the application exited {code}"
    return results


def killed(process: subprocess.Popen[str]) -> None:
    process.communicate(timeout=120)
    assert process.returncode == -signal.SIGKILL, f"expected SIGKILL, exited {process.returncode}"


@pytest.fixture
def client(settings: Settings):
    run(settings, "init")  # the system database exists before a client opens it
    made = DBOSClient(system_database_url=settings.dbos_url,
                      dbos_system_schema=settings.dbos_schema or "dbos")  # fmt: skip
    yield made
    made.destroy()


@pytest.fixture
def store(settings: Settings):
    opened: list[Any] = []

    def open_store() -> Any:
        url = settings.store_url
        made = (SQLiteStateStore(url.removeprefix("sqlite://")) if url.startswith("sqlite://")
                else PostgresStateStore(url))  # fmt: skip
        opened.append(made)
        return made

    yield open_store
    for made in opened:
        made.close()


def approve_when_asked(client: DBOSClient, workflow_id: str, approver: str = "alice@example.com") -> str:
    pending = client.get_event(workflow_id, PENDING_EVENT, timeout_seconds=60)
    assert pending is not None, "the workflow published no pending request"
    return answer(client, workflow_id, approved=True, approver=approver, arguments=pending["arguments"])


def crash_then_recover(settings: Settings, client: DBOSClient, kill: str, amount: int) -> dict[str, Any]:
    """Start ``wf`` in a process killed at ``kill`` (answering its request on the approve path),
    then recover it in a fresh one; the recovered outcome."""
    process = spawn(settings, "start", "wf", "txn_1", str(amount), kill=kill)
    if amount == APPROVE:
        approve_when_asked(client, "wf")
    killed(process)
    return run(settings, "recover", "wf")["wf"]


# --------------------------------------------------------------------------- the crash points


@pytest.mark.parametrize("amount", [ALLOW, APPROVE], ids=["allow", "approved"])
def test_killed_before_the_reservation_it_runs_once_on_recovery(settings, client, store, amount):
    outcome = crash_then_recover(settings, client, "before_reserve", amount)
    assert outcome == {"value": {"refund": "re_txn_1", "amount": amount}}
    assert remote_lines(settings.remote) == [f"txn_1 {amount}"]
    opened = store()
    assert opened.get_effect("refund:txn_1").state is EffectState.COMMITTED
    if amount == APPROVE:
        assert [e.type.value for e in opened.events()].count("APPROVAL_REQUESTED") == 1


@pytest.mark.parametrize("amount", [ALLOW, APPROVE], ids=["allow", "approved"])
@pytest.mark.parametrize("kill, effects", [("after_reserve", 0), ("after_execute", 1)])
def test_killed_while_executing_it_is_ambiguous_once_the_lease_lapses(settings, client, store, amount, kill, effects):
    outcome = crash_then_recover(settings, client, kill, amount)
    assert outcome["error"] == "AmbiguousEffect"
    assert len(remote_lines(settings.remote)) == effects  # never a second effect
    opened = store()
    assert opened.get_effect("refund:txn_1").state is EffectState.AMBIGUOUS
    results = [r.result for r in opened.receipts()]
    assert "blocked" in results  # the re-runs were refused (in progress, then ambiguous)
    assert "committed" not in results


@pytest.mark.parametrize("amount", [ALLOW, APPROVE], ids=["allow", "approved"])
def test_a_hook_that_says_not_executed_lets_attempt_two_run_once(settings, client, store, amount):
    settings.hook = "not_executed"
    outcome = crash_then_recover(settings, client, "after_reserve", amount)
    if amount == APPROVE:
        # attempt 1 spent the approval; the re-run presents none, and a call that would ask a
        # human judges the key first without the hook: ambiguous until resolved
        assert outcome["error"] == "AmbiguousEffect"
        assert remote_lines(settings.remote) == []
    else:
        assert outcome == {"value": {"refund": "re_txn_1", "amount": amount}}
        assert remote_lines(settings.remote) == [f"txn_1 {amount}"]
        assert store().get_effect("refund:txn_1").attempt == 2


def test_a_hook_that_says_committed_is_a_duplicate_never_replayed(settings, client, store):
    settings.hook = "committed"
    outcome = crash_then_recover(settings, client, "after_execute", ALLOW)
    assert (outcome["error"], outcome["state"], outcome["replayable"]) == ("DuplicateEffect", "committed", False)
    assert remote_lines(settings.remote) == ["txn_1 50"]
    record = store().get_effect("refund:txn_1")
    assert record.state is EffectState.COMMITTED and record.resolved_by is not None


@pytest.mark.parametrize("amount", [ALLOW, APPROVE], ids=["allow", "approved"])
def test_killed_after_the_outcome_write_the_recorded_value_replays(settings, client, store, amount):
    outcome = crash_then_recover(settings, client, "after_outcome", amount)
    assert outcome == {"value": {"refund": "re_txn_1", "amount": amount}}
    assert remote_lines(settings.remote) == [f"txn_1 {amount}"]
    results = [(r.decision, r.result) for r in store().receipts()]
    decision = "allow" if amount == ALLOW else "approve"
    assert results[0] == (decision, "committed") and results[-1][1] == "blocked"
    steps = client.list_workflow_steps("wf")
    assert steps[-1]["function_name"] == "refund" and steps[-1]["output"] == outcome


def test_an_answer_sent_while_no_process_runs_is_received(settings, client, store):
    process = spawn(settings, "start", "wf", "txn_1", str(APPROVE))
    pending = client.get_event("wf", PENDING_EVENT, timeout_seconds=60)
    assert pending is not None
    process.send_signal(signal.SIGKILL)  # killed while it waits in recv
    killed(process)
    answer(client, "wf", approved=True, approver="alice@example.com", arguments=pending["arguments"])
    outcome = run(settings, "recover", "wf")["wf"]
    assert outcome == {"value": {"refund": "re_txn_1", "amount": APPROVE}}
    assert remote_lines(settings.remote) == [f"txn_1 {APPROVE}"]
    events = [e.type.value for e in store().events()]
    assert events.count("APPROVAL_REQUESTED") == 1 and events.count("APPROVAL_GRANTED") == 1


# --------------------------------------------------------------------------- other processes


def test_a_refusal_reads_back_as_itself_from_another_process(settings, client):
    run(settings, "start", "wf-1", "txn_1", str(ALLOW))
    outcome = run(settings, "start", "wf-2", "txn_1", "60")["wf-2"]  # another action, same key
    assert outcome["error"] == "DuplicateEffect"
    with pytest.raises(DuplicateEffect) as refused:
        client.retrieve_workflow("wf-2").get_result()
    assert (refused.value.state, refused.value.effect_key, refused.value.replayable) == (
        "committed", "refund:txn_1", False)  # fmt: skip


def test_two_executors_on_one_key_make_one_effect(settings, client):
    one = spawn(settings, "start", "wf-a", "txn_1", str(ALLOW), executor="executor-a")
    two = spawn(settings, "start", "wf-b", "txn_1", str(ALLOW), executor="executor-b")
    (code_a, a), (code_b, b) = finished(one), finished(two)
    assert (code_a, code_b) == (0, 0)
    value = {"refund": "re_txn_1", "amount": ALLOW}
    assert a["wf-a"] == {"value": value} and b["wf-b"] == {"value": value}  # one ran, one replayed
    assert remote_lines(settings.remote) == ["txn_1 50"]


def test_a_fork_from_the_attempt_step_replays_instead_of_running_again(settings, client, store):
    run(settings, "start", "wf", "txn_1", str(ALLOW))
    forked = run(settings, "fork", "wf", "1")
    (workflow_id, outcome), = forked.items()
    assert workflow_id != "wf" and outcome == {"value": {"refund": "re_txn_1", "amount": ALLOW}}
    assert remote_lines(settings.remote) == ["txn_1 50"]
    assert [r.result for r in store().receipts()] == ["committed", "blocked"]
