"""The benchmark suite's own plumbing: it runs and reports its keys; nothing here is timed.

``bench/ab_call.py`` is what the A/B rows and the profile run in subprocesses (under ours and a
reference interpreter), so it must keep running against this checkout's public API. The pure
helpers (module groups, the replay's transaction handling, the docs' markers) are checked
directly. No assertion looks at a duration.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from .vectors import ROOT

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import ab_call, docs, replay  # noqa: E402

TIMING_KEYS = {"store", "calls", "version", "file", "python", "p50", "p90", "bare_p50", "overhead_p50"}
PROFILE_KEYS = {"function_calls_per_call", "python_calls_per_call", "c_calls_per_call",
                "own_us_per_call", "groups", "other_modules", "top"}  # fmt: skip


def _ab_call(*args: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTRLRUN_")}
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "ab_call.py"), *args], env=env,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_ab_call_prints_its_json_keys_for_20_calls_on_memory() -> None:
    out = _ab_call("memory", "20")
    assert TIMING_KEYS <= set(out)
    assert out["store"] == "memory" and out["calls"] == 20
    assert os.path.realpath(out["file"]).startswith(os.path.realpath(ROOT / "src"))


def test_ab_call_profile_mode_counts_calls_and_groups_by_module() -> None:
    out = _ab_call("memory", "20", "--count-calls")
    assert TIMING_KEYS | PROFILE_KEYS <= set(out)
    assert out["function_calls_per_call"] > 0
    assert any(group.startswith("ctrlrun.") for group in out["groups"])


def test_ab_call_refuses_an_unknown_store() -> None:
    with pytest.raises(SystemExit):
        ab_call.main(["postgres", "20"])


def test_module_groups() -> None:
    import ctrlrun.store  # noqa: F401  (a package: its modules share a group)

    assert ab_call.group_of_module("ctrlrun.store.sqlite") == "ctrlrun.store.*"
    assert ab_call.group_of_module("ctrlrun.store") == "ctrlrun.store.*"
    assert ab_call.group_of_module("ctrlrun.action") == "ctrlrun.action"
    assert ab_call.group_of_module("json.encoder") == "json"
    assert ab_call.group_of_module("sqlalchemy.engine.base") == "sqlalchemy"
    assert ab_call.group_of_module("enum") == "other"


def test_c_functions_go_to_their_group_or_their_caller() -> None:
    names = {"/x/ctrlrun/action.py": "ctrlrun.action"}
    caller = ("/x/ctrlrun/action.py", 10, "f")
    stats = {
        caller: (1, 1, 0.5, 1.0, {}),
        ("~", 0, "<method 'execute' of 'sqlite3.Cursor' objects>"): (1, 1, 0.25, 0.25, {caller: (1, 1, 0.25, 0.25)}),
        ("~", 0, "<method 'get' of 'dict' objects>"): (1, 1, 0.125, 0.125, {caller: (1, 1, 0.125, 0.125)}),
    }  # fmt: skip
    groups, _ = ab_call.group_stats(stats, names)
    assert groups == {"ctrlrun.action": 0.625, "sqlite3": 0.25}


def test_replay_adds_the_begin_a_driver_opened_implicitly() -> None:
    implicit = [("INSERT INTO t VALUES (?)", (1,), False), ("COMMIT", (), False)]
    assert [s for s, _, _ in replay.sqlite_steps(implicit)] == ["BEGIN IMMEDIATE", "INSERT INTO t VALUES (?)", "COMMIT"]
    explicit = [("BEGIN IMMEDIATE", (), False), *implicit, ("SELECT 1", (), False), ("ROLLBACK", (), False)]
    assert [s for s, _, _ in replay.sqlite_steps(explicit)] == [
        "BEGIN IMMEDIATE", "INSERT INTO t VALUES (?)", "COMMIT", "SELECT 1"]  # fmt: skip
    assert len(replay.transactions(explicit)) == 2


def test_performance_page_has_every_generated_section() -> None:
    text = docs.DOCS.read_text(encoding="utf-8")
    for name in docs.SECTIONS:
        assert docs.marker(name, "begin") in text and docs.marker(name, "end") in text, name
    assert docs.replace(text, {name: "x" for name in docs.SECTIONS}).count("\nx\n") == len(docs.SECTIONS)


def test_bench_scale_grows_a_store_that_verifies_and_answers(tmp_path) -> None:
    """The generated calls are a valid chain the read commands find their ids in."""
    from bench.scale_rows import Generator, append_sqlite, make_templates

    from ctrlrun import SQLiteStateStore
    from ctrlrun.receipt import verify_chain

    path = str(tmp_path / "scale.db")
    SQLiteStateStore(path).close()
    generator = Generator(make_templates())
    append_sqlite(path, generator, 0, 250)
    append_sqlite(path, generator, 250, 50)  # a second batch chains onto the first
    store = SQLiteStateStore(path)
    try:
        report = verify_chain(store)
        assert report.ok and report.verified == 300
        (receipt,) = store.receipts_for(action_id=f"act_{200:024x}A0000000")
        assert receipt.effect_key == "refund:p200"
        assert store.get_approval(f"apr_{200:024x}B0000000") is not None
    finally:
        store.close()
