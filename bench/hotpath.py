"""``profile``: Python function calls per allowed call, and where one call's time goes.

``bench/ab_call.py STORE N --profile`` runs in a subprocess per store (in-memory and SQLite
NORMAL) and per interpreter (ours; the reference too when one is given): N timed allowed calls
through the public API (``@protect``ed refund, a new key each call), then N more under cProfile.

- **Function calls per allowed call**: cProfile's ``total_calls`` ÷ N (Python functions and C
  functions alike, both split out).
- **Where the time goes**: every function's own time (``tottime``) summed by module group
  (``ctrlrun.action``, ``ctrlrun.policy.*``, ``ctrlrun.store.*``, …, json, hashlib, sqlite3,
  sqlalchemy, other; see ``ab_call.group_stats``), and shown **scaled to the unprofiled p50** of
  the same process: each group's share of the profiled own time × that p50, so a store's column
  adds up to the measured call. cProfile slows Python functions more than C calls (sqlite3's
  execute and commit, json's C encoder, SHA-256), so Python groups are somewhat overstated.

The groups come from the modules loaded, not from names inside ctrlrun, so an internal refactor
moves time between groups instead of breaking the profile.
"""

from __future__ import annotations

import sys
from typing import Any

from . import ab
from .common import Results, Settings

STORES = ("memory", "sqlite-normal")
LABEL = {"memory": "in-memory", "sqlite-normal": "SQLite NORMAL"}
TOP = 8


def run(settings: Settings, pg: object, results: Results) -> None:
    calls = settings.profile_calls
    who = [("ours", sys.executable, True)]
    reference = ab.ensure_reference(settings, results)
    if reference:
        who.append((str(reference.get("version", "reference")), reference["python"], False))
    stores = [s for s in STORES if s in settings.stores]
    print(f"- profile: {calls} allowed calls timed, then {calls} under cProfile, per store "
          f"({', '.join(stores)}) and interpreter ({', '.join(w for w, _, _ in who)})", flush=True)  # fmt: skip
    runs = []
    for name, python, ours in who:
        for kind in stores:
            try:
                out = ab.run_script(python, [kind, str(calls), "--profile"], ours=ours)
            except RuntimeError as exc:
                results.note(f"profile, {name} on {kind}: skipped ({exc})")
                continue
            runs.append({"who": name, **out})
    results.profile = {"calls": calls, "runs": runs}


# --------------------------------------------------------------------------- rendering


def _n(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.1f}"


def scaled(run: dict[str, Any]) -> dict[str, float]:
    """The run's groups in µs per call, scaled so they add up to its unprofiled p50."""
    factor = run["p50"] / run["own_us_per_call"] if run.get("own_us_per_call") else 0.0
    return {g: us * factor for g, us in run["groups"].items()}


def tables(profile: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) for each profile table, for the console and the docs."""
    runs = profile["runs"]
    if not runs:
        return []
    out = []
    header = ["interpreter", "store", "function calls per call", "Python", "C",
              "p50 µs", "profiled µs"]  # fmt: skip
    rows = [[r["who"], LABEL.get(r["store"], r["store"]), _n(r["function_calls_per_call"]),
             _n(r["python_calls_per_call"]), _n(r["c_calls_per_call"]), _n(r["p50"]),
             _n(r["profiled_us_per_call"])] for r in runs]  # fmt: skip
    out.append((f"Python function calls per allowed call (cProfile total_calls ÷ "
                f"{profile['calls']} calls; p50 of as many calls timed without the profiler)",
                header, rows))  # fmt: skip

    columns = [(r, scaled(r)) for r in runs]
    order: list[str] = []
    for _, groups in sorted(columns, key=lambda c: c[0]["who"] != "ours"):
        for g in sorted(groups, key=lambda g: -groups[g]):
            if g not in order and g != "other":
                order.append(g)
    order.append("other")
    header = ["own time by module, µs per call"] + [
        f"{r['who']} {LABEL.get(r['store'], r['store'])}" for r, _ in columns]
    rows = []
    for g in order:
        cells = [g]
        for r, groups in columns:
            value = groups.get(g)
            cells.append("-" if value is None else f"{_n(value)} ({value / r['p50']:.0%})")
        rows.append(cells)
    rows.append(["total = the unprofiled p50"] + [_n(r["p50"]) for r, _ in columns])
    out.append(("Where the time goes: each group's share of cProfile's own time × the "
                "unprofiled p50 of the same process (so each column adds up to the measured "
                "call; C functions other than sqlite3/json/hashlib are charged to the module "
                "that called them)", header, rows))  # fmt: skip

    others = [f"{r['who']} {LABEL.get(r['store'], r['store'])}: " + ", ".join(
        f"{m} {_n(us * (r['p50'] / r['own_us_per_call']))}" for m, us in r["other_modules"].items())
        for r in runs if r.get("other_modules")]  # fmt: skip
    if others:
        out.append(("'other' holds (µs per call, scaled the same way)", ["interpreter and store"],
                    [[line] for line in others]))  # fmt: skip

    for r in runs:
        if r["who"] != "ours":
            continue
        factor = r["p50"] / r["own_us_per_call"]
        rows = [[where, _n(n), _n(us * factor)] for where, n, us in r["top"][:TOP]]
        out.append((f"top functions by own time, ours, {LABEL.get(r['store'], r['store'])} "
                    "(scaled the same way)", ["function", "calls per call", "µs per call"], rows))  # fmt: skip
    return out
