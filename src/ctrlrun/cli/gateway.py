"""``ctrlrun gateway``: put ctrlrun in front of one MCP server (stdio or streamable HTTP)."""

from __future__ import annotations

import ipaddress
import os
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, BinaryIO
from urllib.parse import urlsplit

import click

from ..errors import UsageError
from ..settings import configured_policy, named_variable

__all__ = ["gateway"]

_LOOPBACK_NAMES = ("localhost",)


class GatewayUsage(UsageError):
    """A ``ctrlrun gateway`` flag combination refused at start (exit 1), naming the fix."""


def _listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise click.BadParameter(f"{value!r} is not HOST:PORT (e.g. 127.0.0.1:8900)", param_hint="--listen")
    return host, int(port)


def _loopback(host: str) -> bool:
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@click.command(context_settings={"ignore_unknown_options": False})
@click.option("--alias", required=False, metavar="NAME", help="The upstream's name in action names: mcp.<NAME>.<tool>.")
@click.option("--upstream", "upstream_url", metavar="URL", help="The upstream's streamable-HTTP URL (http mode).")
@click.option("--listen", metavar="HOST:PORT", help="Serve streamable HTTP at http://HOST:PORT/mcp (port 0 picks one).")
@click.option("--principal", metavar="AGENT", help="The principal of every call (required in stdio mode).")
@click.option("--user", metavar="USER", help="The user of every call, with --principal.")
@click.option("--principal-header", metavar="NAME", help="http: take the agent from this request header.")
@click.option("--user-header", metavar="NAME", help="http: take the user from this request header.")
@click.option("--policy", "policy_file", metavar="PATH", type=click.Path(dir_okay=False), help="The policy file (default: $CTRLRUN_CONFIG; required in stdio mode unless it is set).")
@click.option("--store-url", metavar="URL", help="The store (default: $CTRLRUN_STORE_URL, $CTRLRUN_STATE, else .ctrlrun/state.db beside the policy).")
@click.option("--environment", metavar="ENV", help="The environment the actions are for (default: the policy's).")
@click.option("--allow-remote", is_flag=True, help="http: allow a non-loopback --listen address.")
@click.option("--allow-origin", "allow_origins", multiple=True, metavar="ORIGIN", help="http: an Origin header to accept.")
@click.option("--allow-host", "allow_hosts", multiple=True, metavar="HOST", help="http: another Host header to accept.")
@click.option("--upstream-header", "upstream_headers", multiple=True, metavar="NAME=ENVVAR", help="http: send this header upstream, its value read from ENVVAR.")
@click.option("--upstream-ca-file", metavar="PATH", type=click.Path(dir_okay=False), help="http: CA bundle for an https upstream.")
@click.option("--upstream-timeout", type=click.FloatRange(min=0, min_open=True), default=120.0, show_default=True, metavar="S",
              help="How long to wait for the upstream's answer to a tools/call (then: ambiguous).")
@click.option("--input-timeout", type=click.FloatRange(min=0, min_open=True), default=120.0, show_default=True, metavar="S",
              help="How long a call that asked for input waits for its continuation (then: ambiguous).")
@click.option("--max-input-rounds", type=click.IntRange(min=1), default=8, show_default=True, metavar="N",
              help="How many times one call may ask for input.")
@click.option("--max-message-bytes", type=click.IntRange(min=1), default=1024 * 1024, show_default=True, metavar="N",
              help="http: the largest request body accepted (larger: 413).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def gateway(**options: Any) -> None:
    """Run every tools/call of one MCP server through ctrlrun.

    \b
    stdio: ctrlrun gateway --alias pay --principal agent-1 --policy ctrlrun.yaml -- python server.py
    http:  ctrlrun gateway --alias pay --upstream http://127.0.0.1:9000/mcp --listen 127.0.0.1:8900 \\
               --principal-header X-Agent --policy ctrlrun.yaml
    """
    config, policy_file = _config(options)
    from ..gateway import Gateway

    try:
        control = _control(policy_file, options["store_url"], options["environment"])
        served = Gateway(config, control)
        with _Sigint() as sigint:
            if config.mode == "http":
                listening = served.serve_http()
                sys.stderr.write(served.startup_block((listening.host, listening.port)))
                sys.stderr.flush()
                try:
                    sigint.wait()
                finally:
                    listening.close()  # answers in flight end as the gateway's close ends them
                code = 0
            else:
                sys.stderr.write(served.startup_block())
                sys.stderr.flush()
                code = served.serve_stdio(sigint.host_input(sys.stdin.buffer), sys.stdout.buffer, spawn=_spawn)
        interrupted = sigint.came
    except KeyboardInterrupt:  # SIGINT before the handler was set (or off the main thread)
        interrupted = True
    if interrupted:
        sys.stderr.write("ctrlrun gateway: stopped (interrupted)\n")
        sys.stderr.flush()
        code = 130  # 128 + SIGINT, as a shell reports Ctrl-C; never click's "Aborted!"
    raise click.exceptions.Exit(code)


def _spawn(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
    """Start the stdio upstream in its own process group: a Ctrl-C at the terminal reaches the
    gateway alone, which then stops the child as when the host closes stdin (its stdin closed,
    then SIGTERM, then SIGKILL), instead of the child dying mid-call on the same signal."""
    if os.name == "posix":
        kwargs.setdefault("process_group", 0)
    process: subprocess.Popen[bytes] = subprocess.Popen(*args, **kwargs)
    return process


class _Sigint:
    """SIGINT (Ctrl-C) as a request to stop instead of a ``KeyboardInterrupt`` raised wherever
    the main thread is. The pipe is the interpreter's wake-up fd: the signal's number is written
    to it at once, whichever thread the kernel interrupted, and wakes ``wait()`` (http) or ends
    ``host_input()`` (stdio); the handler only notes it. A repeated SIGINT changes nothing: the
    stop it asked for is bounded (the stdio grace periods)."""

    def __init__(self) -> None:
        self.came = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._installed = False
        self._previous: Callable[[int, FrameType | None], Any] | int | None = None
        self._previous_fd = -1
        self._pumping = False

    def __enter__(self) -> _Sigint:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._note)
            self._previous_fd = signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
            self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            signal.set_wakeup_fd(self._previous_fd)
            signal.signal(signal.SIGINT, self._previous if self._previous is not None else signal.default_int_handler)
        os.close(self._wake_w)  # a pump still waiting sees the end and stops
        if not self._pumping:
            os.close(self._wake_r)

    def _note(self, signum: int, frame: FrameType | None) -> None:
        self.came = True

    def _woken(self) -> bool:
        """Read the wake-up pipe: did SIGINT come (or the pipe end)? Other signals do not stop."""
        data = os.read(self._wake_r, 512)
        return not data or signal.SIGINT in data

    def wait(self) -> None:
        """Block until SIGINT (forever off the main thread, where no handler can be set)."""
        while True:
            select.select([self._wake_r], [], [])
            if self._woken():
                return

    def host_input(self, stdin: BinaryIO) -> BinaryIO:
        """``stdin`` copied through a pipe that ends when ``stdin`` does or at SIGINT, so the relay
        stops as when the host closes its stdin: in-flight calls answer, then the child is stopped.
        Without a file descriptor, or without ``select`` on pipes (not POSIX), it is ``stdin`` itself."""
        try:
            source = stdin.fileno()
        except (OSError, ValueError, AttributeError):  # an in-memory stream (a test's): read as it is
            return stdin
        if os.name != "posix":
            return stdin
        read_end, write_end = os.pipe()
        self._pumping = True
        threading.Thread(target=self._pump, args=(source, write_end), name="ctrlrun-host-in", daemon=True).start()
        return os.fdopen(read_end, "rb", buffering=0)

    def _pump(self, source: int, sink: int) -> None:
        try:
            while True:
                ready, _, _ = select.select([source, self._wake_r], [], [])
                if self._wake_r in ready and self._woken():
                    return
                if source not in ready:
                    continue
                chunk = os.read(source, 65536)
                if not chunk:
                    return
                view = memoryview(chunk)
                while view:
                    view = view[os.write(sink, view):]
        except OSError:  # the relay stopped reading: the session is over
            return
        finally:
            os.close(sink)
            os.close(self._wake_r)


def _config(options: dict[str, Any]) -> tuple[Any, Path]:
    from ..gateway.config import GatewayConfig
    from ..gateway.wire import ALIAS

    alias = options["alias"]
    command = tuple(options["command"])
    url, listen = options["upstream_url"], options["listen"]
    if alias is None:
        raise GatewayUsage("--alias is required: name the upstream (e.g. --alias pay makes its tools mcp.pay.<tool>)")
    if ALIAS.fullmatch(alias) is None:
        raise GatewayUsage(f"--alias {alias!r} is not usable: 1-64 of a-z 0-9 _ -, starting with a letter or digit, no dots")
    if (listen is None) != (url is None):
        raise GatewayUsage("--listen and --upstream go together: http mode needs both (stdio mode neither)")
    if bool(command) == bool(url):
        raise GatewayUsage("give exactly one upstream: `-- COMMAND [ARG...]` (stdio) or --upstream URL with --listen HOST:PORT (http)")
    http = listen is not None
    if (options["principal"] is None) == (options["principal_header"] is None):
        raise GatewayUsage("give exactly one principal source: --principal AGENT, or (http only) --principal-header NAME")
    if options["user_header"] is not None and options["principal_header"] is None:
        raise GatewayUsage("--user-header needs --principal-header (the agent's header)")
    if options["user"] is not None and options["principal"] is None:
        raise GatewayUsage("--user needs --principal")
    if not http:
        for flag, given in (("--principal-header", options["principal_header"]), ("--user-header", options["user_header"]),
                            ("--upstream-header", options["upstream_headers"]), ("--allow-origin", options["allow_origins"]),
                            ("--allow-host", options["allow_hosts"]), ("--allow-remote", options["allow_remote"]),
                            ("--upstream-ca-file", options["upstream_ca_file"])):  # fmt: skip
            if given:
                raise GatewayUsage(f"{flag} is for http mode; in stdio mode remove it (the host launches the gateway)")
    bound: tuple[str, int] | None = None
    if http:
        bound = _listen(listen)
        if not _loopback(bound[0]) and not options["allow_remote"]:
            raise GatewayUsage(f"--listen {listen} is not a loopback address; add --allow-remote to serve other hosts")
        scheme = urlsplit(url).scheme.lower()
        if scheme not in ("http", "https") or not urlsplit(url).netloc:
            raise GatewayUsage(f"--upstream {url!r} is not an http(s) URL; give e.g. http://127.0.0.1:9000/mcp")
    headers: list[tuple[str, str]] = []
    for item in options["upstream_headers"]:
        name, sep, variable = item.partition("=")
        if not sep or not name.strip() or not variable.strip():
            raise GatewayUsage(f"--upstream-header {item!r} is not NAME=ENVVAR (the value is read from ENVVAR, never given literally)")
        value = named_variable(variable)
        if value is None:
            raise GatewayUsage(f"--upstream-header {name}={variable}: the environment variable {variable} is not set; export it first")
        headers.append((name.strip(), value))
    policy_option = options["policy_file"]
    if policy_option is None:
        if not http and not configured_policy():
            raise GatewayUsage("stdio mode needs --policy PATH (or CTRLRUN_CONFIG): the host picks the working "
                               "directory, so ./ctrlrun.yaml is never used implicitly")  # fmt: skip
    from ..settings import policy_path

    policy_file = policy_path(policy_option)
    if not policy_file.is_file():
        raise GatewayUsage(f"policy file {policy_file} does not exist; give --policy PATH (ctrlrun init writes a starter)")
    principal = (options["principal"], options["user"]) if options["principal"] is not None else None
    config = GatewayConfig(
        alias=alias, command=command, upstream_url=url, listen=bound, principal=principal,
        principal_header=options["principal_header"], user_header=options["user_header"],
        allow_remote=options["allow_remote"], allow_origins=tuple(options["allow_origins"]),
        allow_hosts=tuple(options["allow_hosts"]), upstream_headers=tuple(headers),
        upstream_ca_file=options["upstream_ca_file"], upstream_timeout=options["upstream_timeout"],
        input_timeout=options["input_timeout"], max_input_rounds=options["max_input_rounds"],
        max_message_bytes=options["max_message_bytes"], policy_path=str(policy_file),
    )  # fmt: skip
    return config, policy_file


def _control(policy_file: Path, store_url: str | None, environment: str | None) -> Any:
    from ..store import open_default_store
    from ..control.front import Control
    from ..policy import Policy
    from ..evidence.receipt import JSONLEventSink
    from ..store import open_store_url

    policy = Policy.from_file(policy_file)
    if store_url is not None:
        store = open_store_url(store_url)
        evidence = Path(store_url[len("sqlite://"):]).parent if store_url.startswith("sqlite://") else None
    else:
        store, evidence = open_default_store(policy_file)
    sinks = (JSONLEventSink(evidence),) if evidence is not None else ()
    return Control(policy, store, sinks=sinks, environment=environment)
