"""Postgres for the benchmarks: the URL, an availability check, and throw-away schemas."""

from __future__ import annotations

import os
import secrets
from typing import Any

URL_VARIABLES = ("CTRLRUN_BENCH_POSTGRES_URL", "CTRLRUN_TEST_POSTGRES_URL")
SCHEMA_PREFIX = "ctrlrun_bench_"


def default_url() -> str | None:
    for name in URL_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value:
            return value
    return None


def redact(url: str) -> str:
    """``user@host:port/db`` without a password, for output."""
    try:
        from psycopg.conninfo import conninfo_to_dict

        p = conninfo_to_dict(url.split("?", 1)[0])
    except Exception:
        return "postgresql://(unparsable URL)"
    user = f"{p['user']}@" if p.get("user") else ""
    port = f":{p['port']}" if p.get("port") else ""
    return f"postgresql://{user}{p.get('host', 'localhost')}{port}/{p.get('dbname', '')}"


class Postgres:
    """One server for the whole run. ``unavailable`` says why it is skipped (or is None)."""

    def __init__(self, url: str | None) -> None:
        self.url = url
        self.unavailable: str | None = None
        self.server_version: str | None = None
        self._schemas: list[str] = []
        if not url:
            self.unavailable = (
                "no Postgres URL (pass --postgres-url or set "
                + " / ".join(URL_VARIABLES) + ")"
            )
            return
        try:
            import ctrlrun.postgres  # noqa: F401
        except Exception as exc:  # the store is still being finished: say so, skip
            self.unavailable = f"ctrlrun.postgres is not importable ({type(exc).__name__}: {exc})"
            return
        from ctrlrun.postgres import split_store_url

        try:
            self._conninfo = split_store_url(url)[0]  # without ?ctrlrun_schema=
        except Exception as exc:
            self.unavailable = f"unusable Postgres URL ({exc})"
            return
        try:
            import psycopg
        except ImportError:
            self.unavailable = (
                "psycopg 3 is not installed (pip install '.[postgres]' from the root of your ctrlrun clone)"
            )
            return
        self._psycopg = psycopg
        try:
            with psycopg.connect(self._conninfo, autocommit=True, connect_timeout=5) as conn:
                row = conn.execute("SHOW server_version").fetchone()
                self.server_version = str(row[0]) if row else None
                settings = dict(
                    conn.execute(
                        "SELECT name, setting FROM pg_settings "
                        "WHERE name IN ('fsync', 'synchronous_commit', 'wal_sync_method')"
                    ).fetchall()
                )
                self.settings = settings
        except Exception as exc:
            self.unavailable = f"cannot reach {redact(url)} ({type(exc).__name__}: {exc})".strip()
            return
        try:  # the store itself must open (and migrate) a fresh schema
            self.store(self.new_schema()).close()
        except Exception as exc:
            self.unavailable = (
                f"PostgresStateStore does not open on {redact(url)} ({type(exc).__name__}: {exc})"
            )
            self.drop_all()

    @property
    def available(self) -> bool:
        return self.unavailable is None

    @property
    def target(self) -> str:
        return redact(self.url or "")

    def connect(self) -> Any:
        return self._psycopg.connect(self._conninfo, autocommit=True, prepare_threshold=None)

    def client_cursor(self, conn: Any) -> Any:
        """A cursor that binds parameters client-side (several statements in one message)."""
        return self._psycopg.ClientCursor(conn)

    def new_schema(self) -> str:
        name = SCHEMA_PREFIX + secrets.token_hex(4)
        with self.connect() as conn:
            conn.execute(f'CREATE SCHEMA "{name}"')
        self._schemas.append(name)
        return name

    def store(self, schema: str, *, prepared: bool = False) -> Any:
        from ctrlrun.postgres import PostgresStateStore

        return PostgresStateStore(self._conninfo, schema=schema, prepared=prepared)

    def drop_all(self) -> None:
        if not self._schemas:
            return
        try:
            with self.connect() as conn:
                for name in self._schemas:
                    conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        except Exception as exc:  # best effort; say what was left behind
            print(f"  note: could not drop Postgres schemas {self._schemas}: {exc}")
        self._schemas.clear()
