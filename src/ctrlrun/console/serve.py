"""Starting the console: bind the socket, say where it listens, run uvicorn, start the notifier."""

from __future__ import annotations

import ipaddress
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING

from ..operator.stores import Settings, open_store
from ..errors import CTRLRunError
from .settings import ConsoleSettings, NotifySettings

if TYPE_CHECKING:
    import uvicorn
    from starlette.applications import Starlette

__all__ = ["is_loopback", "parse_listen", "run", "start_notifier"]


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) → ``(host, port)``."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise CTRLRunError(f"--listen {text!r}: write HOST:PORT, e.g. 127.0.0.1:8765")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (or ``localhost``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def start_notifier(store_url: str, settings: NotifySettings) -> Callable[[], None]:
    """Start webhook delivery and escalation in the background; returns the function that stops it.
    Implemented by ``ctrlrun.console.notify``; imported only when a webhook flag is given."""
    try:
        from . import notify
    except ImportError:
        raise CTRLRunError(
            "webhooks and escalation are not available in this ctrlrun (ctrlrun.console.notify is "
            "missing); start without --webhook/--escalate-webhook or install a ctrlrun that has them"
        ) from None
    stop: Callable[[], None] = notify.start_notifier(store_url, settings)
    return stop


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise CTRLRunError(f"cannot listen on {host}:{port} ({exc.strerror}); pick another --listen") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class _Interrupted:
    """Whether SIGINT came: a plain attribute the handler sets (it takes no lock it could wait on)."""

    came = False


@contextmanager
def _sigint_stops(server: uvicorn.Server) -> Iterator[_Interrupted]:
    """While serving, SIGINT (Ctrl-C) asks ``server`` to shut down, as uvicorn's own handler does
    once it runs, instead of raising ``KeyboardInterrupt`` wherever the main thread is (before
    uvicorn took over, or when uvicorn raises the signal again after its shutdown). Off the main
    thread no handler can be set, and nothing changes."""
    interrupted = _Interrupted()
    if threading.current_thread() is not threading.main_thread():
        yield interrupted
        return

    def stop(signum: int, frame: FrameType | None) -> None:
        interrupted.came = True
        server.should_exit = True

    previous = signal.signal(signal.SIGINT, stop)
    try:
        yield interrupted
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)


def run(store_url: str, settings: ConsoleSettings, host: str, port: int,
        notify: NotifySettings | None, operator_settings: Settings) -> bool:  # fmt: skip
    """Serve the console on ``host:port`` over the store at ``store_url`` until stopped; True
    when SIGINT stopped it (uvicorn answers the requests in flight first)."""
    import uvicorn

    from .app import build_app

    with open_store(operator_settings, store_url) as store:
        sock = _bind(host, port)
        bound = _url(host, sock.getsockname()[1])
        stop: Callable[[], None] | None = None
        try:
            if notify is not None:
                from dataclasses import replace

                stop = start_notifier(store_url, replace(notify, base_url=notify.base_url or bound))
            app: Starlette = build_app(store, settings)
            config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                                    proxy_headers=False, server_header=False)  # fmt: skip
            server = uvicorn.Server(config)
            with _sigint_stops(server) as interrupted:
                print(f"listening on {bound}", file=sys.stderr, flush=True)
                server.run(sockets=[sock])
            return interrupted.came
        finally:
            if stop is not None:
                stop()
            sock.close()
