"""examples/dbos-refund runs as a program, in a temporary copy of its directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import ctrlrun_dbos
import pytest

import ctrlrun

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "dbos-refund"


def copy_example(tmp_path: Path) -> Path:
    if not EXAMPLE.is_dir():
        pytest.skip("examples/dbos-refund is not in this checkout")
    workdir = tmp_path / "dbos-refund"
    shutil.copytree(EXAMPLE, workdir, ignore=shutil.ignore_patterns(".ctrlrun", "__pycache__"))
    return workdir


def run_example(workdir: Path, *args: str) -> list[str]:
    paths = [str(Path(m.__file__).resolve().parents[1]) for m in (ctrlrun, ctrlrun_dbos)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    for name in ("CTRLRUN_CONFIG", "CTRLRUN_STATE", "CTRLRUN_STORE_URL", "CTRLRUN_ENVIRONMENT"):
        env.pop(name, None)
    done = subprocess.run([sys.executable, "main.py", *args], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr
    return done.stdout.splitlines()


def test_example_approval_commits_once_and_replays_after(tmp_path):
    workdir = copy_example(tmp_path)
    out = run_example(workdir)
    assert "txn_1: refunded (re_txn_1)" in out
    assert "txn_2: waiting for approval of stripe.refund {'amount': 250000, 'payment_id': 'txn_2'}" in out
    assert "txn_2: ada@example.com approves" in out
    assert "txn_2: refunded (re_txn_2)" in out
    assert "stripe was called for: txn_1, txn_2" in out
    assert "receipt stripe.refund txn_2: approve/committed approver=ada@example.com" in out

    again = run_example(workdir)  # the same directory, its .ctrlrun/ kept
    assert "txn_1: not run again (committed), replayed re_txn_1" in again
    assert "txn_2: not run again (committed), replayed re_txn_2" in again
    assert not [line for line in again if "waiting for approval" in line]  # nobody asked again
    assert "stripe was called for: nothing" in again
    assert again[-2:] == ["receipt stripe.refund txn_1: allow/blocked approver=None",
                          "receipt stripe.refund txn_2: approve/blocked approver=None"]  # fmt: skip


def test_example_denial_runs_nothing(tmp_path):
    out = run_example(copy_example(tmp_path), "--deny")
    assert "txn_2: ada@example.com refuses" in out
    assert "txn_2: refused (approval_denied)" in out
    assert "stripe was called for: txn_1" in out
    assert "receipt stripe.refund txn_2: approve/denied approver=ada@example.com" in out
