"""A fake upstream MCP server speaking raw JSON lines, for the stdio relay's tests.

Every line it receives is reported back as a ``test/received`` notification (``raw``: the exact
line), then handled: ``initialize`` settles on the requested version, ``ping`` answers ``{}``,
``test/env`` names the environment's ``CTRLRUN_*`` and ``FAKE_*`` variables, ``tools/call``
acts by tool name (``echo``, ``ask``, ``exit``, ``hang``, ``silent``, ``wrong_id``,
``garbage``). ``test/close_stdin`` closes its stdin and lives on; ``test/exit_leaving_output``
exits while a grandchild keeps its stdin and stdout open. Flags: ``--linger`` (keep running
after stdin ends), ``--stubborn`` (also ignore SIGTERM).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from typing import Any

out = sys.stdout.buffer


def send(message: dict[str, Any]) -> None:
    out.write(json.dumps(message).encode("utf-8") + b"\n")  # default separators: not compact
    out.flush()


def result(ident: Any, value: dict[str, Any]) -> None:
    send({"jsonrpc": "2.0", "id": ident, "result": value})


def text(value: Any) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": json.dumps(value)}], "structuredContent": value, "isError": False}


def forever() -> None:
    threading.Event().wait()


def main() -> None:
    flags = set(sys.argv[1:])
    if "--stubborn" in flags:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.stderr.write("fake child started \x1b[31mred\n")
    sys.stderr.flush()
    asked: dict[Any, Any] = {}  # server-to-client request id -> the tools/call id waiting on it
    hanging: set[Any] = set()
    stdin = sys.stdin.buffer
    while True:
        line = stdin.readline()
        if not line:
            break
        raw = line.decode("utf-8").rstrip("\n")
        send({"jsonrpc": "2.0", "method": "test/received", "params": {"raw": raw}})
        message = json.loads(raw)
        method = message.get("method")
        ident = message.get("id")
        params = message.get("params") or {}
        if method is None:  # a response to one of our requests
            if ident in asked:
                result(asked.pop(ident), text({"answer": message.get("result")}))
            continue
        if method == "initialize":
            result(ident, {"protocolVersion": params.get("protocolVersion"), "capabilities": {"tools": {}, "tasks": {}},
                           "serverInfo": {"name": "fake", "version": "0"}})
        elif method == "ping":
            result(ident, {})
        elif method == "test/env":
            result(ident, {"env": {k: v for k, v in os.environ.items() if k.startswith(("CTRLRUN_", "FAKE_"))}})
        elif method == "test/close_stdin":
            os.close(0)
            send({"jsonrpc": "2.0", "method": "test/stdin_closed"})
            forever()
        elif method == "test/exit_leaving_output":
            # The grandchild holds our stdin and stdout until the gateway closes our stdin.
            subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.buffer.read()"], close_fds=False)
            os._exit(0)
        elif method == "notifications/cancelled":
            target = params.get("requestId")
            if target in hanging:
                hanging.discard(target)
                result(target, text({"late": True}))
                send({"jsonrpc": "2.0", "method": "test/late_sent", "params": {"id": target}})
        elif method == "tools/call":
            name = params.get("name")
            arguments = params.get("arguments", {})
            if name == "echo":
                result(ident, text({"arguments": arguments, "meta": params.get("_meta")}))
            elif name == "ask":
                asked["s1"] = ident
                send({"jsonrpc": "2.0", "id": "s1", "method": "elicitation/create",
                      "params": {"message": "sure?", "requestedSchema": {"type": "object", "properties": {}}}})
            elif name == "exit":
                os._exit(3)
            elif name == "hang":
                hanging.add(ident)
            elif name == "silent":
                pass
            elif name == "wrong_id":
                result(f"{ident}-wrong", text({"wrong": True}))
            elif name == "garbage":
                out.write(b"this is not json\n")
                twice = json.dumps(ident).encode()
                out.write(b'{"jsonrpc": "2.0", "id": %s, "id": %s, "result": {}}\n' % (twice, twice))
                out.flush()
                result(ident, text({"after_garbage": True}))
    if "--linger" in flags or "--stubborn" in flags:
        forever()


if __name__ == "__main__":
    main()
