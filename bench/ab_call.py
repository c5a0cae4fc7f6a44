"""One interpreter's allowed-call overhead, public API only: ``python bench/ab_call.py STORE N``.

Run by ``python -m bench --reference PYTHON`` under both this checkout's interpreter and another
one (say, a virtualenv holding a published ctrlrun), alternating, so both are measured in one run
on the same machine. It uses only what both versions share: ``Policy.from_yaml``, ``Control``,
``protect``, ``context`` and the two stores (``durability=`` only where the store takes it).
STORE is ``memory``, ``sqlite-normal`` or ``sqlite-full``.

Prints one JSON line: the store, the version and file of the ctrlrun measured, the p50 and p90 of
the protected call and of the bare function, in microseconds, and the overhead (their difference).

With ``--profile`` (or ``--count-calls``), N timed calls are followed by N more under cProfile,
and the line also holds the function calls per allowed call (cProfile's ``total_calls`` over N)
and each function's own time (``tottime``) summed by module group (``groups``): what the bench
reports as "where the time goes". The groups come from the modules loaded, not from a list of
ctrlrun's internals, so they survive refactors; ``python -m bench`` imports them from here.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import sys
import tempfile
import time
from typing import Any

if sys.path and sys.path[0] == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]  # bench/ holds modules named policy, report, docs…: never import those

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  bench.refund:
    effect: "refund:{payment_id}"
    rules:
      - when: { amount_gte: 0, amount_lte: 50000 }
        decision: allow
      - when: { amount_gte: 0, amount_lte: 500000 }
        decision: approve
      - decision: deny
"""
STORES = ("memory", "sqlite-normal", "sqlite-full")
#: modules (by the first part of their name) that form a group of their own
NAMED = {
    "json": "json", "_json": "json",
    "hashlib": "hashlib", "_hashlib": "hashlib", "_sha256": "hashlib", "_sha2": "hashlib",
    "sqlite3": "sqlite3", "_sqlite3": "sqlite3",
    "sqlalchemy": "sqlalchemy",
    "psycopg": "psycopg", "psycopg_binary": "psycopg", "psycopg_c": "psycopg",
}  # fmt: skip
OTHER = "other"
_C_OWNER = re.compile(r"(?:of '|built-in method |<method ')([A-Za-z_][\w]*)\.")


def refund(payment_id: str, amount: int) -> dict:
    return {"id": "re_" + payment_id, "amount": amount}


def _store(kind: str, directory: str) -> Any:
    import ctrlrun

    if kind == "memory":
        return ctrlrun.InMemoryStateStore()
    path = os.path.join(directory, "state.db")
    accepts = inspect.signature(ctrlrun.SQLiteStateStore).parameters
    if "durability" in accepts:
        return ctrlrun.SQLiteStateStore(path, durability=kind.split("-")[1])
    if kind != "sqlite-normal":
        raise SystemExit(f"this ctrlrun has no durability= setting; {kind} cannot be measured")
    return ctrlrun.SQLiteStateStore(path)  # WAL without a sync per commit: like our NORMAL


def _p(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("ctrlrun")
    except Exception:
        import ctrlrun

        return str(getattr(ctrlrun, "__version__", "?"))


# --------------------------------------------------------------------------- profile groups


def module_names() -> dict[str, str]:
    """Source file → module name, for every module loaded (cProfile names files, not modules)."""
    names = {}
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if path:
            names[path] = name
            names[os.path.realpath(path)] = name
    return names


def group_of_module(module: str) -> str:
    """``ctrlrun.action`` stays itself; a subpackage's modules share one group
    (``ctrlrun.store.*``); json, hashlib, sqlite3, sqlalchemy, psycopg are one group each."""
    parts = module.split(".")
    if parts[0] == "ctrlrun":
        if len(parts) == 1:
            return "ctrlrun"
        package = sys.modules.get(".".join(parts[:2]))
        if len(parts) > 2 or (package is not None and hasattr(package, "__path__")):
            return f"ctrlrun.{parts[1]}.*"
        return module
    return NAMED.get(parts[0], OTHER)


def group_stats(stats: dict, names: dict[str, str] | None = None) -> tuple[dict[str, float], dict[str, float]]:
    """Own time (seconds) by group, and ``other``'s own time by module (to say what it holds).

    A Python function counts for the module its file belongs to. A C function counts for its
    owner when that is one of the named groups (``sqlite3.Cursor.execute``, ``_json``,
    ``_hashlib``); any other C function (``dict.get``, ``isinstance``, ``datetime.strftime``) is
    charged to the module that called it, call site by call site, since that is whose code asked.
    """
    names = module_names() if names is None else names

    def module_of(key: tuple[str, int, str]) -> str:
        filename = key[0]
        if filename.startswith("<frozen "):  # <frozen abc>, <frozen importlib._bootstrap>
            return filename[len("<frozen "):-1]
        return names.get(filename) or names.get(os.path.realpath(filename), filename)

    groups: dict[str, float] = {}
    other: dict[str, float] = {}

    def add(module: str, seconds: float) -> None:
        group = group_of_module(module)
        groups[group] = groups.get(group, 0.0) + seconds
        if group == OTHER:
            other[module] = other.get(module, 0.0) + seconds

    for key, (_cc, _nc, tottime, _ct, callers) in stats.items():
        filename, _, name = key
        if "_lsprof" in name:
            continue  # the profiler's own disable()
        if filename != "~":
            add(module_of(key), tottime)
            continue
        owner = _C_OWNER.search(name)
        if owner and NAMED.get(owner.group(1)):
            add(owner.group(1), tottime)
            continue
        charged = 0.0
        for caller, edge in callers.items():
            edge_time = edge[2] if isinstance(edge, tuple) else 0.0
            add(module_of(caller) if caller[0] != "~" else "builtins", edge_time)
            charged += edge_time
        if tottime > charged:
            add("builtins", tottime - charged)
    return groups, other


def _where(key: tuple[str, int, str], names: dict[str, str]) -> str:
    filename, line, name = key
    if filename == "~":
        return name
    module = names.get(filename) or os.path.basename(filename)
    return f"{module}:{line}({name})"


def profile(protected: Any, calls: int, start: int) -> dict[str, Any]:
    """cProfile over ``calls`` allowed calls with new keys: calls per call, own time by group."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    t0 = time.perf_counter()
    profiler.enable()
    for i in range(start, start + calls):
        protected(payment_id=f"p{i}", amount=12_000)
    profiler.disable()
    wall = time.perf_counter() - t0
    raw = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    names = module_names()
    counted = {k: v for k, v in raw.items() if "_lsprof" not in k[2]}
    total = sum(v[1] for v in counted.values())
    c_calls = sum(v[1] for k, v in counted.items() if k[0] == "~")
    groups, other = group_stats(counted, names)
    us = 1e6 / calls
    top = sorted(counted.items(), key=lambda kv: kv[1][2], reverse=True)[:12]
    return {
        "profiled_calls": calls,
        "profiled_us_per_call": round(wall * us, 2),
        "function_calls_per_call": round(total / calls, 1),
        "python_calls_per_call": round((total - c_calls) / calls, 1),
        "c_calls_per_call": round(c_calls / calls, 1),
        "own_us_per_call": round(sum(v[2] for v in counted.values()) * us, 2),
        "groups": {g: round(s * us, 2) for g, s in sorted(groups.items(), key=lambda x: -x[1])},
        "other_modules": {m: round(s * us, 2)
                          for m, s in sorted(other.items(), key=lambda x: -x[1])[:6]},
        "top": [[_where(k, names), round(v[1] / calls, 2), round(v[2] * us, 2)] for k, v in top],
    }  # fmt: skip


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    flags = {a for a in args if a.startswith("--")}
    positional = [a for a in args if not a.startswith("--")]
    if len(positional) != 2 or positional[0] not in STORES or flags - {"--profile", "--count-calls"}:
        raise SystemExit(f"usage: ab_call.py {{{','.join(STORES)}}} N [--profile|--count-calls]")
    kind, calls = positional[0], int(positional[1])
    import ctrlrun

    with tempfile.TemporaryDirectory() as directory:
        store = _store(kind, directory)
        control = ctrlrun.Control(ctrlrun.Policy.from_yaml(POLICY, source="bench"), store)
        protected = ctrlrun.protect("bench.refund", effect="refund:{payment_id}", control=control)(
            refund
        )
        clock = time.perf_counter
        guarded: list[float] = []
        bare: list[float] = []
        warmup = max(5, calls // 10)
        profiled = None
        with ctrlrun.context(agent="bench-agent"):
            for i in range(calls + warmup):
                t0 = clock()
                protected(payment_id=f"p{i}", amount=12_000)
                t1 = clock()
                refund(payment_id=f"p{i}", amount=12_000)
                t2 = clock()
                if i >= warmup:  # warm-up left out
                    guarded.append((t1 - t0) * 1e6)
                    bare.append((t2 - t1) * 1e6)
            if flags:
                profiled = profile(protected, calls, calls + warmup)
        close = getattr(store, "close", None)
        if close is not None:
            close()
    p50, bare50 = _p(guarded, 0.5), _p(bare, 0.5)
    out = {
        "store": kind, "calls": calls, "version": _version(), "file": ctrlrun.__file__,
        "python": sys.version.split()[0],
        "p50": round(p50, 2), "p90": round(_p(guarded, 0.9), 2), "bare_p50": round(bare50, 2),
        "overhead_p50": round(p50 - bare50, 2),
    }  # fmt: skip
    if profiled is not None:
        out.update(profiled)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
