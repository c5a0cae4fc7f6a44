"""The installed entry point in a real process: exit codes, stdout/stderr, never a traceback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

import ctrlrun
from ctrlrun import ApprovalRequired, Control, SQLiteStateStore

from ._cli_helpers import ENV_VARS, starter_policy
from .conftest import FakeClock
from .vectors import ROOT

FAR_FUTURE = datetime(2099, 1, 1, tzinfo=timezone.utc)  # expiries the CLI's real clock has not reached


def _command() -> list[str]:
    return [sys.executable, "-m", "ctrlrun.cli"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    source = str(ROOT / "src")
    env["PYTHONPATH"] = source + os.pathsep + env.get("PYTHONPATH", "") if env.get("PYTHONPATH") else source
    env.update(extra)
    return env


def run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*_command(), *args], cwd=cwd, env=_env(**env), capture_output=True, text=True,
        encoding="utf-8", timeout=120,
    )  # fmt: skip


def test_version(tmp_path):
    done = run(["--version"], tmp_path)
    assert done.returncode == 0
    assert done.stdout == f"ctrlrun, version {ctrlrun.__version__}\n"


def test_demo_in_a_real_process(tmp_path):
    done = run(["demo"], tmp_path, CTRLRUN_STATE="", CTRLRUN_STORE_URL="nonsense://")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert done.stdout.count("✗ BLOCKED — ") == 5
    assert done.stdout.splitlines()[-4] == "Receipts (8): .ctrlrun/demo/receipts.jsonl"
    listed = run(["receipts", "--verify-chain"], tmp_path, CTRLRUN_STATE=".ctrlrun/demo/state.db")
    assert listed.returncode == 0
    assert listed.stdout.splitlines() == ["chain: 8 of 8 receipts verified", "full check of seq 1..8",
                                      "acts: 4 of 4 operator acts verified", "the chain is intact"]


def test_approve_in_a_real_process(tmp_path):
    clock = FakeClock(FAR_FUTURE)
    store = SQLiteStateStore(tmp_path / ".ctrlrun" / "state.db", clock=clock)
    control = Control(starter_policy(), store, clock=clock, environment="production")

    @ctrlrun.protect("stripe.refund", effect="refund:{payment_id}", control=control)
    def refund(payment_id: str, amount: int) -> None:
        return None

    with ctrlrun.context(agent="support-agent"), pytest.raises(ApprovalRequired) as required:
        refund(payment_id="txn_2", amount=500_000)
    store.close()
    request_id = required.value.request_id
    pending = run(["pending"], tmp_path)
    assert pending.returncode == 0 and pending.stdout.startswith(request_id)
    done = run(["approve", request_id], tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"granted {request_id} for sha256:22ec1c398e4b93d080b6cba61e5e11b0e21879552ac5dbf63c192d2b2e6af752",
        "expires 2099-01-01T00:15:00.000Z",
    ]
    again = run(["approve", request_id], tmp_path)
    assert again.returncode == 1
    assert again.stdout == ""
    assert again.stderr == f"Error: approval request {request_id} is already granted; a request is answered once\n"


@pytest.mark.parametrize(
    "args, code",
    [
        (["pending"], 1),  # no database
        (["receipts", "--last", "0"], 2),
        (["resolve", "k"], 2),
        (["nosuch"], 2),
        (["approve", "apr_x", "--set", "amount"], 2),  # no '=': a usage error, whatever the store
        (["approve", "apr_x", "--arguments", "[1]"], 2),  # not a JSON object
        (["approve", "apr_x", "--arguments", "{bad"], 2),
        (["policy", "check"], 1),  # no ctrlrun.yaml
    ],
)
def test_refusals_and_usage_errors(tmp_path, args, code):
    done = run(args, tmp_path)
    assert done.returncode == code
    assert done.stdout == ""
    assert "Error: " in done.stderr and "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_blank_variable_in_a_real_process(tmp_path):
    done = run(["effects"], tmp_path, CTRLRUN_STORE_URL="")
    assert done.returncode == 1 and "CTRLRUN_STORE_URL" in done.stderr


@pytest.mark.skipif(shutil.which("ctrlrun") is None, reason="the ctrlrun script is not installed")
def test_the_installed_script(tmp_path):
    done = subprocess.run(["ctrlrun", "--version"], capture_output=True, text=True, env=_env())
    assert done.returncode == 0 and done.stdout.startswith("ctrlrun, version ")


# --------------------------------------------------------------------------- a reader that stops early


def _store_with_receipts(directory: Path, count: int) -> None:
    store = SQLiteStateStore(directory / ".ctrlrun" / "state.db", durability="normal")
    control = Control(starter_policy(), store, environment="production")

    @ctrlrun.protect("stripe.refund", effect="refund:{payment_id}", control=control)
    def refund(payment_id: str, amount: int) -> None:
        return None

    with ctrlrun.context(agent="support-agent"):
        for n in range(count):
            refund(payment_id=f"txn_{n}", amount=100)
    store.close()


@pytest.mark.parametrize("args", [["receipts"], ["receipts", "--json"], ["effects"], ["effects", "--json"],
                                  ["receipts", "--verify-chain"], ["--help"], ["receipts", "--help"],
                                  ["--version"]])  # fmt: skip
def test_a_closed_pipe_ends_the_command_quietly(tmp_path, args):
    _store_with_receipts(tmp_path, 3)
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line: every write meets EPIPE
    try:
        done = subprocess.run([*_command(), *args], cwd=tmp_path, env=_env(), stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=120)  # fmt: skip
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (0, "")


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("head") is None, reason="needs bash and head")
@pytest.mark.parametrize("module", ["ctrlrun", "ctrlrun.cli"])
def test_receipts_piped_into_head(tmp_path, module):
    _store_with_receipts(tmp_path, 120)  # more than a pipe buffer holds, so the writer outlives head
    done = subprocess.run(
        ["bash", "-c", f'set -o pipefail; "{sys.executable}" -m {module} receipts --json | head -1'],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith('{"schema":"ctrlrun.receipt/') and done.stdout.count("\n") == 1
