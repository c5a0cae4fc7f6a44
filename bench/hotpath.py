"""Where the time goes on the allow path: the SQL it sends, that SQL alone, and a profile.

Three measurements on fresh SQLite stores, and the second one on Postgres too:

1. **The SQL per call.** An engine event listener records every statement (and its parameters)
   the store sends for N allowed calls, and every COMMIT.
2. **That SQL alone** (durability FULL and NORMAL). The recorded statements are replayed, call by
   call, with the bare ``sqlite3`` driver on a copy of the database taken just before they were
   recorded — same statements, same parameters, same order, same pragmas — interleaved with new
   protected calls on the store. The replay is the floor for the SQL the store issues today; the
   rest of a protected call is Python (ctrlrun and SQLAlchemy).
   On Postgres the messages the store sends (several statements each: ``BEGIN`` and ``COMMIT``
   travel with statements) are recorded from its transactions and replayed with a bare psycopg
   client-side-binding cursor on a second schema brought to the same chain position.
3. **cProfile** of the allow path (FULL, the default). Every function's own time (``tottime``) is
   summed into categories that partition the run, and the pipeline's steps and the store's SQL
   call sites are listed with their cumulative time. cProfile slows Python code several times
   more than C calls (execute, COMMIT), so Python-heavy shares are overstated; quote the
   unprofiled figures of the table.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import shutil
import sqlite3
from collections import Counter
from typing import Any

from .common import (
    AGENT,
    ALLOWED_AMOUNT,
    Results,
    Row,
    Settings,
    fresh_dir,
    interleave,
    perf_ns,
)
from .pg import Postgres
from .stores import open_store, protected_refund

TOP = 10

# (file suffix, function name, label): the pipeline's steps and the store's SQL call sites
STEPS = (
    ("ctrlrun/protect.py", "prepare", "normalize: bind, build the Action, render the key"),
    ("ctrlrun/policy/engine.py", "evaluate", "decide: Policy.evaluate"),
    ("ctrlrun/store/ops.py", "start_attempt", "reserve: the start transaction"),
    ("ctrlrun/store/ops.py", "finish_attempt", "record: the finish transaction"),
    ("ctrlrun/_attempt.py", "new_event", "build the events (Attempt.new_event)"),
    ("ctrlrun/_attempt.py", "receipt", "build the receipt (Attempt.receipt)"),
    ("ctrlrun/receipt.py", "_placed", "hash the receipt into the chain (Receipt._placed)"),
    ("ctrlrun/store/sql.py", "_begin_write", "SQL  BEGIN IMMEDIATE, on the driver"),
    ("ctrlrun/store/sqltx.py", "reserve_new", "SQL  INSERT effect, then the start's events"),
    ("ctrlrun/store/sqltx.py", "finish_and_advance", "SQL  UPDATE outcome, INSERT events, move head"),
    ("ctrlrun/store/sqltx.py", "finish_effect", "SQL  UPDATE effect outcome (compare-and-set)"),
    ("ctrlrun/store/sqltx.py", "_insert_events", "SQL  INSERT events (one multi-row statement)"),
    ("ctrlrun/store/sqltx.py", "place_receipt", "SQL  INSERT receipt and set the head hash"),
    ("ctrlrun/store/sql.py", "run", "SQL  every statement, sent to the driver"),
    ("ctrlrun/store/sql.py", "commit", "SQL  COMMIT (WAL append + fsync)"),
)


def _category(key: tuple[str, int, str]) -> str:
    filename, _, name = key
    if "sqlite3.Connection' objects" in name and "commit" in name:
        return "sqlite3 COMMIT (WAL append + fsync)"
    if "sqlite3." in name:
        return "sqlite3 execute/fetch (SQL run by SQLite)"
    if "/sqlalchemy/" in filename:
        return "SQLAlchemy (build, cache key, compile, execute, rows)"
    if "/ctrlrun/" in filename:
        return "ctrlrun (own code)"
    if "/json/" in filename or "_json" in name:
        return "json (canonical forms, rows)"
    if "sha256" in name or "hexdigest" in name or "hashlib" in filename:
        return "hashlib (SHA-256)"
    if "/enum" in filename or "/datetime" in filename or "/dataclasses" in filename:
        return "stdlib enum/datetime/dataclasses"
    return "other (stdlib, builtins)"


def _where(key: tuple[str, int, str]) -> str:
    filename, line, name = key
    if filename == "~":
        return name
    for marker in ("/site-packages/", "/src/", "/lib/python3"):
        if marker in filename:
            filename = filename.split(marker, 1)[1]
            break
    return f"{filename}:{line}({name})"


# --------------------------------------------------------------------------- SQL capture


class Recorder:
    """Records the statements and commits the store's engine sends, grouped per call."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.calls: list[list[tuple[str, Any]]] = []

    def __enter__(self) -> Recorder:
        from sqlalchemy import event

        event.listen(self.engine, "before_cursor_execute", self._statement)
        event.listen(self.engine, "commit", self._commit)
        event.listen(self.engine, "rollback", self._rollback)
        return self

    def __exit__(self, *exc: object) -> None:
        from sqlalchemy import event

        event.remove(self.engine, "before_cursor_execute", self._statement)
        event.remove(self.engine, "commit", self._commit)
        event.remove(self.engine, "rollback", self._rollback)

    def next_call(self) -> None:
        self.calls.append([])

    def _statement(self, conn: Any, cursor: Any, statement: str, parameters: Any, *rest: Any) -> None:
        self.calls[-1].append((statement, tuple(parameters) if parameters is not None else ()))

    def _commit(self, conn: Any) -> None:
        self.calls[-1].append(("COMMIT", ()))

    def _rollback(self, conn: Any) -> None:
        if conn.in_transaction():
            self.calls[-1].append(("ROLLBACK", ()))

    def verbs(self) -> dict[str, float]:
        counted: Counter[str] = Counter()
        for call in self.calls:
            for statement, _ in call:
                counted[statement.lstrip().split(None, 1)[0].upper()] += 1
        n = len(self.calls) or 1
        return {verb: c / n for verb, c in sorted(counted.items())}


def _replay_and_compare(kind: str, settings: Settings, pg: Postgres, results: Results, calls: int
                        ) -> dict[str, float]:  # fmt: skip
    """Record ``calls`` protected calls, then time their SQL replayed on a copy of the database
    (bare sqlite3) interleaved with new protected calls. Returns the statements per call."""
    import ctrlrun

    with fresh_dir(settings, f"where-{kind}") as directory:
        opened = open_store(kind, directory, pg, raw=False)
        try:
            store = opened.store
            _, protected = protected_refund(store)
            with ctrlrun.context(agent=AGENT):
                for i in range(settings.warmup):
                    protected(payment_id=f"w{i}", amount=ALLOWED_AMOUNT)
                store.close()  # the last connection out checkpoints the WAL into the file
                copy = os.path.join(directory, "replay.db")
                shutil.copyfile(opened.spec["path"], copy)
                if os.path.exists(opened.spec["path"] + "-wal"):
                    shutil.copyfile(opened.spec["path"] + "-wal", copy + "-wal")
                recorder = Recorder(store.engine)
                with recorder:
                    for i in range(calls):
                        recorder.next_call()
                        protected(payment_id=f"r{i}", amount=ALLOWED_AMOUNT)
                replay = sqlite3.connect(copy, isolation_level=None, timeout=5.0)
                replay.execute("PRAGMA busy_timeout=5000")
                replay.execute("PRAGMA journal_mode=WAL")
                replay.execute(f"PRAGMA synchronous={opened.spec['durability'].upper()}")
                position = {"n": 0}

                def replayed(i: int) -> None:
                    for statement, parameters in recorder.calls[position["n"]]:
                        replay.execute(statement, parameters).fetchall()
                    position["n"] += 1

                def call_protected(i: int) -> None:
                    protected(payment_id=f"p{i}", amount=ALLOWED_AMOUNT)

                series = interleave(
                    [("protected", call_protected), ("same SQL, bare sqlite3", replayed)],
                    calls=calls, rounds=min(settings.rounds, calls), warmup=0,
                )  # fmt: skip
                replay.close()
        finally:
            opened.close()
    verbs = recorder.verbs()
    statements = sum(verbs.values())
    results.rows.append(Row("where", kind, "protected", series["protected"], None,
                            "interleaved with the line below"))  # fmt: skip
    results.rows.append(Row("where", kind, "same SQL, bare sqlite3", series["same SQL, bare sqlite3"],
                            verbs.get("COMMIT"), f"{statements:.0f} statements per call, replayed"))  # fmt: skip
    return verbs


def _replay_postgres(settings: Settings, pg: Postgres, results: Results, calls: int) -> None:
    """Record the messages ``calls`` protected calls send to Postgres, then time them replayed
    with a bare psycopg cursor on a second schema at the same chain position, interleaved with
    new protected calls."""
    import ctrlrun

    recorded = pg.new_schema()
    twin = pg.new_schema()
    store, other = pg.store(recorded), pg.store(twin)
    replay = pg.connect()
    try:
        _, protected = protected_refund(store)
        _, warm_twin = protected_refund(other)
        messages: list[list[tuple[str, Any]]] = []
        real = store._direct_write

        def spying(dbapi: Any) -> Any:
            transaction = real(dbapi)
            cursor = transaction.cursor

            class Spy:
                def __getattr__(self, name: str) -> Any:
                    return getattr(cursor, name)

                def execute(self, query: str, params: Any = None) -> Any:
                    messages[-1].append((query, params))
                    return cursor.execute(query, params)

            transaction.cursor = Spy()
            return transaction

        with ctrlrun.context(agent=AGENT):
            for i in range(settings.warmup):  # both schemas: the same number of receipts
                protected(payment_id=f"w{i}", amount=ALLOWED_AMOUNT)
                warm_twin(payment_id=f"w{i}", amount=ALLOWED_AMOUNT)
            store._direct_write = spying  # type: ignore[method-assign]
            for i in range(calls):
                messages.append([])
                protected(payment_id=f"r{i}", amount=ALLOWED_AMOUNT)
            del store._direct_write
            cursor = pg._psycopg.ClientCursor(replay)
            position = {"n": 0}

            def replayed(i: int) -> None:
                for query, params in messages[position["n"]]:
                    cursor.execute(query.replace(f"{recorded}.", f"{twin}."), params)
                position["n"] += 1

            def call_protected(i: int) -> None:
                protected(payment_id=f"p{i}", amount=ALLOWED_AMOUNT)

            series = interleave(
                [("protected", call_protected), ("same messages, bare psycopg", replayed)],
                calls=calls, rounds=min(settings.rounds, calls), warmup=0,
            )  # fmt: skip
    finally:
        replay.close()
        store.close()
        other.close()
    per_call = sum(len(m) for m in messages) / len(messages)
    results.rows.append(Row("where", "postgres", "protected", series["protected"], None,
                            "interleaved with the line below"))  # fmt: skip
    results.rows.append(Row("where", "postgres", "same messages, bare psycopg",
                            series["same messages, bare psycopg"], 2.0,
                            f"{per_call:.0f} messages per call, replayed"))  # fmt: skip


# --------------------------------------------------------------------------- profile


def run(settings: Settings, pg: Postgres, results: Results) -> None:
    import ctrlrun

    calls = settings.profile_calls
    print(f"- where the time goes: the allow path's SQL replayed bare ({calls} calls, SQLite FULL "
          f"and NORMAL), then {calls} calls under cProfile", flush=True)  # fmt: skip
    verbs = _replay_and_compare("sqlite-full", settings, pg, results, calls)
    _replay_and_compare("sqlite-normal", settings, pg, results, calls)
    if pg.available and "postgres" in settings.stores:
        _replay_postgres(settings, pg, results, calls)

    with fresh_dir(settings, "profile") as directory:
        opened = open_store("sqlite-full", directory, pg, raw=False)
        try:
            store = opened.store
            _, protected = protected_refund(store)
            with ctrlrun.context(agent=AGENT):
                for i in range(settings.warmup):
                    protected(payment_id=f"w{i}", amount=ALLOWED_AMOUNT)
                profiler = cProfile.Profile()
                t0 = perf_ns()
                profiler.enable()
                for i in range(calls):
                    protected(payment_id=f"p{i}", amount=ALLOWED_AMOUNT)
                profiler.disable()
                wall_us = (perf_ns() - t0) / calls / 1000
        finally:
            opened.close()

    raw = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in raw.values())
    categories: Counter[str] = Counter()
    for key, value in raw.items():
        categories[_category(key)] += value[2]

    def per_call(seconds: float) -> float:
        return seconds / calls * 1e6

    top_self = sorted(raw.items(), key=lambda kv: kv[1][2], reverse=True)[:TOP]
    steps = []
    for suffix, name, label in STEPS:
        found = [v for k, v in raw.items() if k[0].endswith(suffix) and k[2] == name]
        if found:
            n = sum(v[1] for v in found)
            cum = sum(v[3] for v in found)
            steps.append({"step": label, "calls_per_call": n / calls,
                          "cum_us_per_call": per_call(cum), "share": cum / total})  # fmt: skip
    results.profile = {
        "calls": calls,
        "profiled_us_per_call": wall_us,
        "total_us_per_call": per_call(total),
        "statements_per_call": verbs,
        "categories": [
            {"category": c, "us_per_call": per_call(s), "share": s / total}
            for c, s in categories.most_common()
        ],
        "steps": steps,
        "top_self": [
            {"function": _where(k), "calls_per_call": v[1] / calls, "self_us_per_call": per_call(v[2]),
             "share": v[2] / total}
            for k, v in top_self
        ],
    }
