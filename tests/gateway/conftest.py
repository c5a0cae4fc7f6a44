"""Fixtures for the gateway tests: the test upstream (stdio and HTTP) and the SDK's real client.

- ``counter``: a ``Counter`` (a path-like tmp file; ``executions()`` reads what the upstream ran).
- ``upstream_stdio_command(counter, misbehave=None)``: the command that runs the upstream on stdio.
- ``upstream_http(misbehave=None, *, stateless=None)``: a factory fixture; each call starts the
  upstream over streamable HTTP on 127.0.0.1 and returns ``Served(url, close)``, closed at teardown.
- ``connect(transport, mode, target, ...)``: ``async with`` it for an entered ``mcp.Client``
  (``transport`` ``"stdio"`` with a command list, or ``"http"`` with a URL; ``mode`` ``"legacy"``
  for the 2025-11-25 handshake, ``"auto"`` for 2026-07-28).
- ``RawStdio(command)``: a stdio peer spoken to line by line, for exact wire checks.

Tests here are synchronous and run their async part with ``anyio.run``.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import pytest

from .upstream_http import Served, serve

UPSTREAM_SCRIPT = Path(__file__).resolve().with_name("upstream.py")

Transport = Literal["stdio", "http"]
Mode = Literal["legacy", "auto"]
TRANSPORTS: tuple[Transport, ...] = ("stdio", "http")
MODES: tuple[Mode, ...] = ("legacy", "auto")
REVISION = {"legacy": "2025-11-25", "auto": "2026-07-28"}


class Counter(os.PathLike[str]):
    """The upstream's execution log: one JSON object per line, one line per execution."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __fspath__(self) -> str:
        return str(self.path)

    def __repr__(self) -> str:
        return f"Counter({str(self.path)!r})"

    def executions(self, tool: str | None = None) -> list[dict[str, Any]]:
        """What ran so far (optionally of one tool): ``tool``, ``arguments``, ``received``, ``token``."""
        if not self.path.exists():
            return []
        lines = self.path.read_text(encoding="utf-8").splitlines()
        runs = [json.loads(line) for line in lines if line]
        return [run for run in runs if tool is None or run["tool"] == tool]

    def count(self, tool: str | None = None) -> int:
        return len(self.executions(tool))


@pytest.fixture
def counter(tmp_path: Path) -> Counter:
    return Counter(tmp_path / "executions.jsonl")


def upstream_stdio_command(counter: os.PathLike[str] | str, misbehave: str | None = None) -> list[str]:
    """``[python, upstream.py, --counter FILE, ...]``: the upstream as a stdio server."""
    command = [sys.executable, str(UPSTREAM_SCRIPT), "--counter", os.fspath(counter)]
    return command if misbehave is None else [*command, "--misbehave", misbehave]


@pytest.fixture
def upstream_http(counter: Counter) -> Iterator[Callable[..., Served]]:
    """Start the upstream over HTTP (``misbehave=None, *, stateless=None``), logging to ``counter``."""
    started: list[Served] = []

    def start(misbehave: str | None = None, *, stateless: bool | None = None, **options: Any) -> Served:
        served = serve(counter.path, misbehave, stateless=stateless, **options)
        started.append(served)
        return served

    yield start
    for served in reversed(started):
        served.close()


@asynccontextmanager
async def connect(
    transport: Transport,
    mode: Mode,
    target: list[str] | str,
    *,
    elicitation_callback: Any = None,
    message_handler: Any = None,
    read_timeout_seconds: float | None = None,
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
    headers: dict[str, str] | None = None,
    errlog: Any = None,
) -> AsyncIterator[Any]:
    """An entered ``mcp.Client`` for a stdio command (list) or an HTTP URL, in ``mode``.

    stdio: the SDK starts ``target`` with only a few inherited variables (PATH, HOME, ...) plus
    ``env``; pass what the child needs. http: the client sends ``headers`` on every request and
    ignores proxy settings from the environment. ``errlog`` gets the child's stderr (stdio).
    """
    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import stdio_client
    from mcp.client.streamable_http import streamable_http_client

    async with AsyncExitStack() as stack:
        server: Any
        if transport == "stdio":
            if not isinstance(target, list):
                raise TypeError("connect('stdio', ...) takes the command as a list of strings")
            params = StdioServerParameters(command=target[0], args=target[1:], env=env, cwd=cwd)
            server = stdio_client(params, errlog=errlog if errlog is not None else sys.stderr)
        else:
            if not isinstance(target, str):
                raise TypeError("connect('http', ...) takes the endpoint URL")
            server = streamable_http_client(target, http_client=await stack.enter_async_context(_http_client(headers)))
        client = Client(server, mode=mode, elicitation_callback=elicitation_callback,
                        message_handler=message_handler, read_timeout_seconds=read_timeout_seconds)  # fmt: skip
        yield await stack.enter_async_context(client)


def _http_client(headers: dict[str, str] | None) -> Any:
    """The SDK's default HTTP client settings (timeouts), without environment proxies."""
    import httpx2
    from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT, MCP_DEFAULT_TIMEOUT

    timeout = httpx2.Timeout(MCP_DEFAULT_TIMEOUT, read=MCP_DEFAULT_SSE_READ_TIMEOUT)
    return httpx2.AsyncClient(headers=headers, timeout=timeout, trust_env=False)


def confirming(answer: bool = True, *, seen: list[Any] | None = None) -> Any:
    """An elicitation callback that answers ``{"confirm": answer}`` (recording each request in ``seen``)."""
    import mcp_types

    async def callback(context: Any, params: Any) -> Any:
        if seen is not None:
            seen.append(params)
        return mcp_types.ElicitResult(action="accept", content={"confirm": answer})

    return callback


@pytest.fixture(name="upstream_stdio_command")
def _upstream_stdio_command() -> Callable[..., list[str]]:
    return upstream_stdio_command


@pytest.fixture(name="connect")
def _connect() -> Callable[..., Any]:
    return connect


class RawStdio:
    """A stdio MCP peer spoken to line by line, for exact wire checks (one JSON-RPC message a line)."""

    def __init__(self, command: list[str], *, env: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self.lines: queue.Queue[bytes] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(b"")  # end of output

    def send(self, message: dict[str, Any] | str) -> None:
        """Write one message (a dict is serialized compactly; a str is sent as it is)."""
        assert self.process.stdin is not None
        text = message if isinstance(message, str) else json.dumps(message, separators=(",", ":"))
        self.process.stdin.write(text.encode() + b"\n")
        self.process.stdin.flush()

    def receive(self, timeout: float = 60.0) -> bytes:
        """The next line the peer wrote (``b""`` once its stdout closed)."""
        return self.lines.get(timeout=timeout)

    def close(self, timeout: float = 60.0) -> int:
        """Close its stdin and wait for it to exit; its exit code."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            try:
                self.process.stdin.close()
            except BrokenPipeError:
                pass
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def __enter__(self) -> RawStdio:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
