"""Timing, results and the settings every benchmark shares."""

from __future__ import annotations

import os
import platform
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

perf_ns = time.perf_counter_ns
cpu_ns = time.process_time_ns

# The policy of the allow and approval paths (the README's refund rule) and the function under
# test: defined in ab_call.py, which runs alone under another interpreter too.
from .ab_call import POLICY as REFUND_POLICY  # noqa: E402
from .ab_call import refund  # noqa: E402, F401

ACTION = "bench.refund"
EFFECT = "refund:{payment_id}"
ALLOWED_AMOUNT = 12_000  # allow
APPROVAL_AMOUNT = 200_000  # approve
AGENT = "bench-agent"


# --------------------------------------------------------------------------- settings


@dataclass
class Settings:
    quick: bool
    calls: int  # timed calls per variant on the allow path
    rounds: int  # interleaved rounds (each variant runs calls/rounds per round)
    warmup: int  # untimed calls per variant before the first round
    contention_keys: int
    contention_procs: tuple[int, ...]
    stores: tuple[str, ...]  # sqlite-full, sqlite-normal, memory, postgres
    tmpdir: str | None
    postgres_url: str | None
    reference: str | None = None  # another interpreter's python, for the A/B rows

    @property
    def approval_cycles(self) -> int:
        return max(5, self.calls // 5)

    @property
    def micro_calls(self) -> int:
        return self.calls * 50

    @property
    def replay_calls(self) -> int:
        """Calls recorded and replayed bare in the ``where`` rows."""
        return max(30, min(self.calls, 200))

    @property
    def ab_calls(self) -> int:
        """Timed calls per A/B subprocess (an interpreter's start-up costs more than 100 calls)."""
        return max(100, self.calls)

    @property
    def profile_calls(self) -> int:
        """Calls under cProfile per store and interpreter (and as many timed before them)."""
        return 100 if self.quick else 500


# --------------------------------------------------------------------------- measurements


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an ascending sequence (``q`` in 0..100)."""
    if not sorted_values:
        return float("nan")
    rank = max(1, -(-len(sorted_values) * q // 100))  # ceil(n*q/100), at least 1
    return sorted_values[int(rank) - 1]


@dataclass
class Series:
    """Per-sample wall times of one variant; a sample covers ``per_sample`` calls."""

    per_sample: int = 1
    samples: list[int] = field(default_factory=list)
    wall_ns: int = 0
    cpu_ns: int = 0

    @property
    def calls(self) -> int:
        return len(self.samples) * self.per_sample

    def p(self, q: float) -> float:
        """Percentile of the per-call time, in µs."""
        return percentile(sorted(self.samples), q) / self.per_sample / 1000

    @property
    def mean_us(self) -> float:
        return self.wall_ns / self.calls / 1000 if self.calls else float("nan")

    @property
    def cpu_us(self) -> float:
        return self.cpu_ns / self.calls / 1000 if self.calls else float("nan")

    @property
    def calls_per_s(self) -> float:
        return self.calls / (self.wall_ns / 1e9) if self.wall_ns else float("nan")

    def summary(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "calls_per_s": self.calls_per_s,
            "p50_us": self.p(50),
            "p99_us": self.p(99),
            "mean_us": self.mean_us,
            "cpu_us": self.cpu_us,
        }


def time_calls(series: Series, fn: Callable[[int], Any], indices: range) -> None:
    """Call ``fn(i)`` for each index, timing every call on its own."""
    append = series.samples.append
    w0, c0 = perf_ns(), cpu_ns()
    for i in indices:
        t0 = perf_ns()
        fn(i)
        append(perf_ns() - t0)
    series.cpu_ns += cpu_ns() - c0
    series.wall_ns += perf_ns() - w0


def time_batches(series: Series, fn: Callable[[int], Any], indices: range) -> None:
    """Call ``fn(i)`` for each index, one sample per ``series.per_sample`` calls (for calls of a
    few µs, where reading the clock around each call would be a visible part of the figure)."""
    append = series.samples.append
    batch = series.per_sample
    w0, c0 = perf_ns(), cpu_ns()
    for start in range(indices.start, indices.stop, batch):
        t0 = perf_ns()
        for i in range(start, start + batch):
            fn(i)
        append(perf_ns() - t0)
    series.cpu_ns += cpu_ns() - c0
    series.wall_ns += perf_ns() - w0


def interleave(
    variants: Sequence[tuple[str, Callable[[int], Any]]],
    *,
    calls: int,
    rounds: int,
    warmup: int,
    before: Callable[[str], None] | None = None,
    after: Callable[[str, int], None] | None = None,
) -> dict[str, Series]:
    """Run every variant ``calls`` times, in ``rounds`` rounds that alternate the variants (the
    order rotates each round), so a slow spell of the machine hits all of them alike. Each call
    gets an index never used before (a new effect key per call). ``before(name)`` /
    ``after(name, n)`` run untimed around each timed batch (e.g. to read a counter)."""
    series = {name: Series() for name, _ in variants}
    nxt = 0
    for _, fn in variants:  # warm-up: connections, statement caches, imports
        for i in range(nxt, nxt + warmup):
            fn(i)
        nxt += warmup
    per_round = [calls // rounds + (1 if r < calls % rounds else 0) for r in range(rounds)]
    for r, n in enumerate(per_round):
        order = list(variants[r % len(variants):]) + list(variants[: r % len(variants)])
        for name, fn in order:
            if before:
                before(name)
            time_calls(series[name], fn, range(nxt, nxt + n))
            if after:
                after(name, n)
            nxt += n
    return series


# --------------------------------------------------------------------------- results


@dataclass
class Row:
    bench: str
    store: str
    variant: str
    series: Series | None = None
    tx_per_call: float | None = None
    note: str = ""
    values: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"bench": self.bench, "store": self.store, "variant": self.variant}
        if self.series is not None:
            out.update(self.series.summary())
        out["tx_per_call"] = self.tx_per_call
        out["note"] = self.note
        out.update(self.values)
        return out


@dataclass
class Ratio:
    name: str
    value: float | None
    target: str
    met: bool | None  # None: informational (no target)
    detail: str = ""


@dataclass
class Results:
    rows: list[Row] = field(default_factory=list)
    contention: list[dict[str, Any]] = field(default_factory=list)
    ratios: list[Ratio] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    profile: dict[str, Any] | None = None  # cProfile by interpreter and store (hotpath.py)
    targets: list[Ratio] = field(default_factory=list)  # the four targets
    ab: list[dict[str, Any]] = field(default_factory=list)  # A/B against the reference (ab.py)
    ab_skipped: str | None = None  # why there are no A/B rows
    reference: dict[str, Any] | None = None  # the reference interpreter, its ctrlrun
    figures: dict[str, Any] = field(default_factory=dict)  # named figures shared across benches

    def row(self, bench: str, store: str, variant: str) -> Row | None:
        for r in self.rows:
            if (r.bench, r.store, r.variant) == (bench, store, variant):
                return r
        return None

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(f"  note: {text}", flush=True)

    def violation(self, text: str) -> None:
        self.violations.append(text)
        print(f"\n!!! VIOLATION: {text}\n", flush=True)


# --------------------------------------------------------------------------- environment


@contextmanager
def fresh_dir(settings: Settings, label: str) -> Iterator[str]:
    """A new temporary directory for one benchmark, removed afterwards."""
    path = tempfile.mkdtemp(prefix=f"ctrlrun-bench-{label}-", dir=settings.tmpdir)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _filesystem(path: str) -> str:
    """The filesystem type holding ``path`` (from /proc/mounts), or ``unknown``."""
    try:
        real = os.path.realpath(path)
        best, kind = "", "unknown"
        with open("/proc/mounts", encoding="utf-8") as mounts:
            for line in mounts:
                parts = line.split()
                if len(parts) >= 3 and (real == parts[1] or real.startswith(parts[1].rstrip("/") + "/")):
                    if len(parts[1]) >= len(best):
                        best, kind = parts[1], parts[2]
        return kind
    except OSError:
        return "unknown"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def machine(settings: Settings) -> dict[str, Any]:
    import sqlalchemy

    import ctrlrun

    try:
        import psycopg

        psycopg_version = psycopg.__version__
    except ImportError:
        psycopg_version = None
    tmp = settings.tmpdir or tempfile.gettempdir()
    return {
        "cpu_count": os.cpu_count(),
        "cpu": _cpu_model(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "sqlite": sqlite3.sqlite_version,
        "sqlalchemy": sqlalchemy.__version__,
        "psycopg": psycopg_version,
        "ctrlrun": ctrlrun.__version__,
        "tmpdir": tmp,
        "tmpdir_filesystem": _filesystem(tmp),
        "load_average_start": load_average(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
