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


def copy_example(tmp_path: Path) -> Path:
    if not EXAMPLE.is_dir():
        pytest.skip("examples/openai-agents-support is not in this checkout")
    workdir = tmp_path / "openai-agents-support"
    shutil.copytree(EXAMPLE, workdir, ignore=shutil.ignore_patterns(".ctrlrun", "__pycache__"))
    return workdir


def main_py(workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python main.py *args`` in ``workdir``, with the ctrlrun and adapter under test."""
    paths = [str(Path(m.__file__).resolve().parents[1]) for m in (ctrlrun, ctrlrun_openai_agents)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths), OPENAI_API_KEY="")
    for name in ("CTRLRUN_CONFIG", "CTRLRUN_STATE", "CTRLRUN_STORE_URL", "CTRLRUN_ENVIRONMENT"):
        env.pop(name, None)
    return subprocess.run([sys.executable, "main.py", *args], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip


def run_in(workdir: Path, *args: str) -> list[str]:
    done = main_py(workdir, *args)
    assert done.returncode == 0, done.stderr
    assert (workdir / ".ctrlrun" / "state.db").is_file()
    return done.stdout.splitlines()


def run_example(tmp_path: Path, *args: str) -> list[str]:
    return run_in(copy_example(tmp_path), *args)


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


def test_example_second_run_asks_nobody(tmp_path):
    workdir = copy_example(tmp_path)
    run_in(workdir)
    out = run_in(workdir)  # the first run's state is kept: both refunds are committed
    assert not [line for line in out if "paused" in line or "support lead" in line], out
    assert "txn_1: not run again (committed)" in out
    assert "txn_2: not run again (committed)" in out
    assert "stripe was called for: nothing" in out
    assert out[-2:] == ["receipt stripe.refund txn_1: allow/blocked approver=None",
                        "receipt stripe.refund txn_2: approve/blocked approver=None"]  # fmt: skip


def test_example_help_prints_usage_and_runs_nothing(tmp_path):
    workdir = copy_example(tmp_path)
    done = main_py(workdir, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: main.py") and "--reject" in done.stdout
    assert "txn_" not in done.stdout
    assert not (workdir / ".ctrlrun").exists()


def test_example_refuses_an_unknown_option(tmp_path):
    workdir = copy_example(tmp_path)
    done = main_py(workdir, "--rejetc")
    assert done.returncode == 2
    assert "usage: main.py" in done.stderr and "--rejetc" in done.stderr
    assert done.stdout == ""
    assert not (workdir / ".ctrlrun").exists()
