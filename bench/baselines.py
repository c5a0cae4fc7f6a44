"""The raw cost of the minimum durable work of an allowed call: two commits.

An allowed call with an effect key must make two things durable, in order: "this key is now
executing" (before the function runs) and "it committed" (after). The least any store can do is
two transactions, each a small write. These classes do exactly that with the bare driver, on the
same kind of database the store uses:

- SQLite: a file in the same temporary directory, WAL, the same ``synchronous`` setting and
  busy timeout, ``BEGIN IMMEDIATE`` … ``COMMIT`` around one INSERT, then around one UPDATE;
- Postgres: the same server, autocommit connection without server-side prepared statements (as
  the store connects), ``BEGIN`` … ``COMMIT`` around one INSERT, then around one UPDATE.
"""

from __future__ import annotations

import sqlite3
from typing import Any

_TABLE = (
    "CREATE TABLE effects_raw (effect_key TEXT PRIMARY KEY, state TEXT NOT NULL, "
    "updated_at TEXT NOT NULL)"
)


class RawSQLite:
    def __init__(self, path: str, synchronous: str) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None, timeout=5.0)
        self.conn.execute("PRAGMA busy_timeout=5000")
        mode = self.conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise RuntimeError(f"{path}: could not switch to WAL (got {mode!r})")
        self.conn.execute(f"PRAGMA synchronous={synchronous}")
        self.synchronous = self.conn.execute("PRAGMA synchronous").fetchone()[0]
        self.conn.execute(_TABLE)

    def two_commits(self, i: int) -> None:
        key = f"refund:p{i}"
        execute = self.conn.execute
        execute("BEGIN IMMEDIATE")
        execute(
            "INSERT INTO effects_raw (effect_key, state, updated_at) VALUES (?, 'executing', ?)",
            (key, "2026-11-30T09:00:00.000Z"),
        )
        execute("COMMIT")
        execute("BEGIN IMMEDIATE")
        execute(
            "UPDATE effects_raw SET state = 'committed', updated_at = ? WHERE effect_key = ?",
            ("2026-11-30T09:00:00.001Z", key),
        )
        execute("COMMIT")

    def close(self) -> None:
        self.conn.close()


class RawPostgres:
    def __init__(self, conn: Any, schema: str) -> None:
        self.conn = conn
        self.table = f'"{schema}".effects_raw'
        conn.execute(_TABLE.replace("effects_raw", self.table))

    def two_commits(self, i: int) -> None:
        key = f"refund:p{i}"
        conn = self.conn
        with conn.transaction():
            conn.execute(
                f"INSERT INTO {self.table} (effect_key, state, updated_at) "
                "VALUES (%s, 'executing', %s)",
                (key, "2026-11-30T09:00:00.000Z"),
            )
        with conn.transaction():
            conn.execute(
                f"UPDATE {self.table} SET state = 'committed', updated_at = %s "
                "WHERE effect_key = %s",
                ("2026-11-30T09:00:00.001Z", key),
            )

    def close(self) -> None:
        self.conn.close()
