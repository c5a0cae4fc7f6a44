"""The gateway's stdio transport: the host speaks to our stdin/stdout, the upstream is a child.

One JSON-RPC message per line in both directions, strict-parsed and re-serialized by us, so
either peer only ever reads what the gateway parsed. ``tools/call`` requests go through the
interceptor (each in its own thread); everything else is relayed as it comes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any, BinaryIO, TextIO

from ..action import Principal
from ..operator.text import safe
from ..errors import InvalidArgument
from ..transport import Transport
from . import wire
from .config import GatewayConfig
from .intercept import Interceptor
from .outcome import Answered, Broken, Cancelled, NeverConnected, Observation
from .tools import Catalog

__all__ = ["serve_stdio", "child_environment"]

Spawn = Callable[..., subprocess.Popen[bytes]]

_EXCERPT = 200
_CHUNK = 65536
_CANCELLED = "notifications/cancelled"


def _excerpt(line: bytes) -> str:
    text = line[:_EXCERPT].decode("utf-8", errors="backslashreplace").rstrip("\r\n")
    return text + "…" if len(line) > _EXCERPT else text


def _lines(stream: IO[bytes]) -> Iterator[bytes]:
    """The lines of ``stream``, read from its file descriptor when it has one: a thread blocked
    there holds no lock of the ``io`` object, so the interpreter can exit while it waits."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError):
        yield from iter(stream.readline, b"")
        return
    pending = bytearray()
    while chunk := os.read(fd, _CHUNK):
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            pending += chunk[start : end + 1]
            yield bytes(pending)
            pending.clear()
            start = end + 1
        pending += chunk[start:]
    if pending:
        yield bytes(pending)


def _key(ident: Any) -> tuple[str, Any]:
    """A JSON-RPC id as a dict key (``1`` and ``"1"`` are different ids)."""
    return (type(ident).__name__, ident)


def child_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The upstream child's environment: ours minus every ``CTRLRUN_*`` variable (the store URL,
    the policy path and secrets are the gateway's, not the upstream's)."""
    from ..settings import without_ctrlrun

    return without_ctrlrun(environ)


@dataclass
class _Call:
    """One intercepted client ``tools/call`` while its handler runs."""

    key: tuple[str, Any]
    message: dict[str, Any]
    revision: str | None
    cancelled: bool = False
    replied: bool = False


@dataclass
class _Waiter:
    """A forwarded request waiting for the child's response with its id."""

    result: Observation | None = None


class _Relay:
    """The state of one ``serve_stdio`` run; see ``serve_stdio``."""

    def __init__(
        self,
        config: GatewayConfig,
        interceptor: Interceptor,
        catalog: Catalog,
        stdin: BinaryIO,
        stdout: BinaryIO,
        stderr: TextIO,
        grace: float,
        spawn: Spawn,
    ) -> None:
        if not config.command:
            raise InvalidArgument(
                "the stdio gateway needs the upstream server's command: pass it after `--` "
                "(ctrlrun gateway --alias NAME ... -- COMMAND [ARG...])"
            )
        self._config = config
        self._interceptor = interceptor
        self._catalog = catalog
        self._stdin = stdin
        self._stdout = stdout
        self._stderr = stderr
        self._grace = grace
        self._spawn = spawn
        self._principal = Principal(*config.principal) if config.principal is not None else None
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._child_write = threading.Lock()  # taken before ``_lock`` when both are held
        self._out_lock = threading.Lock()
        self._err_lock = threading.Lock()
        self._calls: dict[tuple[str, Any], _Call] = {}
        self._relayed: dict[tuple[str, Any], str] = {}
        self._pending: dict[tuple[str, Any], _Waiter] = {}
        self._orphans: set[tuple[str, Any]] = set()  # cancelled or timed out, answer still due
        self._handlers: set[threading.Thread] = set()
        self._settled: str | None = None
        self._first: str | None = None  # "host" or "child": who ended the session
        self._ended = False  # the child's stdout reached its end
        self._child_stdin_closed = False
        self._closing = False  # no new client message is handled
        self._closed = False  # serve_stdio returned: nothing more is written
        self._out_broken = False
        self._proc: subprocess.Popen[bytes] | None = None

    # -- output --------------------------------------------------------------------------

    def _log(self, text: str) -> None:
        with self._err_lock:
            try:
                self._stderr.write(f"ctrlrun gateway: {safe(text)}\n")
                self._stderr.flush()
            except (OSError, ValueError):
                pass

    def _write_out(self, message: dict[str, Any]) -> bool:
        """Write one message line to our stdout (the host); False when it could not be."""
        line = wire.dumps(message) + b"\n"
        with self._out_lock:
            if self._closed or self._out_broken:
                return False
            try:
                self._stdout.write(line)
                self._stdout.flush()
            except (OSError, ValueError) as exc:
                self._out_broken = True
                self._log(f"stopped writing to stdout, the host's end is gone ({type(exc).__name__})")
                return False
        return True

    def _exited(self) -> bool:
        return self._proc is not None and self._proc.poll() is not None

    def _write_child(self, message: dict[str, Any]) -> tuple[int, int]:
        """Write one message line to the child's stdin (``_child_write`` held by the caller);
        returns (bytes written, line length): 0 written means nothing reached the child."""
        line = wire.dumps(message) + b"\n"
        proc = self._proc
        if proc is None or proc.stdin is None:
            return 0, len(line)
        with self._lock:
            if self._child_stdin_closed or self._ended or self._exited():
                return 0, len(line)
        fd = proc.stdin.fileno()
        view = memoryview(line)
        written = 0
        try:
            while written < len(line):
                written += os.write(fd, view[written:])
        except OSError as exc:
            self._log(f"writing to the upstream failed after {written} of {len(line)} bytes ({type(exc).__name__})")
        return written, len(line)

    def _relay_to_child(self, message: dict[str, Any]) -> bool:
        with self._child_write:
            written, size = self._write_child(message)
        return written == size

    # -- the intercepted call's transport ------------------------------------------------

    def forward(self, request: dict[str, Any]) -> Observation:
        """Write ``request`` to the child and wait for its response with the same id."""
        ident = request.get("id")
        key = _key(ident)
        waiter = _Waiter()
        with self._child_write:
            with self._lock:
                call = self._calls.get(key)
                if call is not None and call.cancelled:
                    return Cancelled()
                if self._child_stdin_closed or self._ended or self._exited():
                    return NeverConnected("the upstream process had exited before the request was written")
                if key in self._pending or key in self._relayed or key in self._orphans:
                    return NeverConnected(f"the id {ident!r} is already awaiting an upstream answer; not written")
                self._pending[key] = waiter
            written, size = self._write_child(request)
        if written < size:
            with self._lock:
                self._pending.pop(key, None)
                if written == 0:  # not one byte reached the child
                    return NeverConnected("the upstream's input was closed before the request was written")
                self._orphans.add(key)
            return Broken(Transport.AFTER_REQUEST_SENT, "the upstream's input closed while the request was written")
        deadline = time.monotonic() + self._config.upstream_timeout
        with self._changed:
            while waiter.result is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._changed.wait(remaining)
            if waiter.result is None:
                self._pending.pop(key, None)
                self._orphans.add(key)
                return Broken(
                    Transport.AFTER_REQUEST_SENT,
                    f"no answer from the upstream within {self._config.upstream_timeout:g} s",
                )
            return waiter.result

    def _reply(self, call: _Call, message: dict[str, Any]) -> None:
        if wire.kind(message) == "response" and _key(message.get("id")) == call.key:
            with self._lock:
                call.replied = True
                if self._calls.get(call.key) is call:
                    del self._calls[call.key]
        self._write_out(message)

    def _handle_call(self, call: _Call) -> None:
        try:
            self._interceptor.call(
                call.message,
                principal=self._principal,
                revision=call.revision,
                forward=self.forward,
                reply=lambda message: self._reply(call, message),
            )
        except Exception as exc:  # the host must still get an answer
            self._log(f"the interceptor failed on tools/call {call.message.get('id')!r}: {type(exc).__name__}: {exc}")
            if not call.replied and not call.cancelled:
                self._write_out(wire.error(
                    call.message.get("id"), wire.INTERNAL_ERROR,
                    "Internal error: the gateway failed while handling this call; see its log.",
                ))  # fmt: skip
        finally:
            with self._lock:
                if self._calls.get(call.key) is call:
                    del self._calls[call.key]
                self._handlers.discard(threading.current_thread())
                self._changed.notify_all()

    # -- client -> gateway ---------------------------------------------------------------

    def _client_line(self, line: bytes) -> None:
        if not line.strip():
            return
        try:
            message = wire.parse_message(line)
        except wire.WireError as exc:
            self._log(f"refused a client message ({exc.code}: {exc.message}): {_excerpt(line)}")
            self._write_out(exc.answer())
            return
        shape = wire.kind(message)
        if shape == "request":
            self._client_request(message)
        elif shape == "notification":
            self._client_notification(message)
        else:
            if not self._relay_to_child(message):
                self._log(f"dropped the client's response {message.get('id')!r}: the upstream's input is closed")

    def _client_request(self, message: dict[str, Any]) -> None:
        ident = message["id"]
        with self._lock:
            settled = self._settled
        revision = wire.revision_of(message, settled)
        if revision is not None and revision not in wire.REVISIONS:
            self._write_out(wire.error(
                ident, wire.UNSUPPORTED_REVISION,
                f"Unsupported protocol version {revision!r}: the gateway serves {', '.join(wire.REVISIONS)}.",
                {"supported": list(wire.REVISIONS), "requested": revision},
            ))  # fmt: skip
            return
        key = _key(ident)
        method = message["method"]
        handler: threading.Thread | None = None
        with self._lock:
            if self._closing:
                return
            busy = key in self._calls or key in self._relayed or key in self._orphans or key in self._pending
            if not busy and method == "tools/call":
                call = _Call(key, message, revision)
                self._calls[key] = call
                handler = threading.Thread(target=self._handle_call, args=(call,), name="ctrlrun-call", daemon=True)
                self._handlers.add(handler)
            elif not busy:
                self._relayed[key] = method
        if busy:
            self._write_out(wire.error(
                ident, wire.INVALID_REQUEST, f"Invalid Request: the id {ident!r} is already in flight",
            ))  # fmt: skip
            return
        if handler is not None:
            handler.start()
            return
        if not self._relay_to_child(message):
            with self._lock:
                self._relayed.pop(key, None)
            self._write_out(wire.error(
                ident, wire.INTERNAL_ERROR,
                "Internal error: the upstream server's input is closed; the request was not forwarded.",
            ))  # fmt: skip

    def _client_notification(self, message: dict[str, Any]) -> None:
        if message["method"] == _CANCELLED:
            params = message.get("params")
            target = params.get("requestId") if isinstance(params, dict) else None
            if isinstance(target, (str, int)) and not isinstance(target, bool) and self._cancel(_key(target), message):
                return
        if not self._relay_to_child(message):
            self._log(f"dropped the client's {message['method']!r} notification: the upstream's input is closed")

    def _cancel(self, key: tuple[str, Any], message: dict[str, Any]) -> bool:
        """Cancel an intercepted call; True when the notification was dealt with here."""
        with self._child_write:
            with self._lock:
                call = self._calls.get(key)
                waiter = self._pending.pop(key, None)
                if call is None and waiter is None:
                    return False
                if call is not None:
                    call.cancelled = True
                if waiter is not None:
                    if waiter.result is None:
                        waiter.result = Cancelled()
                    self._orphans.add(key)
                    self._changed.notify_all()
            if waiter is not None:  # the child saw the request: tell it too
                self._write_child(message)
        return True

    def _read_client(self) -> None:
        try:
            for line in _lines(self._stdin):
                with self._lock:
                    if self._closing:
                        return
                try:
                    self._client_line(line)
                except Exception as exc:  # one bad message must not end the session
                    self._log(f"failed on a client message ({type(exc).__name__}: {exc}): {_excerpt(line)}")
        except (OSError, ValueError) as exc:
            self._log(f"reading stdin failed ({type(exc).__name__}); treating it as closed")
        with self._changed:
            if self._first is None:
                self._first = "host"
            self._changed.notify_all()

    # -- child -> gateway ----------------------------------------------------------------

    def _child_line(self, line: bytes) -> None:
        if not line.strip():
            return
        try:
            message = wire.parse_message(line)
        except wire.WireError as exc:
            self._log(
                f"dropped a line from the upstream that is not a strict JSON-RPC message ({exc.message}): "
                f"{_excerpt(line)}"
            )
            return
        shape = wire.kind(message)
        if shape == "request":
            self._write_out(message)
        elif shape == "notification":
            try:
                self._catalog.relay_notification(message)
            except Exception as exc:
                self._log(f"the catalog failed on the upstream's {message['method']!r}: {type(exc).__name__}: {exc}")
            self._write_out(message)
        else:
            self._child_response(message)

    def _child_response(self, message: dict[str, Any]) -> None:
        ident = message.get("id")
        key = _key(ident)
        with self._lock:
            waiter = self._pending.pop(key, None)
            if waiter is not None:
                waiter.result = Answered(message)
                self._changed.notify_all()
                return
            method = self._relayed.pop(key, None)
            if method is None:
                if key in self._orphans:
                    self._orphans.discard(key)
                    note = "a late answer to a cancelled or timed-out call"
                else:
                    note = "an answer to no request in flight"
                self._log(f"dropped the upstream's response {ident!r}: {note}")
                return
            if method == "initialize" and "result" in message:
                result = message["result"]
                version = result.get("protocolVersion") if isinstance(result, dict) else None
                self._settled = version if isinstance(version, str) else ""
        try:
            relayed = self._catalog.relay_result(method, message)
        except Exception as exc:
            self._log(f"the catalog failed on the upstream's {method!r} answer: {type(exc).__name__}: {exc}")
            relayed = wire.error(
                ident, wire.INTERNAL_ERROR, f"Internal error: the gateway could not relay the upstream's {method} answer"
            )  # fmt: skip
        self._write_out(relayed)

    def _read_child(self, stream: IO[bytes]) -> None:
        try:
            for line in _lines(stream):
                try:
                    self._child_line(line)
                except Exception as exc:  # one bad message must not end the session
                    self._log(f"failed on an upstream message ({type(exc).__name__}: {exc}): {_excerpt(line)}")
        except (OSError, ValueError) as exc:
            self._log(f"reading the upstream's output failed ({type(exc).__name__})")
        self._end_stream("the upstream closed its output")

    def _end_stream(self, why: str) -> None:
        """The child can answer nothing more: every waiting call ends ``Broken``."""
        with self._changed:
            if self._ended:
                return
            self._ended = True
            code = self._proc.poll() if self._proc is not None else None
            detail = f"{why} (exit code {code}) before answering" if code is not None else f"{why} before answering"
            for waiter in self._pending.values():
                if waiter.result is None:
                    waiter.result = Broken(Transport.STREAM_ENDED_EARLY, detail)
            self._pending.clear()
            if self._first is None:
                self._first = "child"
            self._changed.notify_all()

    def _pump_stderr(self, stream: IO[bytes]) -> None:
        try:
            for raw in _lines(stream):
                text = safe(raw.decode("utf-8", errors="replace").rstrip("\r\n"))
                with self._err_lock:
                    self._stderr.write(text + "\n")
                    self._stderr.flush()
        except (OSError, ValueError):
            pass

    # -- the session ---------------------------------------------------------------------

    def _stop_child(self, proc: subprocess.Popen[bytes]) -> None:
        """Close the child's stdin, then SIGTERM and SIGKILL, ``grace`` seconds apart."""
        with self._child_write:
            with self._lock:
                self._child_stdin_closed = True
            try:
                if proc.stdin is not None:
                    proc.stdin.close()
            except OSError:
                pass
        for signal_name, stop in (("SIGTERM", proc.terminate), ("SIGKILL", proc.kill)):
            try:
                proc.wait(timeout=self._grace)
                return
            except subprocess.TimeoutExpired:
                self._log(f"the upstream is still running {self._grace:g} s later; sending {signal_name}")
                stop()
        proc.wait()

    def run(self) -> int:
        argv = list(self._config.command)
        try:
            proc = self._spawn(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env=child_environment(),
            )  # fmt: skip
        except OSError as exc:
            raise InvalidArgument(
                f"cannot start the upstream command {argv[0]!r} ({type(exc).__name__}: {exc}); "
                "check the command after `--`"
            ) from exc
        self._proc = proc
        assert proc.stdout is not None and proc.stderr is not None
        reader = threading.Thread(target=self._read_child, args=(proc.stdout,), name="ctrlrun-out", daemon=True)
        pump = threading.Thread(target=self._pump_stderr, args=(proc.stderr,), name="ctrlrun-err", daemon=True)
        client = threading.Thread(target=self._read_client, name="ctrlrun-client-in", daemon=True)
        for thread in (reader, pump, client):
            thread.start()
        with self._changed:
            while self._first is None:
                self._changed.wait()
            first = self._first
            self._closing = first == "child"
        if first == "host":
            self._stop_child(proc)
            reader.join(self._grace)
            self._end_stream("the upstream was stopped")
        else:
            self._log("the upstream closed its output; ending the session")
        abort = getattr(self._interceptor, "abort_holds", None)
        if callable(abort):  # calls waiting for input can never be continued now
            abort()
        with self._changed:
            self._closing = True
            while self._handlers:
                self._changed.wait()
        if first == "child":
            self._stop_child(proc)
        pump.join(self._grace)
        with self._out_lock:
            self._closed = True
        return 0 if first == "host" else 1


def serve_stdio(
    config: GatewayConfig,
    interceptor: Interceptor,
    catalog: Catalog,
    stdin: BinaryIO,
    stdout: BinaryIO,
    *,
    stderr: TextIO | None = None,
    grace: float = 5.0,
    spawn: Spawn | None = None,
) -> int:
    """Serve the host on ``stdin``/``stdout`` in front of the child ``config.command``.

    Returns when the session ends: 0 when the host closed stdin (the child's stdin is closed,
    then SIGTERM and SIGKILL follow ``grace`` seconds apart), 1 when the child ended first. Every
    in-flight call has written its answer before this returns. ``spawn`` replaces
    ``subprocess.Popen`` (same arguments), for tests.
    """
    relay = _Relay(
        config, interceptor, catalog, stdin, stdout, stderr if stderr is not None else sys.stderr,
        grace, spawn if spawn is not None else subprocess.Popen,
    )  # fmt: skip
    return relay.run()
