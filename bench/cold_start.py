"""A short-lived agent process's cost: ``import ctrlrun`` to the first protected call returned, in a
fresh interpreter, on the default SQLite store (fresh, then existing): ``python bench/cold_start.py``.

Each sample is its own interpreter running the same script (the policy file and the decorator
only, public API), so imports, the policy load, the store's open and migration check, and the
first call's statements are all counted. ``--reference PYTHON`` runs the same script under
another interpreter (a virtualenv holding ctrlrun 0.12.2), alternating with ours. ``--imports``
prints the slowest imports of one run (``python -X importtime``). Run by hand: wall time moves
with the machine's load, so compare runs made together.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from ab_call import POLICY  # noqa: E402  (the A/B's policy: the same action and rules)

SCRIPT = """\
import sys, time
started = time.perf_counter()
import ctrlrun

@ctrlrun.protect("bench.refund")
def refund(payment_id, amount):
    return "ok"

with ctrlrun.context(agent="bench-agent"):
    refund(payment_id=sys.argv[1], amount=12000)
print((time.perf_counter() - started) * 1000)
"""


def _sample(python: str, directory: Path, key: str, env: dict[str, str]) -> float:
    done = subprocess.run([python, "first_call.py", key], cwd=directory, env=env, capture_output=True,
                          text=True, check=True, timeout=120)  # fmt: skip
    return float(done.stdout.strip().splitlines()[-1])


def _project(python: str) -> tuple[Path, dict[str, str]]:
    directory = Path(tempfile.mkdtemp(prefix="ctrlrun-cold-"))
    (directory / "ctrlrun.yaml").write_text(POLICY, encoding="utf-8")
    (directory / "first_call.py").write_text(SCRIPT, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTRLRUN_")}
    if python == sys.executable:  # ours: this checkout's src first
        env["PYTHONPATH"] = str(HERE.parent / "src")
    else:
        env.pop("PYTHONPATH", None)
    return directory, env


def measure(python: str, rounds: int) -> dict[str, list[float]]:
    """``rounds`` samples on a fresh store (a new project each) and on an existing one."""
    fresh, existing = [], []
    directory, env = _project(python)
    _sample(python, directory, "warm", env)  # the existing store's first run, and the OS's caches
    for n in range(rounds):
        existing.append(_sample(python, directory, f"e{n}", env))
        other, other_env = _project(python)
        fresh.append(_sample(python, other, "f", other_env))
        shutil.rmtree(other, ignore_errors=True)
    shutil.rmtree(directory, ignore_errors=True)
    return {"fresh": fresh, "existing": existing}


def _line(name: str, samples: dict[str, list[float]]) -> str:
    cells = [f"{kind} p50 {statistics.median(v):6.1f} ms (min {min(v):.1f}, max {max(v):.1f})"
             for kind, v in samples.items()]  # fmt: skip
    return f"{name:10}  " + "   ".join(cells)


def imports(python: str) -> list[tuple[int, str]]:
    """The slowest imports (cumulative µs, module) of one first call on an existing store."""
    directory, env = _project(python)
    _sample(python, directory, "warm", env)
    done = subprocess.run([python, "-X", "importtime", "first_call.py", "x"], cwd=directory, env=env,
                          capture_output=True, text=True, check=True, timeout=120)  # fmt: skip
    shutil.rmtree(directory, ignore_errors=True)
    rows = []
    for line in done.stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            rows.append((int(parts[1]), parts[2].rstrip()))
    return sorted(rows, reverse=True)[:25]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--reference", metavar="PYTHON", help="another interpreter to run alternately")
    parser.add_argument("--imports", action="store_true", help="print the slowest imports of ours")
    args = parser.parse_args()
    print(_line("ours", measure(sys.executable, args.rounds)))
    if args.reference:
        print(_line("reference", measure(args.reference, args.rounds)))
    if args.imports:
        for cumulative, module in imports(sys.executable):
            print(f"{cumulative / 1000:8.1f} ms  {module}")


if __name__ == "__main__":
    main()
