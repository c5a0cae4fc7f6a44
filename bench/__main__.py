"""``python -m bench``: run the benchmarks, print the table, optionally write JSON and the docs."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from . import REPO  # noqa: F401  (makes ctrlrun importable from a clone)

BENCHMARKS = ("policy", "allow", "approval", "contention", "where", "ab", "profile")


def _parser() -> argparse.ArgumentParser:
    from .pg import URL_VARIABLES
    from .stores import STORES

    p = argparse.ArgumentParser(
        prog="python -m bench",
        description="ctrlrun benchmarks: the protected hot path next to the raw cost of storage.",
    )
    p.add_argument("--quick", action="store_true",
                   help="small sizes: 30 calls per variant, 16 contention keys, 2 rounds, 100 "
                        "profiled calls (about 30 s on 2 cores; the full run about 1.5 min)")  # fmt: skip
    p.add_argument("--calls", type=int, metavar="N",
                   help="timed calls per variant on the allow path (default 300, quick 30); the "
                        "approval path runs N/5 cycles (at least 5), the policy micro-benchmarks 50·N calls")  # fmt: skip
    p.add_argument("--only", action="append", metavar="NAME",
                   help=f"run only these benchmarks (repeat or comma-separate): {', '.join(BENCHMARKS)}")
    p.add_argument("--stores", metavar="LIST", default=",".join(STORES),
                   help=f"stores to measure (default: all of {', '.join(STORES)})")
    p.add_argument("--keys", type=int, metavar="K",
                   help="keys in the contention benchmark (default 200, quick 16)")
    p.add_argument("--procs", metavar="LIST", default="2,4,8",
                   help="process counts in the contention benchmark (default 2,4,8)")
    p.add_argument("--postgres-url", metavar="URL", default=None,
                   help="Postgres server to measure (default: $" + " or $".join(URL_VARIABLES)
                        + "); a fresh schema per benchmark, dropped afterwards")  # fmt: skip
    p.add_argument("--reference", metavar="PYTHON", default=None,
                   help="another interpreter whose ctrlrun to measure against ours, A/B in one run "
                        "(default: $CTRLRUN_BENCH_REFERENCE; without one the A/B rows are skipped)")  # fmt: skip
    p.add_argument("--tmpdir", metavar="DIR",
                   help="where the temporary SQLite directories go (default: the system's)")
    p.add_argument("--json", metavar="PATH", help="also write every figure as JSON to PATH")
    p.add_argument("--write-docs", action="store_true",
                   help="rewrite the generated sections of docs/performance.md with this run")
    return p


def _command(argv: list[str]) -> str:
    from .pg import redact

    shown = []
    for i, arg in enumerate(argv):
        if argv[i - 1:i] == ["--postgres-url"] and ":" in arg.split("@", 1)[0].split("//")[-1]:
            arg = redact(arg)  # a password on the command line is not written anywhere
        elif arg.startswith("--postgres-url="):
            arg = "--postgres-url=" + redact(arg.split("=", 1)[1])
        shown.append(shlex.quote(arg))
    return " ".join(["python -m bench", *shown])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)

    from . import ab, allow, approval, contention, docs, hotpath, policy, replay, report
    from .common import Results, Settings, load_average, machine
    from .pg import Postgres, default_url
    from .stores import STORES

    only: list[str] = []
    for item in args.only or []:
        only += [x.strip() for x in item.split(",") if x.strip()]
    unknown = [x for x in only if x not in BENCHMARKS]
    if unknown:
        print(f"unknown benchmark(s) {unknown}; choose from {', '.join(BENCHMARKS)}", file=sys.stderr)
        return 64
    stores = tuple(x.strip() for x in args.stores.split(",") if x.strip())
    if any(s not in STORES for s in stores):
        print(f"--stores takes {', '.join(STORES)}", file=sys.stderr)
        return 64
    try:
        procs = tuple(int(x) for x in args.procs.split(","))
    except ValueError:
        print("--procs takes a comma-separated list of integers", file=sys.stderr)
        return 64
    if args.calls is not None and args.calls < 2:
        print("--calls must be at least 2", file=sys.stderr)
        return 64
    selected = only or list(BENCHMARKS)

    settings = Settings(
        quick=args.quick,
        calls=args.calls or (30 if args.quick else 300),
        rounds=2 if args.quick else 5,
        warmup=5 if args.quick else 20,
        contention_keys=args.keys or (16 if args.quick else 200),
        contention_procs=procs,
        stores=stores,
        tmpdir=args.tmpdir,
        postgres_url=args.postgres_url or default_url(),
        reference=ab.reference_python(args.reference),
    )
    settings.rounds = max(1, min(settings.rounds, settings.calls))
    command = _command(argv)
    started = time.perf_counter()
    info = machine(settings)
    results = Results()
    print(f"{command}\n{info['cpu_count']} CPUs ({info['cpu']}), Python {info['python']}, "
          f"SQLite {info['sqlite']}, load average {info['load_average_start']}", flush=True)  # fmt: skip

    needs_store = any(b in selected for b in ("allow", "approval", "contention", "where"))
    pg = Postgres(settings.postgres_url if "postgres" in stores and needs_store else None)
    if "postgres" in stores and needs_store:
        if pg.available:
            s = getattr(pg, "settings", {})
            info["postgres"] = (
                f"PostgreSQL {pg.server_version} at {pg.target} (fsync {s.get('fsync', '?')}, "
                f"synchronous_commit {s.get('synchronous_commit', '?')}, "
                f"wal_sync_method {s.get('wal_sync_method', '?')})"
            )
            print(f"Postgres: {info['postgres']}", flush=True)
        else:
            results.note(f"Postgres benchmarks skipped: {pg.unavailable}")
    if settings.quick and "contention" in selected:
        results.note(f"quick run: contention uses {settings.contention_keys} keys, not 200")

    runners = {
        "policy": policy.run,
        "allow": allow.run,
        "approval": approval.run,
        "contention": contention.run,
        "where": replay.run,
        "ab": ab.run,
        "profile": hotpath.run,
    }
    try:
        for name in BENCHMARKS:
            if name in selected:
                t0 = time.perf_counter()
                runners[name](settings, pg, results)
                print(f"  ({name}: {time.perf_counter() - t0:.1f} s)", flush=True)
    finally:
        pg.drop_all()
    info["load_average_end"] = load_average()
    if results.reference:
        r = results.reference
        info["reference"] = f"ctrlrun {r['version']} at `{r['file']}` (`{r['python']}`)"
    report.compute_ratios(results)
    print("\n" + report.render(results))
    elapsed = time.perf_counter() - started
    print(f"\n{len(results.rows)} rows in {elapsed:.1f} s; load average at end {info['load_average_end']}")

    if args.json:
        document = report.as_json(results, info, command, settings)
        document["elapsed_s"] = elapsed
        Path(args.json).write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n")
        print(f"wrote {args.json}")
    if args.write_docs:
        docs.write(results, info, command, quick=settings.quick, elapsed=elapsed)
    if results.violations:
        print(f"\n!!! {len(results.violations)} VIOLATION(S): see above", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
