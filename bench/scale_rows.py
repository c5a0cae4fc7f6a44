"""Bulk rows for ``bench_scale.py``: a store of a million valid receipts in about a minute.

One real allowed call (and one call that asks for approval) is made through ``@protect`` into a
throw-away SQLite store, and its rows (effect, events, receipt, approval) become templates:
each generated call replaces the template's ids, key, payment id and second with its own, and
its receipt is placed on the chain (``seq``, ``prev_hash`` and the hash recomputed over the
canonical document), so ``receipts --verify-chain`` accepts the result. Whatever columns the
current schema has are copied, so the generator follows the schema without knowing it.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from bench.ab_call import POLICY, refund  # the A/B call's policy and function

TABLES = ("effects", "events", "receipts", "approvals")
APPROVAL_EVERY = 100  # one call in a hundred also leaves an answered approval request
BASE = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _rows(db: str, table: str) -> list[dict[str, Any]]:
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute(f"SELECT * FROM {table} ORDER BY rowid")]
    finally:
        conn.close()


@dataclass
class Templates:
    """The rows one allowed call wrote, and those of one call that asked for approval."""

    allowed: dict[str, list[dict[str, Any]]]
    approval: dict[str, list[dict[str, Any]]]
    tokens: dict[str, str] = field(default_factory=dict)


def make_templates() -> Templates:
    import ctrlrun

    with tempfile.TemporaryDirectory() as tmp:
        db = os.path.join(tmp, "t.db")
        store = ctrlrun.SQLiteStateStore(db, durability="normal")
        control = ctrlrun.Control(policy=ctrlrun.Policy.from_yaml(POLICY), store=store)
        protected = ctrlrun.protect("bench.refund", control=control)(refund)
        with ctrlrun.context(agent="bench-agent"):
            protected(payment_id="tplA", amount=12_000)
            try:
                protected(payment_id="tplB", amount=200_000)
            except ctrlrun.ApprovalRequired:
                pass
        store.close()
        found = {t: _rows(db, t) for t in TABLES}
    allowed = {t: [r for r in rows if "tplA" in json.dumps(r)] for t, rows in found.items()}
    approval = {t: [r for r in rows if "tplB" in json.dumps(r)] for t, rows in found.items()}
    tokens: dict[str, str] = {}
    for name, group in (("A", allowed), ("B", approval)):
        for row in group["events"] + group["receipts"] + group["effects"] + group["approvals"]:
            for key in ("action_id", "receipt_id", "approval_id"):
                value = row.get(key)
                if isinstance(value, str) and value:
                    tokens[f"{key}{name}"] = value
    return Templates(allowed, approval, tokens)


def _second(text: str) -> str | None:
    """The ``YYYY-MM-DDTHH:MM:SS`` every timestamp of the template call starts with."""
    for row in text.split('"'):
        if len(row) >= 19 and row[4] == "-" and row[10] == "T":
            return row[:19]
    return None


class Generator:
    """Rows for calls ``start .. start+n-1``, chained after ``(seq, hash)``."""

    def __init__(self, templates: Templates) -> None:
        self.t = templates
        first = templates.allowed["receipts"][0]
        self.seconds: set[str] = {s for g in (templates.allowed, templates.approval)
                        for r in g["receipts"] if (s := _second(r["json"]))}
        self.compact = (",", ":")
        self._check_hashing(first)

    @staticmethod
    def _hash(document: dict[str, Any]) -> str:
        from ctrlrun import canonical_bytes

        return "sha256:" + hashlib.sha256(canonical_bytes(document)).hexdigest()

    def _check_hashing(self, row: dict[str, Any]) -> None:
        document = json.loads(row["json"])
        if self._hash(document) != row["hash"]:
            raise SystemExit("bench_scale: the receipt hash could not be reproduced; fix scale_rows")
        if json.dumps(document, separators=self.compact, ensure_ascii=False) != row["json"]:
            raise SystemExit("bench_scale: the stored receipt text could not be reproduced")

    def _subst(self, value: Any, swaps: list[tuple[str, str]]) -> Any:
        if not isinstance(value, str):
            return value
        for old, new in swaps:
            if old in value:
                value = value.replace(old, new)
        return value

    def calls(self, start: int, n: int, seq: int, prev: str) -> Iterator[dict[str, list[tuple[Any, ...]]]]:
        """Batches of rows per table (column order: ``columns(table)``), 5,000 calls each."""
        batch: dict[str, list[tuple[Any, ...]]] = {t: [] for t in TABLES}
        for i in range(start, start + n):
            moment = (BASE + timedelta(seconds=i // 10)).strftime("%Y-%m-%dT%H:%M:%S")
            with_approval = i % APPROVAL_EVERY == 0
            groups = [("A", self.t.allowed, f"p{i}")]
            if with_approval:
                groups.append(("B", self.t.approval, f"q{i}"))
            for name, group, payment in groups:
                tag = f"{i:024x}{name}"
                swaps = [(self.t.tokens[f"action_id{name}"], f"act_{tag}{'0' * 7}")]
                if f"receipt_id{name}" in self.t.tokens:
                    swaps.append((self.t.tokens[f"receipt_id{name}"], f"ctr_{tag}{'0' * 7}"))
                if f"approval_id{name}" in self.t.tokens:
                    swaps.append((self.t.tokens[f"approval_id{name}"], f"apr_{tag}{'0' * 7}"))
                swaps += [(f"tpl{name}", payment)] + [(s, moment) for s in self.seconds]
                for table in ("effects", "events", "approvals"):
                    for row in group[table]:
                        values = {k: self._subst(v, swaps) for k, v in row.items() if k != "event_id"}
                        if table == "approvals":
                            values["status"] = "denied"
                            values["action_hash"] = "sha256:" + hashlib.sha256(payment.encode()).hexdigest()
                        batch[table].append(tuple(values.values()))
                for row in group["receipts"]:
                    seq += 1
                    document = json.loads(self._subst(row["json"], swaps))
                    document["seq"], document["prev_hash"] = seq, prev
                    digest = self._hash(document)
                    values = {k: self._subst(v, swaps) for k, v in row.items()}
                    values.update(json=json.dumps(document, separators=self.compact, ensure_ascii=False),
                                  seq=seq, prev_hash=prev, hash=digest)  # fmt: skip
                    batch["receipts"].append(tuple(values.values()))
                    prev = digest
            if (i - start + 1) % 5_000 == 0:
                yield batch
                batch = {t: [] for t in TABLES}
        self.head = (seq, prev)
        if any(batch.values()):
            yield batch

    def columns(self, table: str) -> list[str]:
        group = self.t.allowed if self.t.allowed[table] else self.t.approval
        return [k for k in group[table][0] if not (table == "events" and k == "event_id")]


def append_sqlite(path: str, gen: Generator, start: int, n: int) -> None:
    """Append ``n`` generated calls to the SQLite store at ``path`` (and move its head)."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA synchronous=OFF")
        seq, prev = conn.execute("SELECT seq, hash FROM receipt_chain WHERE id = 1").fetchone()
        conn.execute("BEGIN")
        for batch in gen.calls(start, n, seq, prev):
            for table, rows in batch.items():
                if rows:
                    cols = gen.columns(table)
                    marks = ",".join("?" * len(cols))
                    conn.executemany(f"INSERT INTO {table} ({','.join(cols)}) VALUES ({marks})", rows)
        conn.execute("UPDATE receipt_chain SET seq = ?, hash = ? WHERE id = 1", gen.head)
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


def append_postgres(conninfo: str, schema: str, gen: Generator, start: int, n: int) -> None:
    """The same through ``COPY`` into the Postgres store in ``schema``."""
    import psycopg

    with psycopg.connect(conninfo) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        row = conn.execute("SELECT seq, hash FROM receipt_chain WHERE id = 1").fetchone()
        assert row is not None
        for batch in gen.calls(start, n, int(row[0]), str(row[1])):
            for table, rows in batch.items():
                if rows:
                    with conn.cursor().copy(f"COPY {table} ({','.join(gen.columns(table))}) FROM STDIN") as copy:
                        for values in rows:
                            copy.write_row(values)
        conn.execute("UPDATE receipt_chain SET seq = %s, hash = %s WHERE id = 1", gen.head)
        conn.commit()
        conn.execute("ANALYZE")
        conn.commit()
