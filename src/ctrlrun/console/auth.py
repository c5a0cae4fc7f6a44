"""Who is using the console: the users file (scrypt hashes), login lockout, the proxy's header,
and the session secret shared by consoles that share a users file."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import secrets
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path

import yaml

from ..errors import CTRLRunError
from ..settings import console_secret

__all__ = [
    "LOCK_AFTER", "LOCK_FOR", "LoginLimiter", "UsersFileError", "add_user", "hash_password",
    "check_login", "load_users", "proxy_identity", "session_secret", "valid_name", "verify_password",
]  # fmt: skip

LOCK_AFTER = 5
LOCK_FOR = timedelta(minutes=15)
SECRET_VARIABLE = "CTRLRUN_CONSOLE_SECRET"

_N, _R, _P, _LEN = 2**14, 8, 1, 32
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
_DUMMY = "scrypt$16384$8$1$AAAAAAAAAAAAAAAAAAAAAA==$AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="


class UsersFileError(CTRLRunError):
    """The users file is missing or unreadable."""


def valid_name(name: str) -> bool:
    """A user name is 1–64 letters, digits and ``._@-``, starting with a letter or digit."""
    return _NAME.fullmatch(name) is not None


def hash_password(password: str) -> str:
    """``scrypt$N$r$p$<salt>$<hash>`` (base64), the form the users file keeps."""
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode("utf-8"), salt=salt, n=_N, r=_R, p=_P, dklen=_LEN)
    return "$".join(["scrypt", str(_N), str(_R), str(_P),
                     base64.b64encode(salt).decode(), base64.b64encode(digest).decode()])  # fmt: skip


def verify_password(password: str, stored: str) -> bool:
    """Whether ``password`` matches a stored ``scrypt$…`` hash (a malformed one matches nothing)."""
    try:
        kind, n, r, p, salt, digest = stored.split("$")
        if kind != "scrypt":
            return False
        expected = base64.b64decode(digest, validate=True)
        actual = hashlib.scrypt(password.encode("utf-8"), salt=base64.b64decode(salt, validate=True),
                                n=int(n), r=int(r), p=int(p), dklen=len(expected), maxmem=2**26)  # fmt: skip
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(actual, expected)


def load_users(path: Path) -> dict[str, str]:
    """``{name: scrypt hash}`` from a users file ``{users: {NAME: {password: "scrypt$…"}}}``."""
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsersFileError(
            f"no users file at '{path}'; create it with `ctrlrun serve adduser NAME --users {path}`"
        ) from None
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as exc:
        raise UsersFileError(f"cannot read the users file '{path}' ({exc}); fix or recreate it "
                             "with `ctrlrun serve adduser`") from None  # fmt: skip
    if document is None:
        return {}
    users = document.get("users") if isinstance(document, Mapping) else None
    if not isinstance(users, Mapping):
        raise UsersFileError(f"the users file '{path}' has no `users:` mapping; recreate it with "
                             "`ctrlrun serve adduser`")  # fmt: skip
    found: dict[str, str] = {}
    for name, entry in users.items():
        password = entry.get("password") if isinstance(entry, Mapping) else None
        if not isinstance(name, str) or not isinstance(password, str):
            raise UsersFileError(f"the users file '{path}' has a malformed entry {name!r}; "
                                 "recreate it with `ctrlrun serve adduser`")  # fmt: skip
        found[name] = password
    return found


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, readable by its owner only (mode 0600)."""
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def add_user(path: Path, name: str, password: str) -> None:
    """Add (or replace) ``name`` in the users file, creating it with mode 0600."""
    users = load_users(path) if path.exists() else {}
    users[name] = hash_password(password)
    document = {"users": {user: {"password": users[user]} for user in sorted(users)}}
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_private(path, yaml.safe_dump(document, sort_keys=False))


def session_secret(users_path: Path | None, environ: Mapping[str, str] | None = None) -> bytes:
    """The session-signing key: ``$CTRLRUN_CONSOLE_SECRET``, else a random file beside the users
    file (created once, atomically, 0600, so consoles sharing the users file share it), else a
    random key for this process only."""
    value = console_secret(environ)
    if value is not None:
        return value.encode("utf-8")
    if users_path is None:
        return secrets.token_bytes(32)
    path = users_path.with_name(users_path.name + ".secret")
    if not path.exists():
        fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, secrets.token_hex(32).encode("ascii"))
            os.fsync(fd)
            os.close(fd)
            try:
                os.link(temp, path)  # never replaces a secret another console made first
            except FileExistsError:
                pass
        finally:
            Path(temp).unlink(missing_ok=True)
    secret = path.read_bytes().strip()
    if not secret:
        raise CTRLRunError(f"the session secret file '{path}' is empty; delete it and restart")
    return secret


class LoginLimiter:
    """Five failures for one name within 15 minutes lock that name for 15 minutes (in memory)."""

    def __init__(self, clock: Callable[[], datetime]) -> None:
        self._clock = clock
        self._failures: dict[str, list[datetime]] = {}
        self._until: dict[str, datetime] = {}
        self._lock = threading.Lock()

    def locked(self, name: str) -> bool:
        """Whether ``name`` may not log in now, whatever password it gives."""
        with self._lock:
            until = self._until.get(name)
            if until is not None and self._clock() >= until:
                del self._until[name]
                until = None
            return until is not None

    def failed(self, name: str) -> None:
        """Count a failed login; the fifth within the window locks the name."""
        with self._lock:
            now = self._clock()
            recent = [t for t in self._failures.get(name, ()) if now - t < LOCK_FOR] + [now]
            if len(recent) >= LOCK_AFTER:
                self._until[name] = now + LOCK_FOR
                recent = []
            self._failures[name] = recent

    def succeeded(self, name: str) -> None:
        with self._lock:
            self._failures.pop(name, None)


def check_login(users: Mapping[str, str], name: str, password: str) -> bool:
    """Whether ``name``/``password`` is a user of the file (the same work for an unknown name)."""
    stored = users.get(name)
    matched = verify_password(password, stored if stored is not None else _DUMMY)
    return matched and stored is not None


def proxy_identity(peer: str | None, trusted: frozenset[str], values: Sequence[str]) -> str | None:
    """The proxy user, from exactly one non-blank header sent by a trusted peer; else None."""
    if peer is None or peer not in trusted or len(values) != 1:
        return None
    value = values[0].strip()
    return value or None


