"""Chain verification on SQLite: throughput (receipts/s) and the CLI's peak RSS at two sizes.

    PYTHONPATH=src python bench/verify.py [N ...]      (default: 1000 100000)

Each store is built fast: one real receipt through ``Control`` as the template, then ``N``
valid chained rows written straight into ``receipts`` (each placed and hashed by
``Receipt.chained``, as ``put_receipt`` would) and the head set to the last.
"""

from __future__ import annotations

import json
import os
import resource
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ctrlrun import Control, Policy, SQLiteStateStore, context, protect
from ctrlrun.receipt import GENESIS_HASH, Receipt, verify_chain
from ctrlrun.store import codec

POLICY = "schema: ctrlrun.policy/v2\nactions:\n  customer.read: { decision: allow }\n"
RSS_WRAPPER = (
    "import resource, runpy, sys; sys.argv = ['ctrlrun', *sys.argv[1:]]\n"
    "try:\n    runpy.run_module('ctrlrun', run_name='__main__')\n"
    "except SystemExit as end:\n    code = end.code\n"
    "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\n"
)


def build(path: Path, count: int) -> None:
    store = SQLiteStateStore(path)
    control = Control(Policy.from_yaml(POLICY), store, sinks=())

    @protect("customer.read", control=control)
    def read(customer_id: str) -> str:
        return customer_id

    with context(agent="bench", user="u"):
        read("c0")
    (template,) = store.receipts()
    store.close()
    document = template.to_dict()
    db = sqlite3.connect(path)
    with db:
        db.execute("DELETE FROM receipts")
        prev = GENESIS_HASH
        rows = []
        for seq in range(1, count + 1):
            document.update(receipt_id=f"ctr_{seq:032x}", arguments={"customer_id": f"c{seq}"})
            placed = Receipt.from_dict(document).chained(seq, prev)
            rows.append(codec.receipt_row(placed, placed.to_dict()))
            prev = placed.hash
            if len(rows) == 10_000 or seq == count:
                db.executemany(f"INSERT INTO receipts VALUES ({', '.join('?' * 9)})", rows)
                rows.clear()
        db.execute("UPDATE receipt_chain SET seq = ?, hash = ?", (count, prev))
    db.close()  # the last connection: the WAL is checkpointed into the file


def throughput(path: Path) -> tuple[int, float]:
    store = SQLiteStateStore(path, migrate=False, read_only=True)
    try:
        best = float("inf")
        for _ in range(3):
            started = time.perf_counter()
            report = verify_chain(store)
            best = min(best, time.perf_counter() - started)
        assert report.ok, report.breaks[:3]
        return report.verified, report.verified / best
    finally:
        store.close()


def cli_rss_mb(path: Path) -> float:
    """Peak RSS of ``ctrlrun receipts --verify-chain`` in a process of its own (``/usr/bin/time -v``;
    else the child's own ``getrusage``, which on Linux also counts the forked parent's pages)."""
    command = [sys.executable, "-m", "ctrlrun", "receipts", "--verify-chain", "--store-url", f"sqlite://{path}"]
    if Path("/usr/bin/time").exists():
        ran = subprocess.run(["/usr/bin/time", "-v", *command], capture_output=True, text=True, check=True)
        (line,) = [x for x in ran.stderr.splitlines() if "Maximum resident set size" in x]
        return int(line.rsplit(":", 1)[1]) / 1024
    ran = subprocess.run([sys.executable, "-c", RSS_WRAPPER, *command[3:]], capture_output=True, text=True, check=True)
    return int(ran.stderr.strip().splitlines()[-1]) / 1024  # ru_maxrss is KiB on Linux


def main(sizes: list[int]) -> None:
    results = []
    with tempfile.TemporaryDirectory() as directory:
        for count in sizes:
            path = Path(directory) / f"chain-{count}.db"
            build(path, count)
            verified, rate = throughput(path)
            results.append({"receipts": verified, "receipts_per_s": round(rate), "cli_peak_rss_mb": round(cli_rss_mb(path), 1)})
            print(json.dumps(results[-1]))
    print(f"(this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB)")


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [1000, 100_000])
