"""Instructions per allowed call, counted by valgrind: ``python bench/instructions.py [STORE...]``.

A clock on a shared machine moves by 2× between minutes; an instruction count does not. Each
store's protected refund (``bench/ab_call.py``'s policy and function, public API only) runs
``--few`` and ``--many`` calls in a fresh interpreter under ``valgrind --tool=cachegrind``; the
difference of the two totals over the difference of the calls is one call's instructions, with
start-up and imports cancelled out. Counts repeat to about ±1% (ids and hash seeds differ per
run). It counts user-space instructions only: system calls (the WAL's writes, file locks) cost
time that does not show here. ``--src DIR`` measures another checkout's ``src/``.
Run by hand; it needs ``valgrind`` and takes about a minute per store.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
STORES = ("memory", "sqlite-normal", "sqlite-full")
LOOP = """\
import sys, tempfile
sys.path.insert(0, {bench!r})
import ab_call, ctrlrun
calls, kind = int(sys.argv[1]), sys.argv[2]
store = ab_call._store(kind, tempfile.mkdtemp())
control = ctrlrun.Control(ctrlrun.Policy.from_yaml(ab_call.POLICY, source="bench"), store)
protected = ctrlrun.protect("bench.refund", effect="refund:{{payment_id}}", control=control)(ab_call.refund)
with ctrlrun.context(agent="bench-agent"):
    for i in range(calls):
        protected(payment_id=f"p{{i}}", amount=12_000)
"""


def count(src: Path, store: str, calls: int) -> int:
    """Instructions valgrind counted for a whole interpreter making ``calls`` protected calls."""
    env = dict(os.environ, PYTHONPATH=str(src))
    command = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
               sys.executable, "-c", LOOP.format(bench=str(HERE)), str(calls), store]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    found = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
    if found is None:
        raise SystemExit(f"valgrind printed no instruction count:\n{done.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stores", nargs="*", choices=STORES, default=["memory", "sqlite-normal"])
    parser.add_argument("--src", type=Path, default=HERE.parent / "src")
    parser.add_argument("--few", type=int, default=500)
    parser.add_argument("--many", type=int, default=2500)
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed: apt-get install -y valgrind")
    for store in args.stores:
        few, many = count(args.src, store, args.few), count(args.src, store, args.many)
        per_call = (many - few) / (args.many - args.few)
        print(f"{store:14} {per_call:>12,.0f} instructions per allowed call ({args.src})")


if __name__ == "__main__":
    main()
