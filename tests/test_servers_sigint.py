"""Ctrl-C stops the long-running commands cleanly: ``ctrlrun serve`` and ``ctrlrun gateway`` (stdio
and http) as real processes, sent SIGINT once ready, exit 130 with a short "stopped" line on
stderr, never click's ``Aborted!`` nor a traceback."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

import pytest

from .vectors import ROOT

pytestmark = pytest.mark.skipif(os.name != "posix", reason="SIGINT to a process (and its group) is POSIX")

SRC = str(ROOT / "src")
FAKE_CHILD = ROOT / "tests" / "gateway" / "stdio_fakes" / "fake_child.py"
POLICY = "schema: ctrlrun.policy/v2\nactions:\n  mcp.pay.lookup:\n    decision: allow\n"
WAIT = 60.0  # a bound on a hung process, never a pace


class Process:
    """A ``ctrlrun`` subprocess whose stderr (and stdout) lines are collected by reader threads."""

    def __init__(self, args: list[str], directory: Path, env: dict[str, str], *, own_group: bool = False,
                 stdin: int | None = subprocess.DEVNULL) -> None:  # fmt: skip
        self.process = subprocess.Popen([sys.executable, "-m", "ctrlrun", *args], cwd=directory, env=env, stdin=stdin,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        start_new_session=own_group)  # fmt: skip
        self.err: list[bytes] = []
        self._err_lines: queue.Queue[bytes] = queue.Queue()
        self._out_lines: queue.Queue[bytes] = queue.Queue()
        assert self.process.stderr is not None and self.process.stdout is not None
        self._readers = [threading.Thread(target=self._read, args=(self.process.stderr, self._err_lines), daemon=True),
                         threading.Thread(target=self._read, args=(self.process.stdout, self._out_lines), daemon=True)]  # fmt: skip
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream: IO[bytes], into: queue.Queue[bytes]) -> None:
        for line in stream:
            into.put(line)
        into.put(b"")

    def err_line(self, pattern: str) -> re.Match[str]:
        """Wait for the first stderr line matching ``pattern`` (failing with what it said if it ends first)."""
        while True:
            line = self._err_lines.get(timeout=WAIT)
            self.err.append(line)
            found = re.search(pattern, line.decode("utf-8", "replace"))
            if found is not None:
                return found
            assert line, f"the process ended before {pattern!r}: {b''.join(self.err).decode('utf-8', 'replace')}"

    def out_line(self) -> bytes:
        return self._out_lines.get(timeout=WAIT)

    def interrupt(self, *, group: bool = False) -> tuple[int, str]:
        """Send SIGINT (to the process, or to its whole group as a terminal's Ctrl-C does); the
        exit code and the whole of stderr."""
        if group:
            os.killpg(self.process.pid, signal.SIGINT)
        else:
            self.process.send_signal(signal.SIGINT)
        code = self.process.wait(timeout=WAIT)
        self._readers[0].join(timeout=WAIT)
        while not self._err_lines.empty():
            self.err.append(self._err_lines.get())
        return code, b"".join(self.err).decode("utf-8", "replace")

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=WAIT)
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTRLRUN_")}
    env.update({"PYTHONPATH": SRC, **extra})
    return env


def _assert_stopped_cleanly(code: int, err: str, command: str) -> None:
    assert code == 130, err
    assert "Aborted!" not in err and "Traceback" not in err, err
    assert f"ctrlrun {command}: stopped (interrupted)" in err.splitlines(), err


def _answered(port: int) -> bytes:
    """One HTTP/1.0 GET of /healthz: a listening console answers it (the port is polled, not waited for)."""
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as conn:
        conn.sendall(b"GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        return conn.makefile("rb").read()


def test_serve_stops_on_sigint_with_130(tmp_path: Path) -> None:
    pytest.importorskip("starlette")
    pytest.importorskip("uvicorn")
    from ctrlrun import SQLiteStateStore
    from ctrlrun.console.auth import add_user

    users = tmp_path / "users.yaml"
    add_user(users, "ada", "ada-secret-1")
    SQLiteStateStore(tmp_path / "state.db").close()
    served = Process(["serve", "--listen", "127.0.0.1:0", "--users", str(users), "--store-url", f"sqlite://{tmp_path / 'state.db'}"],
                     tmp_path, _env(CTRLRUN_CONSOLE_SECRET="sigint-test-secret"))  # fmt: skip
    try:
        port = int(served.err_line(r"^listening on http://127\.0\.0\.1:(\d+)$").group(1))
        assert _answered(port).endswith(b"ok")  # uvicorn is serving
        code, err = served.interrupt()
    finally:
        served.close()
    _assert_stopped_cleanly(code, err, "serve")


def _gateway(tmp_path: Path, *args: str) -> list[str]:
    policy = tmp_path / "gw.yaml"
    policy.write_text(POLICY)
    return ["gateway", "--alias", "pay", "--principal", "agent-1", "--policy", str(policy),
            "--store-url", f"sqlite://{tmp_path / 'state.db'}", *args]  # fmt: skip


@pytest.mark.parametrize("group", [False, True], ids=["the-gateway", "its-process-group"])
def test_the_stdio_gateway_stops_on_sigint_with_130(tmp_path: Path, group: bool) -> None:
    pytest.importorskip("httpx2")
    command = _gateway(tmp_path, "--", sys.executable, str(FAKE_CHILD))
    served = Process(command, tmp_path, _env(), own_group=group, stdin=subprocess.PIPE)
    try:
        served.err_line(r"^fake child started")
        assert served.process.stdin is not None  # the host keeps stdin open: only SIGINT ends the session
        served.process.stdin.write(json.dumps({"jsonrpc": "2.0", "id": 7, "method": "ping"}).encode() + b"\n")
        served.process.stdin.flush()
        while (line := served.out_line()) and json.loads(line).get("id") != 7:
            pass
        assert line, "the gateway ended before answering the ping"  # the relay is live
        code, err = served.interrupt(group=group)
    finally:
        served.close()
    _assert_stopped_cleanly(code, err, "gateway")


@pytest.mark.parametrize("group", [False, True], ids=["the-gateway", "its-process-group"])
def test_the_http_gateway_stops_on_sigint_with_130(tmp_path: Path, group: bool) -> None:
    pytest.importorskip("httpx2")
    command = _gateway(tmp_path, "--upstream", "http://127.0.0.1:9/mcp", "--listen", "127.0.0.1:0")
    served = Process(command, tmp_path, _env(), own_group=group)
    try:
        port = int(served.err_line(r"listening on http://127\.0\.0\.1:(\d+)/mcp").group(1))
        socket.create_connection(("127.0.0.1", port), timeout=WAIT).close()  # it accepts connections
        code, err = served.interrupt(group=group)
    finally:
        served.close()
    _assert_stopped_cleanly(code, err, "gateway")
