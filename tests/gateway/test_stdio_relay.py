"""The stdio relay on raw JSON-RPC lines: a fake child process, a fake interceptor, real pipes.

The fake child reports every line it receives as a ``test/received`` notification, so each test
sees exactly what reached the upstream, in order.
"""

from __future__ import annotations

import io
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ctrlrun.action import Principal
from ctrlrun.gateway import wire
from ctrlrun.gateway.config import GatewayConfig
from ctrlrun.gateway.intercept import Forward, Interceptor, Reply
from ctrlrun.gateway.outcome import Answered, Broken, Cancelled, NeverConnected, Observation, classify
from ctrlrun.gateway.stdio import child_environment, serve_stdio
from ctrlrun.gateway.tools import Catalog
from ctrlrun.transport import Transport

FAKE = str(Path(__file__).parent / "stdio_fakes" / "fake_child.py")
WAIT = 30.0  # a bound on how long a broken test hangs, never a timing assertion

Message = dict[str, Any]


class FakeInterceptor(Interceptor):
    """Forwards the call unchanged, classifies what came back, replies as the real one would."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def call(self, message: Message, *, principal: Principal | str | None, revision: str | None,
             forward: Forward, reply: Reply) -> None:
        record: dict[str, Any] = {"message": message, "principal": principal, "revision": revision}
        with self.lock:
            self.calls.append(record)
        observation = forward(message)
        record["observation"] = observation
        if isinstance(observation, Cancelled):
            return
        verdict = classify(observation, revision=revision)
        if verdict.relay is not None:
            reply(verdict.relay)
        else:
            code = -41011 if verdict.state == "failed" else -41010
            reply(wire.error(message["id"], code, verdict.detail, {"error": wire.CODES[code]}))

    def observation(self, ident: Any) -> Observation:
        with self.lock:
            found = [c["observation"] for c in self.calls if c["message"]["id"] == ident]
        assert len(found) == 1, found
        result: Observation = found[0]
        return result


class RaisingInterceptor(Interceptor):
    def __init__(self) -> None:  # none of the real one's wiring
        pass

    def call(self, message: Message, *, principal: Principal | str | None, revision: str | None,
             forward: Forward, reply: Reply) -> None:
        raise RuntimeError("boom")


class FakeCatalog(Catalog):
    """Passes everything through, except that ``initialize`` loses ``tasks`` (as the real one)."""

    def __init__(self) -> None:
        self.results: list[tuple[str | None, Message]] = []
        self.notifications: list[Message] = []

    def relay_result(self, method: str | None, message: Message) -> Message:
        self.results.append((method, message))
        if method == "initialize" and "result" in message:
            message = json.loads(json.dumps(message))
            message["result"]["capabilities"].pop("tasks", None)
        return message

    def relay_notification(self, message: Message) -> None:
        self.notifications.append(message)


class Session:
    """``serve_stdio`` in a thread, fed through OS pipes, in front of the fake child."""

    def __init__(self, *flags: str, timeout: float = WAIT, grace: float = WAIT,
                 interceptor: Interceptor | None = None,
                 principal: tuple[str, str | None] | None = ("agent-1", None)) -> None:
        host_read, gw_write = os.pipe()
        gw_read, host_write = os.pipe()
        self.host_in = open(host_write, "wb", buffering=0)
        self.gw_stdin = open(gw_read, "rb")
        self.gw_stdout = open(gw_write, "wb")
        self.host_out = open(host_read, "rb")
        self.stderr = io.StringIO()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.interceptor = interceptor if interceptor is not None else FakeInterceptor()
        self.catalog = FakeCatalog()
        self.inbox: queue.Queue[tuple[bytes, Message | None]] = queue.Queue()
        self.seen: list[tuple[bytes, Message | None]] = []
        self.code: int | None = None
        config = GatewayConfig(alias="fake", command=(sys.executable, FAKE, *flags), principal=principal,
                               upstream_timeout=timeout)

        def spawn(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
            proc: subprocess.Popen[bytes] = subprocess.Popen(*args, **kwargs)
            self.procs.append(proc)
            return proc

        def serve() -> None:
            self.code = serve_stdio(config, self.interceptor, self.catalog, self.gw_stdin, self.gw_stdout,
                                    stderr=self.stderr, grace=grace, spawn=spawn)

        def read() -> None:
            for line in self.host_out:
                self.inbox.put((line, json.loads(line)))
            self.inbox.put((b"", None))

        self.server = threading.Thread(target=serve, daemon=True)
        self.reader = threading.Thread(target=read, daemon=True)
        self.server.start()
        self.reader.start()

    def send(self, message: Message | bytes) -> None:
        line = message if isinstance(message, bytes) else json.dumps(message).encode()
        self.host_in.write(line.rstrip(b"\n") + b"\n")

    def expect(self, match: Callable[[Message], bool]) -> Message:
        """The next message from the gateway that ``match``es (others are kept in ``seen``)."""
        while True:
            raw, message = self.inbox.get(timeout=WAIT)
            self.seen.append((raw, message))
            assert message is not None, "the gateway's stdout ended"
            if match(message):
                return message

    def answer(self, ident: Any) -> Message:
        return self.expect(lambda m: "method" not in m and m.get("id") == ident)

    def received(self, fragment: str) -> str:
        """The raw line the child received next that contains ``fragment``."""
        found = self.expect(lambda m: m.get("method") == "test/received" and fragment in m["params"]["raw"])
        raw: str = found["params"]["raw"]
        return raw

    def child_got(self) -> list[str]:
        return [m["params"]["raw"] for _, m in self.seen if m is not None and m.get("method") == "test/received"]

    def raw_line(self, ident: Any) -> bytes:
        return next(raw for raw, m in self.seen if m is not None and "method" not in m and m.get("id") == ident)

    def wait_served(self) -> int:
        self.server.join(WAIT)
        assert not self.server.is_alive(), "serve_stdio did not return"
        assert self.code is not None
        self.gw_stdout.close()
        self.reader.join(WAIT)
        while True:
            item = self.inbox.get_nowait()
            self.seen.append(item)
            if item[1] is None:
                return self.code

    def close(self) -> int:
        self.host_in.close()
        return self.wait_served()

    def cleanup(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for stream in (self.host_in, self.gw_stdin, self.gw_stdout, self.host_out):
            try:
                stream.close()
            except OSError:
                pass


@pytest.fixture
def session() -> Iterator[Callable[..., Session]]:
    made: list[Session] = []

    def make(*flags: str, **kwargs: Any) -> Session:
        s = Session(*flags, **kwargs)
        made.append(s)
        return s

    yield make
    for s in made:
        s.cleanup()


def call(ident: Any, name: str, arguments: Message | None = None, **params: Any) -> Message:
    body: Message = {"name": name, **params}
    if arguments is not None:
        body["arguments"] = arguments
    return {"jsonrpc": "2.0", "id": ident, "method": "tools/call", "params": body}


def ping(ident: Any) -> Message:
    return {"jsonrpc": "2.0", "id": ident, "method": "ping"}


def test_messages_are_relayed_in_our_own_serialization(session: Callable[..., Session]) -> None:
    s = session()
    s.send(b'{"jsonrpc": "2.0",   "id": 1, "method": "ping"}')
    assert s.received('"ping"') == '{"jsonrpc":"2.0","id":1,"method":"ping"}'
    assert s.answer(1) == {"jsonrpc": "2.0", "id": 1, "result": {}}
    assert s.raw_line(1) == b'{"jsonrpc":"2.0","id":1,"result":{}}\n'  # the child wrote it with spaces
    s.send(b'{"jsonrpc": "2.0", "method": "notifications/initialized" }')
    assert s.received("initialized") == '{"jsonrpc":"2.0","method":"notifications/initialized"}'
    s.send(b'{ "jsonrpc" : "2.0", "id": "c1", "method": "tools/call", "params": {"name": "echo", "arguments": {"b": 1, "a": "\\u00e9"}}}')
    forwarded = s.received("tools/call")
    assert forwarded == '{"jsonrpc":"2.0","id":"c1","method":"tools/call","params":{"name":"echo","arguments":{"b":1,"a":"é"}}}'
    answer = s.answer("c1")
    assert answer["result"]["structuredContent"]["arguments"] == {"b": 1, "a": "é"}
    interceptor = s.interceptor
    assert isinstance(interceptor, FakeInterceptor)
    assert interceptor.calls[0]["principal"] == Principal("agent-1", None)
    assert isinstance(interceptor.observation("c1"), Answered)
    assert ("ping", {"jsonrpc": "2.0", "id": 1, "result": {}}) in s.catalog.results
    assert not any(method == "tools/call" for method, _ in s.catalog.results)  # the interceptor's
    assert any(n.get("method") == "test/received" for n in s.catalog.notifications)
    assert s.close() == 0


def test_initialize_goes_through_the_catalog(session: Callable[..., Session]) -> None:
    s = session()
    s.send({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-06-18"}})
    answer = s.answer(0)
    assert answer["result"]["protocolVersion"] == "2025-06-18"
    assert "tasks" not in answer["result"]["capabilities"]
    assert s.catalog.results[0][0] == "initialize"
    assert s.close() == 0


def test_refused_messages_are_answered_and_never_forwarded(session: Callable[..., Session]) -> None:
    s = session()
    s.send(b'{"jsonrpc":"2.0","id":1,"id":2,"method":"tools/call","params":{"name":"echo"}}')
    duplicate = s.answer(None)
    assert duplicate["error"]["code"] == wire.PARSE_ERROR
    s.send(b'[{"jsonrpc":"2.0","id":3,"method":"ping"}]')
    assert s.answer(None)["error"]["code"] == wire.INVALID_REQUEST
    s.send(b'{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"echo","arguments":{"x":"\xff"}}}')
    assert s.answer(None)["error"]["code"] == wire.PARSE_ERROR
    s.send(b'{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"echo","arguments":{"x":NaN}}}')
    assert s.answer(None)["error"]["code"] == wire.PARSE_ERROR
    s.send(b'{"jsonrpc":"1.0","id":6,"method":"ping"}')
    assert s.answer(6)["error"]["code"] == wire.INVALID_REQUEST
    s.send(b"not json at all")
    assert s.answer(None)["error"]["code"] == wire.PARSE_ERROR
    s.send(ping(7))
    s.answer(7)
    assert s.child_got() == ['{"jsonrpc":"2.0","id":7,"method":"ping"}']
    assert s.interceptor.calls == []  # type: ignore[attr-defined]
    assert s.close() == 0
    assert "refused a client message" in s.stderr.getvalue()


def test_the_calls_revision_is_checked_and_passed_on(session: Callable[..., Session]) -> None:
    s = session()
    interceptor = s.interceptor
    assert isinstance(interceptor, FakeInterceptor)
    s.send(call(1, "echo", {}))
    s.answer(1)
    assert interceptor.calls[-1]["revision"] is None  # before initialize, no envelope
    s.send({"jsonrpc": "2.0", "id": 2, "method": "initialize", "params": {"protocolVersion": "2025-06-18"}})
    s.answer(2)
    s.send(call(3, "echo", {}))
    s.answer(3)
    assert interceptor.calls[-1]["revision"] == "2025-06-18"
    envelope = {wire.META_REVISION: "2026-07-28"}
    s.send(call(4, "echo", {}, _meta=envelope))
    s.answer(4)
    assert interceptor.calls[-1]["revision"] == "2026-07-28"
    s.send(call(5, "echo", {}, _meta={wire.META_REVISION: "2099-01-01"}))
    refused = s.answer(5)
    assert refused["error"]["code"] == wire.UNSUPPORTED_REVISION
    assert refused["error"]["data"] == {"supported": list(wire.REVISIONS), "requested": "2099-01-01"}
    s.send({"jsonrpc": "2.0", "id": 6, "method": "ping", "params": {"_meta": {wire.META_REVISION: 7}}})
    assert s.answer(6)["error"]["code"] == wire.UNSUPPORTED_REVISION
    s.send({"jsonrpc": "2.0", "id": 7, "method": "initialize", "params": {"protocolVersion": "2030-01-01"}})
    s.answer(7)  # the upstream settled on a revision the gateway cannot classify
    s.send(call(8, "echo", {}))
    assert s.answer(8)["error"]["code"] == wire.UNSUPPORTED_REVISION
    s.send(ping(9))
    s.answer(9)
    assert not any('"id":5' in raw or '"id":6' in raw or '"id":8' in raw for raw in s.child_got())
    assert len(interceptor.calls) == 3
    assert s.close() == 0


def test_a_call_reusing_an_in_flight_id_is_refused_while_others_go_on(session: Callable[..., Session]) -> None:
    s = session()
    s.send(call(7, "hang", {}))
    s.received('"hang"')
    s.send(call(7, "echo", {"again": True}))
    assert s.answer(7)["error"]["code"] == wire.INVALID_REQUEST
    s.send(ping(7))
    assert s.answer(7)["error"]["code"] == wire.INVALID_REQUEST
    s.send(ping(8))  # handled while call 7 is still waiting
    assert s.answer(8) == {"jsonrpc": "2.0", "id": 8, "result": {}}
    assert not any("again" in raw for raw in s.child_got())
    s.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7}})
    s.expect(lambda m: m.get("method") == "test/late_sent")
    assert s.close() == 0


def test_a_server_request_during_a_call_is_relayed_both_ways(session: Callable[..., Session]) -> None:
    s = session()
    s.send(call(5, "ask", {}))
    asked = s.expect(lambda m: m.get("method") == "elicitation/create")
    assert asked["id"] == "s1"
    s.send(b'{"jsonrpc": "2.0", "id": "s1", "result": {"action": "accept", "content": {"ok": true}}}')
    assert s.received('"s1"') == '{"jsonrpc":"2.0","id":"s1","result":{"action":"accept","content":{"ok":true}}}'
    answer = s.answer(5)
    assert answer["result"]["structuredContent"] == {"answer": {"action": "accept", "content": {"ok": True}}}
    interceptor = s.interceptor
    assert isinstance(interceptor, FakeInterceptor)
    assert len(interceptor.calls) == 1 and isinstance(interceptor.observation(5), Answered)
    assert s.close() == 0


def test_the_child_exiting_mid_call_breaks_it_and_ends_the_session(session: Callable[..., Session]) -> None:
    s = session()
    s.send(call(9, "exit", {}))
    assert s.wait_served() == 1  # the host never closed stdin
    answer = next(m for _, m in s.seen if m is not None and m.get("id") == 9)
    assert answer["error"]["code"] == -41010
    observation = s.interceptor.observation(9)  # type: ignore[attr-defined]
    assert isinstance(observation, Broken) and observation.transport is Transport.STREAM_ENDED_EARLY
    assert s.procs[0].returncode == 3


def test_a_request_after_the_child_closed_its_input_never_connected(session: Callable[..., Session]) -> None:
    s = session(grace=0.2)
    s.send({"jsonrpc": "2.0", "method": "test/close_stdin"})
    s.expect(lambda m: m.get("method") == "test/stdin_closed")
    s.send(call(1, "echo", {}))
    assert s.answer(1)["error"]["code"] == -41011
    assert isinstance(s.interceptor.observation(1), NeverConnected)  # type: ignore[attr-defined]
    s.send(ping(2))
    assert s.answer(2)["error"]["code"] == wire.INTERNAL_ERROR  # relayed requests say so too
    assert s.close() == 0
    assert s.procs[0].returncode == -signal.SIGTERM


def test_a_request_after_the_child_exited_never_connected(session: Callable[..., Session]) -> None:
    s = session()
    s.send({"jsonrpc": "2.0", "method": "test/exit_leaving_output"})
    s.received("exit_leaving_output")
    s.procs[0].wait(WAIT)  # its grandchild still holds the pipes
    s.send(call(1, "echo", {}))
    assert s.answer(1)["error"]["code"] == -41011
    observation = s.interceptor.observation(1)  # type: ignore[attr-defined]
    assert isinstance(observation, NeverConnected) and "exited" in observation.detail
    assert s.close() == 0
    assert not any("tools/call" in raw for raw in s.child_got())


def test_a_cancelled_call_returns_at_once_and_its_late_answer_is_dropped(session: Callable[..., Session]) -> None:
    s = session()
    s.send(call("h", "hang", {}))
    s.received('"hang"')
    s.send(b'{"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "h", "reason": "x"}}')
    assert s.received("cancelled") == (
        '{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"h","reason":"x"}}'
    )
    s.expect(lambda m: m.get("method") == "test/late_sent")  # the child answered after that
    s.send(ping(1))
    s.answer(1)
    assert s.close() == 0
    assert not any(m is not None and "method" not in m and m.get("id") == "h" for _, m in s.seen)
    assert isinstance(s.interceptor.observation("h"), Cancelled)  # type: ignore[attr-defined]
    assert "late answer" in s.stderr.getvalue()


def test_a_call_cancelled_before_it_was_forwarded_is_not_written() -> None:
    seen: list[Observation] = []
    entered, release = threading.Event(), threading.Event()

    class Slow(Interceptor):
        def __init__(self) -> None:
            pass

        def call(self, message: Message, *, principal: Principal | str | None, revision: str | None,
                 forward: Forward, reply: Reply) -> None:
            entered.set()
            release.wait(WAIT)
            seen.append(forward(message))

    s = Session(interceptor=Slow())
    try:
        s.send(call(1, "echo", {}))
        assert entered.wait(WAIT)
        s.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}})
        s.send(ping(2))
        s.answer(2)
        release.set()
        assert s.close() == 0
        assert seen == [Cancelled()]
        assert s.child_got() == ['{"jsonrpc":"2.0","id":2,"method":"ping"}']  # neither call nor cancel
    finally:
        release.set()
        s.cleanup()


def test_no_answer_in_time_is_broken_and_the_id_stays_taken(session: Callable[..., Session]) -> None:
    s = session(timeout=0.2)
    s.send(call(1, "silent", {}))
    assert s.answer(1)["error"]["code"] == -41010
    observation = s.interceptor.observation(1)  # type: ignore[attr-defined]
    assert isinstance(observation, Broken) and observation.transport is Transport.AFTER_REQUEST_SENT
    s.send(call(1, "echo", {}))  # the child may still answer the first one
    assert s.answer(1)["error"]["code"] == wire.INVALID_REQUEST
    s.send(call(2, "wrong_id", {}))
    assert s.answer(2)["error"]["code"] == -41010
    assert not any(m is not None and m.get("id") == "2-wrong" for _, m in s.seen)
    assert s.close() == 0
    assert "answer to no request in flight" in s.stderr.getvalue()


def test_lines_from_the_child_that_are_not_strict_are_dropped(session: Callable[..., Session]) -> None:
    s = session()
    s.send(call(3, "garbage", {}))
    answer = s.answer(3)
    assert answer["result"]["structuredContent"] == {"after_garbage": True}
    assert s.close() == 0
    log = s.stderr.getvalue()
    assert log.count("not a strict JSON-RPC message") == 2
    assert "this is not json" in log


@pytest.mark.parametrize(("flags", "returncode"), [((), 0), (("--linger",), -signal.SIGTERM), (("--stubborn",), -signal.SIGKILL)])
def test_the_host_closing_stdin_stops_the_child(session: Callable[..., Session], flags: tuple[str, ...], returncode: int) -> None:
    s = session(*flags, grace=0.2)
    s.send(ping(1))
    s.answer(1)
    assert s.close() == 0
    assert s.procs[0].returncode == returncode


def test_the_child_does_not_inherit_ctrlrun_variables(session: Callable[..., Session], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CTRLRUN_STORE_URL", "postgresql://secret")
    monkeypatch.setenv("CTRLRUN_CONFIG", "/x/ctrlrun.yaml")
    monkeypatch.setenv("FAKE_MARK", "kept")
    s = session()
    s.send({"jsonrpc": "2.0", "id": 1, "method": "test/env"})
    assert s.answer(1)["result"]["env"] == {"FAKE_MARK": "kept"}
    assert s.close() == 0
    assert child_environment({"CTRLRUN_X": "1", "PATH": "/bin"}) == {"PATH": "/bin"}


def test_the_childs_stderr_is_ours_escaped(session: Callable[..., Session]) -> None:
    s = session()
    s.send(ping(1))
    s.answer(1)
    assert s.close() == 0
    log = s.stderr.getvalue()
    assert "fake child started \\x1b[31mred" in log
    assert "\x1b" not in log


def test_an_interceptor_failure_still_answers(session: Callable[..., Session]) -> None:
    s = session(interceptor=RaisingInterceptor())
    s.send(call(1, "echo", {}))
    assert s.answer(1)["error"]["code"] == wire.INTERNAL_ERROR
    assert s.close() == 0
    assert "RuntimeError: boom" in s.stderr.getvalue()


def test_no_principal_is_passed_on_as_none(session: Callable[..., Session]) -> None:
    s = session(principal=None)
    s.send(call(1, "echo", {}))
    s.answer(1)
    assert s.interceptor.calls[0]["principal"] is None  # type: ignore[attr-defined]
    assert s.close() == 0


def test_streams_without_a_descriptor_are_read_line_by_line() -> None:
    """A host that sends one line and closes: the line reaches the child before its stdin is
    closed, and the answer is written before serve_stdio returns."""
    stdin = io.BytesIO(b'{"jsonrpc": "2.0", "id": 1, "method": "ping"}\n')
    stdout = io.BytesIO()
    config = GatewayConfig(alias="fake", command=(sys.executable, FAKE), principal=("agent-1", None))
    code = serve_stdio(config, FakeInterceptor(), FakeCatalog(), stdin, stdout, stderr=io.StringIO(), grace=WAIT)
    assert code == 0
    lines = [json.loads(line) for line in stdout.getvalue().splitlines()]
    assert lines[-1] == {"jsonrpc": "2.0", "id": 1, "result": {}}
