"""``ctrlrun.transport``: a connect failure is ``NotExecuted`` only on evidence, against real
loopback peers on 127.0.0.1, through a real ``@protect`` on a SQLite store."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import http.client
import os
import socket
import ssl
import subprocess
import sys
import threading
import urllib.error
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import ctrlrun
from ctrlrun import EffectState, NotExecuted
from ctrlrun.control import ambient as _ambient
from ctrlrun.transport import (
    HTTPConnection,
    HTTPSConnection,
    Transport,
    effect_state,
    urlopen,
)

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  net.call:
    effect: "call:{key}"
    decision: allow
  net.keyless:
    decision: allow
"""
PREFIX = "ctrlrun.transport: no request byte was offered before the connection failed: "
PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")
OK = b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
ERROR = b"HTTP/1.0 500 Internal Server Error\r\nContent-Length: 4\r\n\r\nboom"
SEE_OTHER = b"HTTP/1.0 303 See Other\r\nLocation: /next\r\nContent-Length: 0\r\n\r\n"


# -- loopback peers


def read_request(conn: socket.socket) -> bytes:
    """One request as sent: the head, then as many body bytes as ``Content-Length`` says."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


Handler = Callable[[socket.socket, Callable[[bytes], None]], None]


def answer(reply: bytes | None) -> Handler:
    """A handler that reads the request, keeps it, sends ``reply`` (``None``: nothing) and hangs
    up; kept before the reply, so a client holding the reply sees it kept."""

    def handle(conn: socket.socket, keep: Callable[[bytes], None]) -> None:
        keep(read_request(conn))
        if reply is not None:
            conn.sendall(reply)

    return handle


def garbage_instead_of_tls(conn: socket.socket, keep: Callable[[bytes], None]) -> None:
    keep(conn.recv(65536))  # the ClientHello
    conn.sendall(b"this is not TLS\r\n" * 8)


class Peer:
    """A loopback TCP peer on 127.0.0.1 that handles each connection in turn and keeps what it
    read; ``stop()`` closes its port, so later connections are refused."""

    def __init__(self, handle: Handler) -> None:
        self.handle = handle
        self.received: list[bytes] = []
        self.stopping = False
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            conn, _ = self.listener.accept()
            with conn:
                if self.stopping:
                    return
                try:
                    self.handle(conn, self.received.append)
                except OSError:
                    pass  # the client hung up first

    def stop(self) -> None:
        if self.stopping:
            return
        self.stopping = True
        socket.create_connection(("127.0.0.1", self.port)).close()  # wakes accept()
        self.thread.join()
        self.listener.close()


@pytest.fixture
def peers() -> Iterator[Callable[[Handler], Peer]]:
    started: list[Peer] = []

    def start(handle: Handler) -> Peer:
        started.append(Peer(handle))
        return started[-1]

    yield start
    for peer in started:
        peer.stop()


def closed_port() -> int:
    """A loopback port nothing listens on: connecting to it is refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


@pytest.fixture
def refused() -> str:
    return f"http://127.0.0.1:{closed_port()}/"


@pytest.fixture(autouse=True)
def no_environment_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


# -- the protected call


class Protected:
    """``net.call`` (effect key ``call:{key}``) on a store (every shipped one), run inside
    ``context()``."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.control = ctrlrun.Control(ctrlrun.Policy.from_yaml(POLICY), self.store)

    def run(self, key: str, body: Callable[[], Any], action: str = "net.call") -> Any:
        @ctrlrun.protect(action, control=self.control)
        def net_call(key: str) -> Any:
            return body()

        with ctrlrun.context(agent="a"):
            return net_call(key)

    async def run_async(self, key: str, body: Callable[[], Any]) -> Any:
        @ctrlrun.protect("net.call", control=self.control)
        async def net_call(key: str) -> Any:
            return await body()

        with ctrlrun.context(agent="a"):
            return await net_call(key)

    def record(self, key: str) -> tuple[EffectState, int]:
        record = self.store.get_effect(f"call:{key}")
        assert record is not None
        return record.state, record.attempt


@pytest.fixture
def protected(store: Any) -> Iterator[Protected]:
    yield Protected(store)  # the store fixture closes the store


def read(url: str, **options: Any) -> bytes:
    with urlopen(url, **options) as response:
        body: bytes = response.read()
    return body


# -- import and the rule's one implementation


def test_import_ctrlrun_loads_neither_transport_nor_http_client() -> None:
    code = (
        "import ctrlrun, sys; "
        "print(sorted(m for m in ('ctrlrun.transport', 'http.client', 'urllib.request') "
        "if m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(ctrlrun.__file__).parents[1])}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_import_ctrlrun_does_not_load_ssl() -> None:
    code = "import ctrlrun, sys; print('ssl' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": str(Path(ctrlrun.__file__).parents[1])}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.stdout.strip() == "False", done.stderr


def test_transport_values_and_effect_state_by_identity() -> None:
    assert [t.value for t in Transport] == [
        "never_connected", "after_request_sent", "unreadable_response", "stream_ended_early",
        "client_disconnected",
    ]  # fmt: skip
    assert effect_state(Transport.NEVER_CONNECTED) is EffectState.FAILED
    assert Transport.NEVER_CONNECTED == "never_connected"
    assert effect_state("never_connected") is EffectState.AMBIGUOUS  # equal, but no evidence
    for other in list(Transport)[1:]:
        assert effect_state(other) is EffectState.AMBIGUOUS


def test_the_classes_are_drop_in_subclasses() -> None:
    assert issubclass(HTTPConnection, http.client.HTTPConnection)
    assert issubclass(HTTPSConnection, http.client.HTTPSConnection)
    assert HTTPSConnection("example.invalid").port == 443


# -- a fresh connection that failed before any byte: NotExecuted, failed, and a retry runs


def test_refused_connect_fails_the_effect_and_a_retry_runs(
    protected: Protected, peers: Callable[..., Peer], refused: str
) -> None:
    with pytest.raises(NotExecuted) as raised:
        protected.run("k", lambda: read(refused))
    cause = raised.value.__cause__
    assert isinstance(cause, ConnectionRefusedError)
    assert str(raised.value) == f"{PREFIX}ConnectionRefusedError: {cause}"
    assert str(raised.value).startswith(PREFIX + "ConnectionRefusedError: [Errno ")
    assert protected.record("k") == (EffectState.FAILED, 1)

    peer = peers(answer(OK))
    assert protected.run("k", lambda: read(peer.url).decode()) == "ok"
    assert protected.record("k") == (EffectState.COMMITTED, 2)
    assert len(peer.received) == 1


def test_refused_connect_of_a_bare_connection_is_not_executed(protected: Protected) -> None:
    def body() -> None:
        HTTPConnection("127.0.0.1", closed_port()).request("POST", "/refunds", body=b"{}")

    with pytest.raises(NotExecuted) as raised:
        protected.run("k", body)
    assert isinstance(raised.value.__cause__, ConnectionRefusedError)
    assert protected.record("k") == (EffectState.FAILED, 1)


def test_dns_failure_is_not_executed(protected: Protected) -> None:
    name = "ctrlrun-test.invalid"
    resolved: list[object] = []

    def resolve() -> None:
        try:
            resolved.append(socket.getaddrinfo(name, 80))
        except OSError as exc:
            resolved.append(exc)

    probe = threading.Thread(target=resolve, daemon=True)
    probe.start()
    probe.join(timeout=10)
    if not resolved:
        pytest.skip(f"resolving {name} does not fail here within 10 s (no resolver answers)")
    if not isinstance(resolved[0], socket.gaierror):
        pytest.skip(f"this resolver answers for {name} ({resolved[0]!r}), so nothing fails")

    with pytest.raises(NotExecuted) as raised:
        protected.run("k", lambda: read(f"http://{name}/"))
    assert isinstance(raised.value.__cause__, socket.gaierror)
    assert str(raised.value).startswith(PREFIX + "gaierror: ")
    assert protected.record("k") == (EffectState.FAILED, 1)


def test_tls_handshake_failure_is_not_executed(
    protected: Protected, peers: Callable[..., Peer]
) -> None:
    peer = peers(garbage_instead_of_tls)
    url = f"https://127.0.0.1:{peer.port}/"
    with pytest.raises(NotExecuted) as raised:
        protected.run("k", lambda: read(url, context=ssl.create_default_context()))
    assert isinstance(raised.value.__cause__, ssl.SSLError)
    assert protected.record("k") == (EffectState.FAILED, 1)
    assert len(peer.received) == 1 and peer.received[0][:1] == b"\x16"  # a ClientHello, no request


def test_an_executor_without_an_effect_key_is_still_an_executor_run(
    protected: Protected, refused: str
) -> None:
    with pytest.raises(NotExecuted):
        protected.run("k", lambda: read(refused), action="net.keyless")


def test_asyncio_to_thread_copies_the_run(protected: Protected, refused: str) -> None:
    async def body() -> bytes:
        return await asyncio.to_thread(read, refused)

    with pytest.raises(NotExecuted):
        asyncio.run(protected.run_async("k", body))
    assert protected.record("k") == (EffectState.FAILED, 1)


# -- anything else: the original exception, and the effect stays ambiguous


def test_request_sent_then_the_peer_closes_is_ambiguous(
    protected: Protected, peers: Callable[..., Peer]
) -> None:
    peer = peers(answer(None))
    with pytest.raises(http.client.RemoteDisconnected):
        protected.run("k", lambda: read(peer.url, data=b"amount=10"))
    assert protected.record("k") == (EffectState.AMBIGUOUS, 1)
    assert peer.received[0].startswith(b"POST / HTTP/1.1\r\n")


def test_a_second_connection_refused_after_a_request_is_ambiguous(
    protected: Protected, peers: Callable[..., Peer], refused: str
) -> None:
    peer = peers(answer(OK))

    def body() -> None:
        assert read(peer.url) == b"ok"
        read(refused)

    with pytest.raises(urllib.error.URLError) as raised:
        protected.run("k", body)
    assert isinstance(raised.value.reason, ConnectionRefusedError)
    assert protected.record("k") == (EffectState.AMBIGUOUS, 1)


@pytest.mark.parametrize(("reply", "code"), [(ERROR, 500), (SEE_OTHER, 303)])
def test_an_http_status_is_never_not_executed(
    protected: Protected, peers: Callable[..., Peer], reply: bytes, code: int
) -> None:
    peer = peers(answer(reply))
    with pytest.raises(urllib.error.HTTPError) as raised:
        protected.run("k", lambda: read(peer.url, data=b"{}"))
    assert raised.value.code == code
    assert protected.record("k") == (EffectState.AMBIGUOUS, 1)
    assert len(peer.received) == 1  # the 303 was not followed
    peer.stop()
    assert len(peer.received) == 1


def test_a_connection_reused_after_a_send_then_refused_is_ambiguous(
    protected: Protected, peers: Callable[..., Peer]
) -> None:
    peer = peers(answer(OK))

    def body() -> None:
        conn = HTTPConnection("127.0.0.1", peer.port)
        conn.request("GET", "/")
        assert conn.getresponse().read() == b"ok"
        peer.stop()  # its port now refuses
        conn.request("GET", "/")  # reconnects: refused

    with pytest.raises(ConnectionRefusedError):
        protected.run("k", body)
    assert protected.record("k") == (EffectState.AMBIGUOUS, 1)


def test_a_connection_that_sent_before_the_run_is_not_evidence(
    protected: Protected, peers: Callable[..., Peer]
) -> None:
    peer = peers(answer(OK))
    conn = HTTPConnection("127.0.0.1", peer.port)
    conn.request("GET", "/")
    assert conn.getresponse().read() == b"ok"  # outside any run: only this object is marked
    peer.stop()
    with pytest.raises(ConnectionRefusedError):
        protected.run("k", conn.connect)
    assert protected.record("k") == (EffectState.AMBIGUOUS, 1)


def test_a_connection_that_held_a_socket_it_did_not_open_is_not_evidence(
    protected: Protected,
) -> None:
    conn = HTTPConnection("127.0.0.1", closed_port())
    mine, theirs = socket.socketpair()
    conn.sock = mine  # anything may have been written to it
    conn.close()
    theirs.close()
    with pytest.raises(ConnectionRefusedError):
        protected.run("k", conn.connect)
    assert protected.record("k") == (EffectState.AMBIGUOUS, 1)


def test_a_send_before_the_run_does_not_spoil_a_later_run(
    protected: Protected, peers: Callable[..., Peer], refused: str
) -> None:
    peer = peers(answer(OK))
    assert read(peer.url) == b"ok"  # no run open: marks the runs open now, and there are none
    with pytest.raises(NotExecuted):
        protected.run("k", lambda: read(refused))
    assert protected.record("k") == (EffectState.FAILED, 1)


@pytest.mark.parametrize(
    "url", ["ftp://127.0.0.1/file", "file:///etc/hostname", "data:,hello", "127.0.0.1/x"]
)
def test_an_unsupported_scheme_is_a_url_error_and_ambiguous(
    protected: Protected, url: str
) -> None:
    with pytest.raises(urllib.error.URLError) as raised:
        protected.run("k", lambda: read(url))
    assert "http and https URLs only" in str(raised.value.reason)
    assert protected.record("k") == (EffectState.AMBIGUOUS, 1)


def test_a_base_exception_from_connect_is_never_converted(protected: Protected) -> None:
    def interrupted(*args: Any, **kwargs: Any) -> socket.socket:
        raise KeyboardInterrupt

    conn = HTTPConnection("127.0.0.1", closed_port())
    conn._create_connection = interrupted  # where http.client opens its socket
    with pytest.raises(KeyboardInterrupt):
        protected.run("k", conn.connect)
    assert protected.record("k") == (EffectState.AMBIGUOUS, 1)


# -- outside an executor run, nothing is claimed


def test_refused_outside_any_executor_is_never_not_executed(refused: str) -> None:
    with pytest.raises(urllib.error.URLError) as raised:
        read(refused)
    assert not isinstance(raised.value, NotExecuted)
    assert isinstance(raised.value.reason, ConnectionRefusedError)
    with pytest.raises(ConnectionRefusedError):
        HTTPConnection("127.0.0.1", closed_port()).connect()


def test_a_thread_that_outlives_its_run_claims_nothing(protected: Protected) -> None:
    started, finished = threading.Event(), threading.Event()
    raised: list[BaseException] = []

    def late() -> None:
        started.wait()  # the run is over by now
        try:
            HTTPConnection("127.0.0.1", closed_port()).connect()
        except BaseException as exc:
            raised.append(exc)
        finished.set()

    def body() -> None:
        threading.Thread(target=contextvars.copy_context().run, args=(late,), daemon=True).start()

    protected.run("k", body)
    started.set()
    finished.wait()
    assert type(raised[0]) is ConnectionRefusedError


def test_runs_leave_nothing_behind(protected: Protected) -> None:
    seen: list[bool] = []

    def body() -> None:
        seen.append(_ambient.current_run() is not None)

    for key in range(20):
        protected.run(str(key), body)
    gc.collect()
    assert seen == [True] * 20
    assert not [o for o in gc.get_objects() if isinstance(o, _ambient.Run)]
    assert _ambient.current_run() is None


# -- sends elsewhere in the run


def test_a_thread_without_the_context_marks_the_run(
    protected: Protected, peers: Callable[..., Peer], refused: str
) -> None:
    peer = peers(answer(OK))

    def body() -> None:
        sender = threading.Thread(target=read, args=(peer.url,))  # a plain thread: no context
        sender.start()
        sender.join()
        read(refused)

    with pytest.raises(urllib.error.URLError):
        protected.run("k", body)
    assert len(peer.received) == 1
    assert protected.record("k") == (EffectState.AMBIGUOUS, 1)


def test_a_thread_with_the_copied_context_marks_the_run(
    protected: Protected, peers: Callable[..., Peer], refused: str
) -> None:
    peer = peers(answer(OK))

    def body() -> None:
        copied = contextvars.copy_context()
        sender = threading.Thread(target=copied.run, args=(read, peer.url))
        sender.start()
        sender.join()
        read(refused)

    with pytest.raises(urllib.error.URLError):
        protected.run("k", body)
    assert protected.record("k") == (EffectState.AMBIGUOUS, 1)


def test_a_thread_that_outlived_its_run_marks_the_runs_open_now(
    protected: Protected, peers: Callable[..., Peer], refused: str
) -> None:
    peer = peers(answer(OK))
    go, sent = threading.Event(), threading.Event()

    def late() -> None:
        go.wait()
        read(peer.url)
        sent.set()

    def first() -> None:
        threading.Thread(target=contextvars.copy_context().run, args=(late,), daemon=True).start()

    def second() -> None:
        go.set()  # the first run is over; its thread sends now, during this one
        sent.wait()
        read(refused)

    protected.run("first", first)
    with pytest.raises(urllib.error.URLError):
        protected.run("second", second)
    assert protected.record("second") == (EffectState.AMBIGUOUS, 1)


def test_a_send_in_a_nested_protected_call_marks_the_outer_run(
    protected: Protected, peers: Callable[..., Peer], refused: str
) -> None:
    peer = peers(answer(OK))

    def body() -> None:
        assert protected.run("inner", lambda: read(peer.url).decode()) == "ok"
        read(refused)

    with pytest.raises(urllib.error.URLError):
        protected.run("outer", body)
    assert protected.record("inner") == (EffectState.COMMITTED, 1)
    assert protected.record("outer") == (EffectState.AMBIGUOUS, 1)


# -- proxies and the bytes on the wire


def test_environment_proxies_are_honoured(
    monkeypatch: pytest.MonkeyPatch, peers: Callable[..., Peer]
) -> None:
    proxy = peers(answer(OK))
    monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{proxy.port}")
    assert read("http://origin.invalid/refunds") == b"ok"
    assert proxy.received[0].startswith(b"GET http://origin.invalid/refunds HTTP/1.1\r\n")


def test_a_refused_proxy_is_not_executed(
    protected: Protected, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("https_proxy", f"http://127.0.0.1:{closed_port()}")
    with pytest.raises(NotExecuted) as raised:
        protected.run("k", lambda: read("https://origin.invalid/"))
    assert isinstance(raised.value.__cause__, ConnectionRefusedError)
    assert protected.record("k") == (EffectState.FAILED, 1)


def test_a_proxy_connect_line_counts_as_a_byte(
    protected: Protected, peers: Callable[..., Peer], monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = peers(answer(None))  # reads the CONNECT line, then hangs up
    monkeypatch.setenv("https_proxy", f"http://127.0.0.1:{proxy.port}")
    with pytest.raises(urllib.error.URLError):
        protected.run("k", lambda: read("https://origin.invalid/"))
    assert proxy.received[0].startswith(b"CONNECT origin.invalid:443 HTTP/1.0\r\n")
    assert protected.record("k") == (EffectState.AMBIGUOUS, 1)


def test_the_wire_bytes_are_those_of_http_client(peers: Callable[..., Peer]) -> None:
    sent = []
    for cls in (http.client.HTTPConnection, HTTPConnection):
        peer = peers(answer(OK))
        conn = cls("127.0.0.1", peer.port)
        conn.request("POST", "/refunds", body=b'{"amount": 10}', headers={"X-Key": "k"})
        assert conn.getresponse().read() == b"ok"
        conn.close()
        peer.stop()
        sent.append(peer.received[0].replace(str(peer.port).encode(), b"PORT"))
    assert sent[0] == sent[1]
