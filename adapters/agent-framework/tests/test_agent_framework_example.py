"""examples/agent-framework-refund runs as a program, in a temporary copy of its directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import ctrlrun_agent_framework
import pytest

import ctrlrun

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "agent-framework-refund"


def copy_example(tmp_path: Path) -> Path:
    if not EXAMPLE.is_dir():
        pytest.skip("examples/agent-framework-refund is not in this checkout")
    workdir = tmp_path / "agent-framework-refund"
    shutil.copytree(EXAMPLE, workdir, ignore=shutil.ignore_patterns(".ctrlrun", "__pycache__"))
    return workdir


def run_example(workdir: Path, *args: str) -> list[str]:
    paths = [str(Path(m.__file__).resolve().parents[1]) for m in (ctrlrun, ctrlrun_agent_framework)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    for name in ("CTRLRUN_CONFIG", "CTRLRUN_STATE", "CTRLRUN_STORE_URL", "CTRLRUN_ENVIRONMENT"):
        env.pop(name, None)
    done = subprocess.run([sys.executable, "main.py", *args], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (workdir / ".ctrlrun" / "state.db").is_file()
    return done.stdout.splitlines()


def test_example_approval_commits_once_and_not_again(tmp_path):
    workdir = copy_example(tmp_path)
    out = run_example(workdir)
    assert "txn_1: agent says: tool said: re_txn_1" in out
    assert 'txn_2: paused for approval of refund {"payment_id": "txn_2", "amount": 250000}' in out
    assert "txn_2: ada@example.com approves" in out
    assert "txn_2: agent says: tool said: re_txn_2" in out
    assert "stripe was called for: txn_1, txn_2" in out
    assert "receipt stripe.refund txn_1: allow/committed approver=None" in out
    assert "receipt stripe.refund txn_2: approve/committed approver=ada@example.com" in out

    again = run_example(workdir)  # the same directory, its .ctrlrun/ state kept
    assert "txn_1: not run again (committed)" in again
    assert "txn_2: not run again (committed)" in again
    assert "stripe was called for: nothing" in again
    assert not [line for line in again if "paused for approval" in line]


def test_example_rejection_runs_nothing(tmp_path):
    out = run_example(copy_example(tmp_path), "--reject")
    assert "txn_2: ada@example.com rejects" in out
    assert "txn_2: agent says: tool said: Error: Tool call invocation was rejected by user." in out
    assert "stripe was called for: txn_1" in out
    assert not [line for line in out if line.startswith("receipt stripe.refund txn_2")]
