"""examples/pydantic-ai-refund runs as a program, in a temporary copy of its directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import ctrlrun_pydantic_ai
import pytest

import ctrlrun

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "pydantic-ai-refund"


def run_example(workdir: Path, *args: str) -> list[str]:
    paths = [str(Path(m.__file__).resolve().parents[1]) for m in (ctrlrun, ctrlrun_pydantic_ai)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    for name in ("CTRLRUN_CONFIG", "CTRLRUN_STATE", "CTRLRUN_STORE_URL", "CTRLRUN_ENVIRONMENT"):
        env.pop(name, None)
    done = subprocess.run([sys.executable, "main.py", *args], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (workdir / ".ctrlrun" / "state.db").is_file()
    return done.stdout.splitlines()


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    if not EXAMPLE.is_dir():
        pytest.skip("examples/pydantic-ai-refund is not in this checkout")
    copy = tmp_path / "pydantic-ai-refund"
    shutil.copytree(EXAMPLE, copy, ignore=shutil.ignore_patterns(".ctrlrun", "__pycache__"))
    return copy


def test_example_approval_commits_once(workdir):
    out = run_example(workdir)
    assert 'txn_2: paused for approval of stripe.refund {"amount": 250000, "payment_id": "txn_2"}' in out
    assert "txn_2: ada@example.com approves" in out
    assert "txn_2: agent says 'done: re_txn_2'" in out
    assert "txn_2: not run again (committed)" in out  # the agent's retry
    assert "stripe was called for: txn_1, txn_2" in out
    assert "receipt stripe.refund txn_1: allow/committed approver=None" in out
    assert "receipt stripe.refund txn_2: approve/committed approver=ada@example.com" in out
    assert "receipt stripe.refund txn_2: approve/blocked approver=None" in out
    assert "requests left pending: 1" in out  # the first pass's request, orphaned by the re-run


def test_example_second_run_runs_nothing_again(workdir):
    run_example(workdir)
    out = run_example(workdir)
    assert out[:3] == ["txn_1: not run again (committed)", "txn_2: not run again (committed)",
                       "txn_2: not run again (committed)"]  # fmt: skip
    assert "stripe was called for: nothing" in out
    assert not [line for line in out if "paused for approval" in line]


def test_example_refusal_runs_and_records_nothing(workdir):
    out = run_example(workdir, "--deny")
    assert "txn_2: ada@example.com refuses" in out
    assert "txn_2: agent says 'done: ada@example.com refused this refund'" in out
    assert "stripe was called for: txn_1" in out
    assert not [line for line in out if line.startswith("receipt stripe.refund txn_2")]
    assert "requests left pending: 2" in out  # a refusal through Pydantic AI reaches no store
