"""Postgres: every wait bounded. ``PostgresTimeouts`` and the connection parameters it makes.

The server-side timeouts (``lock_timeout``, ``statement_timeout``,
``idle_in_transaction_session_timeout``) ride in libpq's ``options`` startup parameter, so the
data path never sends a ``SET`` and keeps no session state of its own; the client-side ones are
libpq parameters (``connect_timeout``, TCP keepalives, ``tcp_user_timeout``). Whatever the URL
(or ``PGOPTIONS``, ``PGCONNECT_TIMEOUT``) already says wins over these.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from ..errors import InvalidArgument

__all__ = ["PostgresTimeouts", "connect_parameters", "take_query", "take_url_settings"]

# the server settings, by field
_SERVER = {
    "lock": "lock_timeout",
    "statement": "statement_timeout",
    "idle_in_transaction": "idle_in_transaction_session_timeout",
}
_OPTION_NAME = re.compile(r"(?:-c\s*|--)([A-Za-z0-9_.-]+)\s*=")
_OFF, _ON = ("0", "off", "false", "no"), ("1", "on", "true", "yes")
STARTUP_PARAMETER = "ctrlrun_startup_options"
SKEW_PARAMETER = "ctrlrun_max_clock_skew"
PREPARED_PARAMETER = "ctrlrun_prepared"


@dataclass(frozen=True, slots=True)
class PostgresTimeouts:
    """How long a Postgres store waits, in seconds; ``None`` leaves that one to the server's
    (or libpq's) own default.

    Server side, per session: ``lock`` (``lock_timeout``), ``statement``
    (``statement_timeout``), ``idle_in_transaction``
    (``idle_in_transaction_session_timeout``), sent in the ``options`` startup parameter unless
    ``startup_options`` is False (a pooler that refuses the parameter: set them on the role
    instead). Client side: ``connect`` (``connect_timeout``, whole seconds), TCP keepalives
    (``keepalives_idle``, ``keepalives_interval``, ``keepalives_count``) and
    ``tcp_user_timeout``, so a dead server is noticed in seconds.
    """

    lock: float | None = 5.0
    statement: float | None = 15.0
    idle_in_transaction: float | None = 15.0
    connect: float | None = 10.0
    keepalives_idle: float | None = 5.0
    keepalives_interval: float | None = 2.0
    keepalives_count: int | None = 3
    tcp_user_timeout: float | None = 10.0
    startup_options: bool = True

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if field.name == "startup_options":
                if not isinstance(value, bool):
                    raise InvalidArgument(
                        f"PostgresTimeouts.startup_options must be True or False, got {value!r}"
                    )
            elif value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, float))
                or not math.isfinite(value) or value < 0
            ):  # fmt: skip
                raise InvalidArgument(
                    f"PostgresTimeouts.{field.name} must be None or a number of seconds >= 0, "
                    f"got {value!r}"
                )

    def server_settings(self) -> dict[str, str]:
        """The server-side timeouts as ``-c`` settings (milliseconds), those not ``None``."""
        settings = {}
        for name, setting in _SERVER.items():
            value = getattr(self, name)
            if value is not None:
                settings[setting] = str(round(value * 1000))
        return settings

    def describe(self, name: str) -> str:
        """``lock``'s value as a message names it (``5 s``, ``the server's default``)."""
        value = getattr(self, name)
        return "the server's default" if value is None else f"{value:g} s"


def _option_names(options: str) -> set[str]:
    return {name.replace("-", "_").lower() for name in _OPTION_NAME.findall(options)}


def connect_parameters(
    params: Mapping[str, Any], timeouts: PostgresTimeouts, environ: Mapping[str, str] = os.environ
) -> dict[str, Any]:
    """The keyword parameters ``psycopg.connect`` gets on top of the URL: each timeout the URL
    (``params``, as libpq reads it) and libpq's environment do not set already."""
    extra: dict[str, Any] = {}
    t = timeouts
    if t.connect is not None and "connect_timeout" not in params and not environ.get(
        "PGCONNECT_TIMEOUT"
    ):
        extra["connect_timeout"] = max(1, math.ceil(t.connect))
    client = {
        "keepalives_idle": t.keepalives_idle, "keepalives_interval": t.keepalives_interval,
        "keepalives_count": t.keepalives_count,
    }  # fmt: skip
    if any(value is not None for value in client.values()) and "keepalives" not in params:
        extra["keepalives"] = 1
    for name, value in client.items():
        if value is not None and name not in params:
            extra[name] = max(1, math.ceil(value))
    if t.tcp_user_timeout is not None and "tcp_user_timeout" not in params:
        extra["tcp_user_timeout"] = round(t.tcp_user_timeout * 1000)  # milliseconds
    if t.startup_options:
        given = str(params.get("options") or "") if "options" in params else None
        if given is None:
            given = environ.get("PGOPTIONS", "")
        named = _option_names(given)
        ours = [f"-c {k}={v}" for k, v in t.server_settings().items() if k not in named]
        if ours:
            extra["options"] = " ".join([given.strip(), *ours]).strip()
    return extra


def _flag(value: str, name: str) -> bool:
    if value.strip().lower() in _OFF:
        return False
    if value.strip().lower() in _ON:
        return True
    raise InvalidArgument(f"the store URL's {name} is {value!r}: use on or off")


def take_query(url: str, names: tuple[str, ...]) -> tuple[str, list[tuple[str, str]]]:
    """``(url without them, [(name, value)…])``: the query parameters named ``names`` taken out,
    every other one kept byte for byte (libpq reads ``+`` as itself, not as a space)."""
    parts = urlsplit(url)
    kept, taken = [], []
    for piece in parts.query.split("&") if parts.query else []:
        name, _, value = piece.partition("=")
        if unquote(name) in names:
            taken.append((unquote(name), unquote(value)))
        else:
            kept.append(piece)
    if not taken:
        return url, []
    return urlunsplit(parts._replace(query="&".join(kept))), taken


def take_url_settings(url: str) -> tuple[str, dict[str, Any]]:
    """``(URL without them, settings)``: ctrlrun's own URL parameters, taken out before the URL
    reaches libpq: ``ctrlrun_startup_options=off``, ``ctrlrun_max_clock_skew=<seconds or
    off>`` and ``ctrlrun_prepared=on``."""
    rest, taken = take_query(url, (STARTUP_PARAMETER, SKEW_PARAMETER, PREPARED_PARAMETER))
    settings: dict[str, Any] = {}
    for name, value in taken:
        if name == STARTUP_PARAMETER:
            settings["startup_options"] = _flag(value, name)
        elif name == PREPARED_PARAMETER:
            settings["prepared"] = _flag(value, name)
        elif value.strip().lower() in ("off", "none", "false", "no"):
            settings["max_clock_skew"] = None
        else:
            try:
                settings["max_clock_skew"] = float(value)
            except ValueError:
                raise InvalidArgument(
                    f"the store URL's {name} is {value!r}: give seconds (e.g. 5) or off"
                ) from None
    return rest, settings
