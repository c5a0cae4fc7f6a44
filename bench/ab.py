"""A/B against a reference ctrlrun: ``bench/ab_call.py`` run by both interpreters, alternating.

``--reference PYTHON`` (or ``$CTRLRUN_BENCH_REFERENCE``) names an interpreter whose ``ctrlrun``
is another version of the same design (a published release in its own virtualenv: the two
packages share an import name, so they cannot be loaded side by side). For each store, rounds of
one subprocess per interpreter run ``ab_call.py STORE N`` in the order A B, B A, A B, … (A: this
checkout, via ``PYTHONPATH=src``; B: the reference, with ``PYTHONPATH`` cleared), so a slow spell
of a shared machine falls on both. Each subprocess reports its p50 overhead (protected call minus
the bare function); the figures are the median across rounds and the min–max spread.

Stores: ``memory`` and ``sqlite-normal`` for both (a reference whose SQLite store has no
``durability=`` setting is WAL without a sync per commit, i.e. comparable to our NORMAL; ours
runs with ``durability="normal"``), and ``sqlite-full`` for ours alone unless the reference takes
``durability=`` too. The targets (in-memory 8×, NORMAL 4×) are the reference's overhead over ours.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from . import REPO
from .common import Results, Settings

SCRIPT = Path(__file__).with_name("ab_call.py")
REFERENCE_VARIABLE = "CTRLRUN_BENCH_REFERENCE"
STORES = ("memory", "sqlite-normal", "sqlite-full")
TARGETS = {"memory": 8.0, "sqlite-normal": 4.0}  # reference overhead ÷ ours, at least
TIMEOUT = 300.0
_PROBE = (
    "import inspect, json, ctrlrun\n"
    "try:\n"
    "    from importlib.metadata import version; v = version('ctrlrun')\n"
    "except Exception:\n"
    "    v = getattr(ctrlrun, '__version__', '?')\n"
    "print(json.dumps({'version': v, 'file': ctrlrun.__file__, 'durability': 'durability' in\n"
    "    inspect.signature(ctrlrun.SQLiteStateStore).parameters}))\n"
)


def environment(ours: bool) -> dict[str, str]:
    """Ours imports this checkout's ``src/`` first; the reference imports only its own."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if ours:
        previous = os.environ.get("PYTHONPATH")
        env["PYTHONPATH"] = str(REPO / "src") + (os.pathsep + previous if previous else "")
    return env


def run_script(python: str, args: list[str], *, ours: bool) -> dict[str, Any]:
    """``python bench/ab_call.py ARGS``: its JSON line, or RuntimeError saying what went wrong."""
    return _run([python, str(SCRIPT), *args], ours=ours)


def _run(command: list[str], *, ours: bool) -> dict[str, Any]:
    try:
        done = subprocess.run(command, env=environment(ours), capture_output=True, text=True,
                              timeout=TIMEOUT, check=False, cwd=REPO)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"{command[0]}: {type(exc).__name__}: {exc}") from None
    lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{command[0]} exited {done.returncode}: {tail}")
    return json.loads(lines[-1])


def reference_python(cli_value: str | None) -> str | None:
    return cli_value or os.environ.get(REFERENCE_VARIABLE, "").strip() or None


def probe(python: str, *, ours: bool) -> dict[str, Any]:
    """The version and file of the ``ctrlrun`` that ``python`` imports, and whether its SQLite
    store takes ``durability=``."""
    return _run([python, "-c", _PROBE], ours=ours)


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def ensure_reference(settings: Settings, results: Results) -> dict[str, Any] | None:
    """The reference interpreter's ctrlrun (probed once per run), or None with the reason in
    ``results.ab_skipped`` and the notes."""
    if results.reference is not None or results.ab_skipped is not None:
        return results.reference
    python = settings.reference
    if not python:
        results.ab_skipped = (
            f"no reference interpreter (pass --reference PYTHON or set ${REFERENCE_VARIABLE}): "
            "the A/B rows and the reference's profile are not measured"
        )
        results.note(results.ab_skipped)
        return None
    try:
        ours = probe(sys.executable, ours=True)
        found = probe(python, ours=False)
    except RuntimeError as exc:
        results.ab_skipped = f"reference skipped: {exc}"
        results.note(results.ab_skipped)
        return None
    if os.path.realpath(ours["file"]) == os.path.realpath(found["file"]):
        results.note(f"the reference imports the same ctrlrun as ours ({found['file']})")
    results.reference = {"python": python, **found, "ours": ours}
    return results.reference


def run(settings: Settings, pg: object, results: Results) -> None:
    ref_info = ensure_reference(settings, results)
    if ref_info is None:
        return
    reference, ours_info = ref_info["python"], ref_info["ours"]
    calls = settings.ab_calls
    stores = [s for s in STORES if s in settings.stores]
    print(f"- A/B: ours ({ours_info['version']}) and the reference ({ref_info['version']}, "
          f"{reference}), {settings.rounds} rounds × {calls} calls per store", flush=True)  # fmt: skip
    for kind in stores:
        both = kind != "sqlite-full" or bool(ref_info.get("durability"))
        ours: list[float] = []
        ref: list[float] = []
        error = None
        for r in range(settings.rounds):
            order = [True, False] if r % 2 == 0 else [False, True]
            for is_ours in order if both else [True]:
                python = sys.executable if is_ours else reference
                try:
                    out = run_script(python, [kind, str(calls)], ours=is_ours)
                except RuntimeError as exc:
                    error = str(exc)
                    break
                (ours if is_ours else ref).append(out["overhead_p50"])
            if error:
                break
        entry: dict[str, Any] = {"store": kind, "calls": calls, "rounds": len(ours),
                                 "target": TARGETS.get(kind), "error": error}  # fmt: skip
        if ours:
            entry["ours"] = _spread(ours)
        if ref and len(ref) == len(ours):
            entry["reference"] = _spread(ref)
            entry["ratio"] = entry["reference"]["median"] / entry["ours"]["median"]
            per_round = [b / a for a, b in zip(ours, ref, strict=True)]
            entry["ratio_by_round"] = _spread(per_round)
        elif not both:
            entry["why_no_reference"] = "the reference's SQLite store has no durability setting"
        if error:
            results.note(f"A/B on {kind} stopped: {error}")
        results.ab.append(entry)


def _us(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def table(results: Results) -> tuple[list[str], list[list[str]]]:
    """The A/B rows as (header, rows), for the console and for the docs."""
    version = (results.reference or {}).get("version", "reference")
    header = ["store", "ours p50 overhead µs (min–max)", f"{version} p50 overhead µs (min–max)",
              f"{version} ÷ ours (by round)", "target", "status"]  # fmt: skip
    rows = []
    for e in results.ab:
        o, r = e.get("ours"), e.get("reference")
        mine = f"{_us(o['median'])} ({_us(o['min'])}–{_us(o['max'])})" if o else "-"
        theirs = f"{_us(r['median'])} ({_us(r['min'])}–{_us(r['max'])})" if r else (
            e.get("why_no_reference") or e.get("error") or "-")
        ratio = "-"
        if "ratio" in e:
            b = e["ratio_by_round"]
            ratio = f"{e['ratio']:.2f}× ({b['min']:.2f}–{b['max']:.2f})"
        target = f"≥ {e['target']:.0f}×" if e.get("target") else "none"
        status = "-" if "ratio" not in e or not e.get("target") else (
            "met" if e["ratio"] >= e["target"] else "NOT MET")
        rows.append([e["store"], mine, theirs, ratio, target, status])
    return header, rows
