"""How the Postgres store reads a driver error: what it means for the write, and what to do."""

from __future__ import annotations

from typing import Any

from ..errors import CTRLRunError, InvalidArgument, StoreError, StoreUnavailable
from .prepared import MISSING_PREPARED

__all__ = ["NOTHING_COMMITTED", "driver_error", "message_of", "sqlstate"]

# serialization failure, deadlock: rolled back; the session ended idle in its transaction
NOTHING_COMMITTED = {"40001", "40P01", "25P03"}


def sqlstate(exc: BaseException) -> str | None:
    original = getattr(exc, "orig", None) or exc
    return getattr(original, "sqlstate", None)


def message_of(exc: BaseException) -> str:
    """The driver's message on one line: libpq's own lines (a hint, a caret under a query) are
    joined with "; " rather than shown as escaped newlines and tabs."""
    original = getattr(exc, "orig", None) or exc
    lines = [" ".join(line.split()) for line in str(original).splitlines()]
    text = ""
    for line in (line for line in lines if line and line != "^"):
        # sentences, not "; ": the messages built on this one cut at their first "; "
        text += line if not text else (" " if text[-1] in ".:;?!" else ". ") + line
    return text or type(original).__name__


_SETTINGS = {"lock": "lock_timeout", "statement": "statement_timeout",
             "idle_in_transaction": "idle_in_transaction_session_timeout"}


def _in_force(store: Any, name: str) -> str:
    """A server timeout as the store's sessions have it (read from the server when the store
    opened: the URL, ``PGOPTIONS`` or the role may have set another than ``PostgresTimeouts``)."""
    value = getattr(store, "in_force", {}).get(_SETTINGS[name])
    seconds = _seconds(value) if value else None
    if seconds is None:
        return str(store.timeouts.describe(name)) if not value else str(value)
    return "off" if seconds == 0 else f"{seconds:g} s"


_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def _seconds(value: str) -> float | None:
    """``SHOW``'s form of a duration (``200ms``, ``15s``, ``1min``, ``0``) in seconds."""
    number = value.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = value[len(number):] or "ms"  # a bare number is milliseconds
    try:
        return float(number) * _UNITS[unit]
    except (ValueError, KeyError):
        return None


def driver_error(exc: BaseException, doing: str, store: Any, *, transient: bool) -> CTRLRunError:
    """The ``CTRLRunError`` a driver error raised while ``doing`` becomes, naming the server and
    the fix; ``transient``: the store takes it for a passing failure."""
    state = sqlstate(exc) or ""
    message = message_of(exc)
    where = f"the Postgres store ({store.target})"
    if "NUL" in message and "0x00" in message:
        return InvalidArgument(f"{where} cannot keep a NUL character: {message}")
    if isinstance(exc, UnicodeError) or state in ("22021", "22P05"):
        return InvalidArgument(f"a value cannot be stored as UTF-8 text in {where}: {message}")
    if state.startswith("23"):
        return InvalidArgument(f"{where} refused a row: {message}")
    if state == "42501":
        return InvalidArgument(
            f"{where}: permission denied while {doing} ({message}); the role needs "
            f"GRANT USAGE, CREATE ON SCHEMA {store.schema} and rights on its tables"
        )
    t = store.timeouts
    if state == MISSING_PREPARED:
        return StoreUnavailable(
            f"{where} no longer holds this connection's prepared statements ({message}) while "
            f"{doing}; nothing was written: retry. prepared=True needs a direct connection or "
            "a session-mode pooler: behind a transaction-mode pooler use ctrlrun_prepared=off"
        )
    if state == "55P03":
        return StoreUnavailable(
            f"{where} gave up waiting for a lock while {doing} ({message}): another session "
            f"held it past lock_timeout ({_in_force(store, 'lock')}); nothing was written: retry "
            "(a lock held for long: find its session in pg_stat_activity)"
        )
    if state == "57014":
        return StoreUnavailable(
            f"{where} cancelled a statement while {doing} ({message}): it ran past "
            f"statement_timeout ({_in_force(store, 'statement')}) or was cancelled; nothing was "
            "written: retry (a long read: raise PostgresTimeouts.statement, or "
            "options=-c statement_timeout=... in the URL)"
        )
    if state == "25P03":
        return StoreUnavailable(
            f"{where} ended the session while {doing} ({message}): a transaction sat idle "
            f"past idle_in_transaction_session_timeout ({_in_force(store, 'idle_in_transaction')});"
            " nothing of it was written: retry"
        )
    if state in NOTHING_COMMITTED:
        return StoreUnavailable(
            f"{where} rolled the write back ({message}) while {doing}; nothing was "
            "written: retry"
        )
    original = getattr(exc, "orig", None) or exc
    psycopg = store._psycopg
    lost = isinstance(original, (psycopg.OperationalError, psycopg.InterfaceError))
    if state.startswith(("08", "57P")) or (lost and not state):
        hint = ""
        if isinstance(original, getattr(psycopg.errors, "ConnectionTimeout", ())):
            hint = f" (connect_timeout {t.describe('connect')}): is the server up, reachable?"
        return StoreUnavailable(f"cannot reach {where} while {doing}: {message}{hint}")
    if transient:
        return StoreUnavailable(f"{where} could not take this while {doing}: {message}")
    return StoreError(f"{where} failed while {doing}: {message}")
