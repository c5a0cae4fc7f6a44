"""Where the time goes: cProfile of the SQLite allow path, and the SQL it sends per call.

Two runs on a fresh SQLite store (durability FULL, the default):

1. without the profiler, an engine event listener counts the statements per allowed call by
   kind (the commits are the store's ``transactions``);
2. under cProfile, every function's own time (``tottime``) is summed into categories that
   partition the run — SQLAlchemy, the sqlite3 driver's execute and its COMMIT, JSON, hashing,
   ctrlrun's own code, the rest — and the top functions are listed.

cProfile slows Python code several times more than it slows C calls (execute, COMMIT), so the
shares of Python-heavy categories are overstated; the per-call totals printed here are for the
profiled run only, and the table's unprofiled figures are the ones to quote.
"""

from __future__ import annotations

import cProfile
import pstats
from collections import Counter
from typing import Any

from .common import AGENT, ALLOWED_AMOUNT, Results, Settings, fresh_dir, perf_ns
from .pg import Postgres
from .stores import open_store, protected_refund

TOP = 12


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
    if "hashlib" in name or "sha256" in name or "hexdigest" in name:
        return "hashlib (SHA-256)"
    if "/uuid" in filename or "urandom" in name or "token_hex" in name or "/secrets" in filename:
        return "ids (secrets/uuid)"
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


def _count_statements(store: Any, protected: Any, calls: int, start: int) -> dict[str, float]:
    from sqlalchemy import event

    verbs: Counter[str] = Counter()

    def listener(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        verbs[statement.lstrip().split(None, 1)[0].upper()] += 1

    event.listen(store.engine, "before_cursor_execute", listener)
    tx0 = store.transactions
    try:
        for i in range(start, start + calls):
            protected(payment_id=f"p{i}", amount=ALLOWED_AMOUNT)
    finally:
        event.remove(store.engine, "before_cursor_execute", listener)
    out = {verb: n / calls for verb, n in sorted(verbs.items())}
    out["COMMIT"] = (store.transactions - tx0) / calls
    return out


def run(settings: Settings, pg: Postgres, results: Results) -> None:
    import ctrlrun

    calls = settings.profile_calls
    print(f"- profile: SQLite FULL allow path, {calls} calls under cProfile", flush=True)
    with fresh_dir(settings, "profile") as directory:
        opened = open_store("sqlite-full", directory, pg, raw=False)
        try:
            store = opened.store
            _, protected = protected_refund(store)
            with ctrlrun.context(agent=AGENT):
                for i in range(settings.warmup):
                    protected(payment_id=f"w{i}", amount=ALLOWED_AMOUNT)
                statements = _count_statements(store, protected, 20, 0)
                profiler = cProfile.Profile()
                t0 = perf_ns()
                profiler.enable()
                for i in range(100, 100 + calls):
                    protected(payment_id=f"p{i}", amount=ALLOWED_AMOUNT)
                profiler.disable()
                wall_us = (perf_ns() - t0) / calls / 1000
        finally:
            opened.close()
    stats = pstats.Stats(profiler)
    raw = stats.stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in raw.values())
    categories: Counter[str] = Counter()
    for key, value in raw.items():
        categories[_category(key)] += value[2]
    per_call = lambda seconds: seconds / calls * 1e6  # noqa: E731
    top_self = sorted(raw.items(), key=lambda kv: kv[1][2], reverse=True)[:TOP]
    ours = [(k, v) for k, v in raw.items() if "/ctrlrun/" in k[0]]
    top_cum = sorted(ours, key=lambda kv: kv[1][3], reverse=True)[:TOP]
    results.profile = {
        "calls": calls,
        "profiled_us_per_call": wall_us,
        "total_us_per_call": per_call(total),
        "statements_per_call": statements,
        "categories": [
            {"category": c, "us_per_call": per_call(s), "share": s / total}
            for c, s in categories.most_common()
        ],
        "top_self": [
            {"function": _where(k), "calls_per_call": v[1] / calls, "self_us_per_call": per_call(v[2]),
             "share": v[2] / total}
            for k, v in top_self
        ],  # fmt: skip
        "top_ctrlrun_cumulative": [
            {"function": _where(k), "calls_per_call": v[1] / calls, "cum_us_per_call": per_call(v[3]),
             "share": v[3] / total}
            for k, v in top_cum
        ],  # fmt: skip
    }
