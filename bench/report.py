"""Ratios against the targets, the printed table, and the JSON document."""

from __future__ import annotations

import math
from typing import Any

from .common import Ratio, Results
from .stores import LABELS

RATIO_TARGET = 1.5
SHARE_TARGET = 0.05
TX_TARGET = 2


def _num(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


# --------------------------------------------------------------------------- ratios


def compute_ratios(results: Results) -> None:
    """The ratio lines the targets need, from rows measured in this run."""
    ratios = results.ratios
    ratios.clear()

    tx = [(LABELS[r.store] + (" with the JSONL sink" if "sink" in r.variant else ""), r.tx_per_call)
          for r in results.rows
          if r.bench == "allow" and r.variant.startswith("protected") and r.tx_per_call is not None]  # fmt: skip
    if tx:
        worst = max(v for _, v in tx)
        ratios.append(Ratio(
            f"store transactions per allowed call (target ≤ {TX_TARGET})", worst,
            f"≤ {TX_TARGET}", worst <= TX_TARGET,
            ", ".join(f"{label} {v:.2f}" for label, v in tx)))  # fmt: skip

    for kind in ("sqlite-full", "sqlite-normal", "postgres"):
        prot = results.row("allow", kind, "protected")
        plain = results.row("allow", kind, "unprotected")
        raw = results.row("allow", kind, "raw 2 commits")
        if not (prot and plain and raw and prot.series and plain.series and raw.series):
            continue
        overhead = prot.series.p(50) - plain.series.p(50)
        ratio = overhead / raw.series.p(50)
        mean_ratio = (prot.series.mean_us - plain.series.mean_us) / raw.series.mean_us
        cpu_ratio = (prot.series.cpu_us - plain.series.cpu_us) / raw.series.cpu_us
        ratios.append(Ratio(
            f"allow-path overhead ÷ raw two commits, {LABELS[kind]}", ratio,
            f"≤ {RATIO_TARGET}×", ratio <= RATIO_TARGET,
            f"p50 {_num(overhead)} µs vs {_num(raw.series.p(50))} µs, i.e. "
            f"{_num(overhead - raw.series.p(50))} µs beyond the commits; by mean {mean_ratio:.1f}×, "
            f"by CPU time {cpu_ratio:.1f}×"))  # fmt: skip
        sinked = results.row("allow", kind, "protected + JSONL sink")
        if sinked and sinked.series:
            extra = sinked.series.p(50) - plain.series.p(50)
            ratios.append(Ratio(
                f"allow-path overhead with the JSONL sink ÷ raw two commits, {LABELS[kind]}",
                extra / raw.series.p(50), "none: the target is stated for the call itself",
                None, f"p50 {_num(extra)} µs: the evidence copy adds "
                f"{_num(sinked.series.p(50) - prot.series.p(50))} µs"))  # fmt: skip

    from .policy import POLICY_LABEL

    evaluate = results.row("policy", POLICY_LABEL, "evaluate")
    hashing = results.row("policy", POLICY_LABEL, "action hash")
    chain = results.row("policy", "allow receipt", "receipt hash")
    if evaluate and hashing and chain and evaluate.series and hashing.series and chain.series:
        parts = (evaluate.series.p(50), hashing.series.p(50), chain.series.p(50))
        # the reading: policy evaluation and the action hash; the stricter one adds the
        # receipt's chain hash, which every allowed call also computes
        readings = (
            ("(policy evaluation + action hash)", parts[:2],
             f"evaluate {_num(parts[0])} + action hash {_num(parts[1])}"),
            ("(policy evaluation + action hash + receipt hash)", parts,
             f"evaluate {_num(parts[0])} + action hash {_num(parts[1])} + receipt hash "
             f"{_num(parts[2])}"),
        )  # fmt: skip
        for label, counted, spelled in readings:
            decide = sum(counted)
            for kind in ("sqlite-full", "sqlite-normal", "postgres", "memory"):
                prot = results.row("allow", kind, "protected")
                if not (prot and prot.series):
                    continue
                share = decide / prot.series.p(50)
                informational = kind == "memory"
                ratios.append(Ratio(
                    f"{label} ÷ allow-path cost, {LABELS[kind]}", share,
                    f"< {SHARE_TARGET:.0%}" if not informational else "none: nothing durable",
                    None if informational else share < SHARE_TARGET,
                    f"{spelled} = {_num(decide)} µs of {_num(prot.series.p(50))} µs (p50)"))  # fmt: skip


# --------------------------------------------------------------------------- text


def _table(header: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        out = []
        for i, cell in enumerate(cells):
            out.append(cell.rjust(widths[i]) if i in right else cell.ljust(widths[i]))
        return "  ".join(out).rstrip()

    return [line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)]


def render(results: Results) -> str:
    lines: list[str] = []
    if results.rows:
        header = ["benchmark", "store", "variant", "calls", "calls/s", "p50 µs", "p99 µs",
                  "CPU µs/call", "tx/call", "note"]  # fmt: skip
        rows = []
        for r in results.rows:
            s = r.series
            assert s is not None
            rows.append([
                r.bench, r.store, r.variant, str(s.calls), _num(s.calls_per_s), _num(s.p(50)),
                _num(s.p(99)), _num(s.cpu_us) if s.cpu_ns else "-",
                "-" if r.tx_per_call is None else f"{r.tx_per_call:.2f}", r.note,
            ])  # fmt: skip
        lines += _table(header, rows, {3, 4, 5, 6, 7, 8})
    if results.contention:
        lines.append("")
        header = ["contention", "P", "keys", "wall s", "calls/s", "executions/key", "executed",
                  "refused", "errors", "tx/call"]  # fmt: skip
        rows = []
        for c in results.contention:
            refused = ", ".join(f"{k} {v}" for k, v in sorted(c["refused"].items())) or "0"
            rows.append([
                c["store"], str(c["procs"]), str(c["keys"]), _num(c["wall_s"]), _num(c["calls_per_s"]),
                c["exec_per_key"] + ("  <-- VIOLATION" if c["violations"] else ""),
                str(c["executed"]), refused, str(c["errors"]), _num(c["tx_per_call"]),
            ])  # fmt: skip
        lines += _table(header, rows, {1, 2, 3, 4, 6, 8, 9})
    if results.ratios:
        lines += ["", "ratios and targets"]
        for r in results.ratios:
            mark = {True: "[MET]    ", False: "[NOT MET]", None: "[info]   "}[r.met]
            value = f"{r.value:.1%}" if "÷ allow-path cost" in r.name else (
                f"{r.value:.2f}" if "transactions" in r.name else f"{r.value:.2f}×")
            lines.append(f"  {mark} {r.name}: {value} (target {r.target}) — {r.detail}")
    if results.violations:
        lines += ["", f"VIOLATIONS ({len(results.violations)}):"]
        lines += [f"  !!! {v}" for v in results.violations]
    if results.notes:
        lines += ["", "notes"]
        lines += [f"  - {n}" for n in results.notes]
    return "\n".join(lines)


def render_profile(profile: dict[str, Any]) -> str:
    lines = [
        f"cProfile, SQLite FULL allow path, {profile['calls']} calls: "
        f"{_num(profile['profiled_us_per_call'])} µs per call under the profiler",
        "",
        "statements per allowed call (engine events; COMMIT = store transactions): "
        + ", ".join(f"{k} {v:.1f}" for k, v in profile["statements_per_call"].items()),
        "",
    ]
    lines += _table(
        ["own time by category", "µs/call", "share"],
        [[c["category"], _num(c["us_per_call"]), f"{c['share']:.0%}"] for c in profile["categories"]],
        {1, 2},
    )
    lines.append("")
    lines += _table(
        ["top functions by own time", "calls/call", "µs/call", "share"],
        [[f["function"], _num(f["calls_per_call"]), _num(f["self_us_per_call"]), f"{f['share']:.0%}"]
         for f in profile["top_self"]],
        {1, 2, 3},
    )  # fmt: skip
    lines.append("")
    lines += _table(
        ["pipeline steps and SQL call sites (cumulative)", "calls/call", "µs/call", "share"],
        [[f["step"], _num(f["calls_per_call"]), _num(f["cum_us_per_call"]), f"{f['share']:.0%}"]
         for f in profile["steps"]],
        {1, 2, 3},
    )  # fmt: skip
    return "\n".join(lines)


def as_json(results: Results, machine: dict[str, Any], command: str, settings: Any) -> dict[str, Any]:
    def clean(value: Any) -> Any:
        if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
            return None
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(v) for v in value]
        return value

    return clean({
        "command": command,
        "machine": machine,
        "settings": {k: v for k, v in vars(settings).items() if k != "postgres_url"},
        "rows": [r.as_dict() for r in results.rows],
        "contention": results.contention,
        "ratios": [vars(r) for r in results.ratios],
        "violations": results.violations,
        "notes": results.notes,
        "profile": results.profile,
    })  # fmt: skip
