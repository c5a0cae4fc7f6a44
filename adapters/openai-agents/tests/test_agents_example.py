"""examples/openai-agents-support runs as a program, in a temporary copy of its directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import ctrlrun_openai_agents
import pytest

import ctrlrun

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "openai-agents-support"


def run_example(tmp_path: Path, *args: str) -> list[str]:
    if not EXAMPLE.is_dir():
        pytest.skip("examples/openai-agents-support is not in this checkout")
    workdir = tmp_path / "openai-agents-support"
    shutil.copytree(EXAMPLE, workdir, ignore=shutil.ignore_patterns(".ctrlrun", "__pycache__"))
    paths = [str(Path(m.__file__).resolve().parents[1]) for m in (ctrlrun, ctrlrun_openai_agents)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths), OPENAI_API_KEY="")
    for name in ("CTRLRUN_CONFIG", "CTRLRUN_STATE", "CTRLRUN_STORE_URL", "CTRLRUN_ENVIRONMENT"):
        env.pop(name, None)
    done = subprocess.run([sys.executable, "main.py", *args], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (workdir / ".ctrlrun" / "state.db").is_file()
    return done.stdout.splitlines()


def test_example_approval_commits_once(tmp_path):
    out = run_example(tmp_path)
    assert 'txn_2: paused for approval of refund {"payment_id": "txn_2", "amount": 250000}' in out
    assert "txn_2: support lead approves" in out
    assert "stripe was called for: txn_1, txn_2" in out
    assert "receipt stripe.refund txn_1: allow/committed approver=None" in out
    assert "receipt stripe.refund txn_2: approve/committed approver=openai-agents:tool-approval" in out


def test_example_rejection_runs_and_records_nothing(tmp_path):
    out = run_example(tmp_path, "--reject")
    assert "txn_2: support lead rejects" in out
    assert "stripe was called for: txn_1" in out
    assert not [line for line in out if line.startswith("receipt stripe.refund txn_2")]
