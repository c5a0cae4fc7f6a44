"""``where``: the SQL one allowed call sends, and that SQL alone on the bare driver.

Public API only: the SQL stores call their ``trace`` hook with every message they send (each
statement, ``BEGIN``, ``COMMIT`` and ``ROLLBACK``), whatever the store's internals. For N allowed
calls:

1. **Record.** The trace hook records each call's statements, parameters and commits.
2. **Replay bare, interleaved with new protected calls** (hook removed). SQLite (FULL and
   NORMAL): the statements run with the bare ``sqlite3`` driver on a copy of the database taken
   (with SQLite's backup API) just before they were recorded, with the pragmas read from the
   store's own connection. A transaction the driver opened implicitly gets an explicit
   ``BEGIN IMMEDIATE``. Postgres: each recorded transaction is sent as one message
   (``BEGIN; …; COMMIT``, bound client-side by psycopg beforehand) to a second schema the store
   created and warmed the same way: the fewest round trips those statements can take.

The replay is the floor for the SQL the store sends; everything above it in the protected call
is Python. If the trace shows no statements, or a replay fails, the row is skipped with a note.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from typing import Any

from .common import AGENT, ALLOWED_AMOUNT, Results, Row, Settings, fresh_dir, interleave
from .pg import Postgres
from .stores import open_store, protected_refund

Item = tuple[str, Any, bool]  # statement, parameters, executemany
PRAGMAS = ("synchronous", "foreign_keys", "cache_size", "temp_store", "mmap_size", "busy_timeout")


class Recorder:
    """Records what the store sends, per call, through its public ``trace`` hook (one call per
    message; a Postgres message carries BEGIN and COMMIT with a statement, split apart here)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.calls: list[list[Item]] = []

    def __enter__(self) -> Recorder:
        self.store.trace = self._sent
        return self

    def __exit__(self, *exc: object) -> None:
        self.store.trace = None

    def next_call(self) -> None:
        self.calls.append([])

    def _sent(self, text: str, parameters: Any) -> None:
        if not self.calls:
            return
        for part in text.split("; "):
            if _verb(part) in ("BEGIN", "COMMIT", "ROLLBACK"):
                self.calls[-1].append((part, (), False))
            else:
                self.calls[-1].append((part, _copy(parameters), False))

    def verbs(self) -> dict[str, float]:
        counted: Counter[str] = Counter(_verb(s) for call in self.calls for s, _, _ in call)
        n = len(self.calls) or 1
        return {verb: c / n for verb, c in sorted(counted.items())}


def _copy(parameters: Any) -> Any:
    if parameters is None:
        return ()
    if hasattr(parameters, "keys"):
        return dict(parameters)
    return tuple(parameters)


def _verb(statement: str) -> str:
    words = statement.lstrip().split(None, 1)
    return words[0].upper() if words else ""


def transactions(items: list[Item]) -> list[list[Item]]:
    """A call's items split after each COMMIT / ROLLBACK (a trailing group without one too)."""
    groups: list[list[Item]] = [[]]
    for item in items:
        groups[-1].append(item)
        if _verb(item[0]) in ("COMMIT", "ROLLBACK"):
            groups.append([])
    return [g for g in groups if g]


def sqlite_steps(items: list[Item]) -> list[Item]:
    """The items as the bare driver (autocommit) must run them: an explicit ``BEGIN IMMEDIATE``
    where the store's driver began implicitly, no ROLLBACK of a transaction never begun."""
    out: list[Item] = []
    for group in transactions(items):
        end = _verb(group[-1][0])
        begun = _verb(group[0][0]) == "BEGIN"
        if end == "COMMIT" and not begun:
            group = [("BEGIN IMMEDIATE", (), False), *group]
        elif end == "ROLLBACK" and not begun:
            group = group[:-1]
        out += group
    return out


def _pragmas(store: Any) -> dict[str, Any]:
    """The store's connection settings, read from a connection of its own engine."""
    found = {}
    with store.engine.connect() as conn:
        for name in PRAGMAS:
            row = conn.exec_driver_sql(f"PRAGMA {name}").fetchone()
            if row is not None:
                found[name] = row[0]
        conn.rollback()
    return found


def _record(store: Any, protected: Any, calls: int) -> Recorder:
    recorder = Recorder(store)
    with recorder:
        for i in range(calls):
            recorder.next_call()
            protected(payment_id=f"r{i}", amount=ALLOWED_AMOUNT)
    if not any(recorder.calls):
        raise RuntimeError("the store's trace showed no statements for an allowed call")
    return recorder


def _sqlite(kind: str, settings: Settings, pg: Postgres, results: Results, calls: int) -> None:
    import ctrlrun

    with fresh_dir(settings, f"where-{kind}") as directory:
        opened = open_store(kind, directory, pg, raw=False)
        try:
            store = opened.store
            _, protected = protected_refund(store)
            with ctrlrun.context(agent=AGENT):
                for i in range(settings.warmup):
                    protected(payment_id=f"w{i}", amount=ALLOWED_AMOUNT)
                pragmas = _pragmas(store)
                copy = f"{directory}/replay.db"
                with sqlite3.connect(opened.spec["path"]) as source, sqlite3.connect(copy) as target:
                    source.backup(target)
                source.close()
                target.close()
                recorder = _record(store, protected, calls)
                steps = [sqlite_steps(call) for call in recorder.calls]
                replay = sqlite3.connect(copy, isolation_level=None, timeout=5.0)
                replay.execute("PRAGMA journal_mode=WAL")
                for name, value in pragmas.items():
                    replay.execute(f"PRAGMA {name}={int(value)}")
                position = {"n": 0}

                def replayed(i: int) -> None:
                    for statement, parameters, many in steps[position["n"]]:
                        if many:
                            replay.executemany(statement, parameters)
                        else:
                            replay.execute(statement, parameters).fetchall()
                    position["n"] += 1

                def call_protected(i: int) -> None:
                    protected(payment_id=f"p{i}", amount=ALLOWED_AMOUNT)

                try:
                    series = interleave(
                        [("protected", call_protected), ("same SQL, bare sqlite3", replayed)],
                        calls=calls, rounds=min(settings.rounds, calls), warmup=0,
                    )  # fmt: skip
                finally:
                    replay.close()
        finally:
            opened.close()
    verbs = recorder.verbs()
    _rows(results, kind, series, "same SQL, bare sqlite3", verbs,
          f"{sum(verbs.values()):.0f} statements per call, replayed")  # fmt: skip


def _postgres(settings: Settings, pg: Postgres, results: Results, calls: int) -> None:
    import ctrlrun

    recorded, twin = pg.new_schema(), pg.new_schema()
    store, other = pg.store(recorded), pg.store(twin)
    replay = pg.connect()
    try:
        _, protected = protected_refund(store)
        _, warm_twin = protected_refund(other)
        with ctrlrun.context(agent=AGENT):
            for i in range(settings.warmup):  # both schemas: the same number of receipts
                protected(payment_id=f"w{i}", amount=ALLOWED_AMOUNT)
                warm_twin(payment_id=f"w{i}", amount=ALLOWED_AMOUNT)
            recorder = _record(store, protected, calls)
            cursor = pg.client_cursor(replay)

            def bound(statement: str, parameters: Any) -> str:
                text = cursor.mogrify(statement, parameters or None)
                return text.replace(f'"{recorded}".', f'"{twin}".').replace(f"{recorded}.", f"{twin}.")

            messages: list[list[str]] = []
            for call in recorder.calls:
                messages.append([])
                for group in transactions(call):
                    body = []
                    for statement, parameters, many in group:
                        if _verb(statement) in ("BEGIN", "COMMIT", "ROLLBACK"):
                            continue
                        body += [bound(statement, p) for p in (parameters if many else [parameters])]
                    end = _verb(group[-1][0]) if _verb(group[-1][0]) in ("COMMIT", "ROLLBACK") else "COMMIT"
                    messages[-1].append(";\n".join(["BEGIN", *body, end]))
            position = {"n": 0}

            def replayed(i: int) -> None:
                for message in messages[position["n"]]:
                    cursor.execute(message)
                position["n"] += 1

            def call_protected(i: int) -> None:
                protected(payment_id=f"p{i}", amount=ALLOWED_AMOUNT)

            series = interleave(
                [("protected", call_protected), ("same SQL, bare psycopg", replayed)],
                calls=calls, rounds=min(settings.rounds, calls), warmup=0,
            )  # fmt: skip
    finally:
        replay.close()
        store.close()
        other.close()
    per_call = sum(len(m) for m in messages) / len(messages)
    verbs = recorder.verbs()
    _rows(results, "postgres", series, "same SQL, bare psycopg", verbs,
          f"{sum(v for k, v in verbs.items() if k not in ('BEGIN', 'COMMIT', 'ROLLBACK')):.0f} "
          f"statements in {per_call:.0f} messages per call, replayed")  # fmt: skip


def _rows(results: Results, kind: str, series: dict, label: str, verbs: dict[str, float],
          note: str) -> None:  # fmt: skip
    results.rows.append(Row("where", kind, "protected", series["protected"], None,
                            "interleaved with the line below"))  # fmt: skip
    results.rows.append(Row("where", kind, label, series[label], verbs.get("COMMIT"), note))
    results.figures.setdefault("statements_per_call", {})[kind] = verbs


def run(settings: Settings, pg: Postgres, results: Results) -> None:
    calls = settings.replay_calls
    kinds = [k for k in ("sqlite-full", "sqlite-normal") if k in settings.stores]
    with_pg = pg.available and "postgres" in settings.stores
    print(f"- where: the allow path's SQL recorded, then replayed bare ({calls} calls; "
          f"{', '.join(kinds + (['postgres'] if with_pg else []))})", flush=True)  # fmt: skip
    for kind in kinds:
        try:
            _sqlite(kind, settings, pg, results, calls)
        except Exception as exc:  # the store is being rewritten: report, do not stop the run
            results.note(f"where, {kind}: skipped ({type(exc).__name__}: {exc})")
    if with_pg:
        try:
            _postgres(settings, pg, results, calls)
        except Exception as exc:
            results.note(f"where, postgres: skipped ({type(exc).__name__}: {exc})")
