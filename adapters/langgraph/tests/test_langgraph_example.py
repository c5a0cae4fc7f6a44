"""examples/langgraph-refund runs as a program, in a temporary copy of its directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import ctrlrun_langgraph
import pytest

import ctrlrun

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "langgraph-refund"


def run_example(tmp_path: Path, *args: str) -> str:
    if not EXAMPLE.is_dir():
        pytest.skip("examples/langgraph-refund is not in this checkout")
    workdir = tmp_path / "langgraph-refund"
    shutil.copytree(EXAMPLE, workdir, ignore=shutil.ignore_patterns(".ctrlrun", "__pycache__"))
    paths = [str(Path(m.__file__).resolve().parents[1]) for m in (ctrlrun, ctrlrun_langgraph)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    for name in ("CTRLRUN_CONFIG", "CTRLRUN_STATE", "CTRLRUN_STORE_URL", "CTRLRUN_ENVIRONMENT"):
        env.pop(name, None)
    done = subprocess.run([sys.executable, "main.py", *args], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (workdir / ".ctrlrun" / "state.db").is_file()
    return done.stdout


def test_example_approves_once_and_refuses_the_retry(tmp_path):
    out = run_example(tmp_path).splitlines()
    assert "txn_1: refunded (re_txn_1)" in out
    assert "txn_2: paused for approval of stripe.refund {'amount': 250000, 'payment_id': 'txn_2'}" in out
    assert "txn_2: refunded (re_txn_2)" in out
    assert "txn_2: not run again (committed)" in out
    assert "stripe was called for: txn_1, txn_2" in out
    assert "receipt stripe.refund txn_2: approve/committed approver=ada@example.com" in out


def test_example_refusal(tmp_path):
    out = run_example(tmp_path, "--deny").splitlines()
    assert "txn_2: refused (approval_denied)" in out
    assert "stripe was called for: txn_1" in out
    assert "receipt stripe.refund txn_2: approve/denied approver=ada@example.com" in out
