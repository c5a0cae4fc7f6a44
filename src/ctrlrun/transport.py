"""HTTP clients that turn a failed ``connect()`` into ``NotExecuted`` only when no request byte
can have left in this executor run; every other failure propagates unchanged (``ambiguous``).

Only requests made through this module are seen, and ``import ctrlrun`` does not import it.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import urllib.error
import urllib.parse
import urllib.request
from enum import StrEnum
from typing import TYPE_CHECKING, Any, cast

from .control import ambient as _ambient
from .control.attempt import message_of
from .effects.records import EffectState
from .errors import NotExecuted

if TYPE_CHECKING:
    from urllib.request import _DataType

__all__ = ["HTTPConnection", "HTTPSConnection", "Transport", "effect_state", "urlopen"]

_SOCKET_DEFAULT: Any = getattr(socket, "_GLOBAL_DEFAULT_TIMEOUT")  # what urllib itself passes
_SCHEMES = ("http", "https")
_PREFIX = "ctrlrun.transport: no request byte was offered before the connection failed: "


class Transport(StrEnum):
    """Where a request stood when its transport failed; only ``NEVER_CONNECTED`` means nothing
    reached the remote."""

    NEVER_CONNECTED = "never_connected"
    AFTER_REQUEST_SENT = "after_request_sent"
    UNREADABLE_RESPONSE = "unreadable_response"
    STREAM_ENDED_EARLY = "stream_ended_early"
    CLIENT_DISCONNECTED = "client_disconnected"


def effect_state(t: object) -> EffectState:
    """``FAILED`` only for the member ``Transport.NEVER_CONNECTED`` itself (an equal string is not
    evidence), else ``AMBIGUOUS``: the one place this rule is decided."""
    return EffectState.FAILED if t is Transport.NEVER_CONNECTED else EffectState.AMBIGUOUS


class HTTPConnection(http.client.HTTPConnection):
    """``http.client.HTTPConnection`` that records every byte it offers and whether it ever held a
    socket it did not open, so a failed ``connect()`` can raise ``NotExecuted`` when nothing went
    out. The wire bytes are those of the standard class."""

    _ctrlrun_offered = False  # a request byte was handed to a socket (never cleared)
    _ctrlrun_foreign = False  # a socket this connection did not open was set (never cleared)
    _ctrlrun_opening = False
    _ctrlrun_sock: Any = None

    @property
    def sock(self) -> Any:
        """The socket, as in ``http.client``; one assigned from outside ``connect()`` is marked."""
        return self._ctrlrun_sock

    @sock.setter
    def sock(self, value: Any) -> None:
        if value is not None and not self._ctrlrun_opening:
            self._ctrlrun_foreign = True
        self._ctrlrun_sock = value

    def connect(self) -> None:
        """Connect as ``http.client`` does; a failure that provably sent nothing in this executor
        run becomes ``NotExecuted`` (chained to the original)."""
        self._ctrlrun_opening = True
        try:
            super().connect()
        except Exception as exc:
            if effect_state(self._ctrlrun_transport()) is EffectState.FAILED:
                raise NotExecuted(f"{_PREFIX}{type(exc).__name__}: {message_of(exc)}") from exc
            raise
        finally:
            self._ctrlrun_opening = False

    def send(self, data: Any) -> None:
        """Send as ``http.client`` does, marking this connection and the executor run right before
        the first byte goes to the socket (a proxy ``CONNECT`` line included)."""
        if self.sock is None and self.auto_open:
            self.connect()  # here rather than in the standard send: the mark must follow it
        if self.sock is not None:
            self._ctrlrun_offered = True
            _ambient.offered_byte()
        super().send(data)

    def _ctrlrun_transport(self) -> Transport | None:
        """``NEVER_CONNECTED`` if neither this connection nor this executor run offered a byte;
        ``None`` outside an open executor run, where nothing is claimed."""
        run = _ambient.current_run()
        if run is None or run.token is None:
            return None
        if self._ctrlrun_offered or self._ctrlrun_foreign or not run.clean():
            return Transport.AFTER_REQUEST_SENT
        return Transport.NEVER_CONNECTED


class HTTPSConnection(HTTPConnection, http.client.HTTPSConnection):
    """``http.client.HTTPSConnection`` with the marks of ``HTTPConnection``; bytes are counted
    above TLS, so a failed handshake sent no request byte."""


class _HTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(HTTPConnection, req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, context: ssl.SSLContext | None) -> None:
        super().__init__(context=context)
        self._ctrlrun_context = context

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(HTTPSConnection, req, context=self._ctrlrun_context)


def _opener(context: ssl.SSLContext | None) -> urllib.request.OpenerDirector:
    """http and https through the environment's proxies, no redirect, auth, file, ftp or data
    handler: a ``30x`` is an ``HTTPError`` like any other non-2xx status."""
    opener = urllib.request.OpenerDirector()
    for handler in (
        urllib.request.ProxyHandler(),  # reads the environment now, on every call
        urllib.request.UnknownHandler(),
        _HTTPHandler(),
        _HTTPSHandler(context),
        urllib.request.HTTPDefaultErrorHandler(),
        urllib.request.HTTPErrorProcessor(),
    ):
        opener.add_handler(handler)
    return opener


def urlopen(
    url: str | urllib.request.Request,
    data: _DataType = None,
    *,
    timeout: float | None = _SOCKET_DEFAULT,
    context: ssl.SSLContext | None = None,
) -> http.client.HTTPResponse:
    """``urllib.request.urlopen`` for ``http``/``https`` only, through this module's connections,
    never following a redirect (a ``POST`` answered ``303`` may already have acted)."""
    scheme = url.type if isinstance(url, urllib.request.Request) else urllib.parse.urlsplit(url)[0]
    if scheme.lower() not in _SCHEMES:
        raise urllib.error.URLError(
            f"ctrlrun.transport.urlopen opens http and https URLs only, got scheme {scheme!r}"
        )
    response = _opener(context).open(url, data, timeout)
    return cast(http.client.HTTPResponse, response)
