"""Code that runs in child OS processes (imported by spawn, so it lives in a module)."""

from __future__ import annotations

import os
from pathlib import Path


def race_refund(directory: str, barrier, results) -> None:
    """One agent process: wait for the others, then try the same refund."""
    os.chdir(directory)
    import ctrlrun

    log = Path(directory) / "remote.log"

    @ctrlrun.protect("stripe.refund", effect="refund:{payment_id}")
    def refund(payment_id: str, amount: int) -> str:
        with open(log, "a", encoding="utf-8") as handle:
            handle.write(f"{os.getpid()} {payment_id}\n")
        return "ok"

    barrier.wait()
    try:
        with ctrlrun.context(agent=f"agent-{os.getpid()}"):
            outcome = refund(payment_id="txn_race", amount=1_000)
        results.put(("ran", outcome))
    except ctrlrun.DuplicateEffect as exc:
        results.put(("duplicate", exc.state))
    except Exception as exc:  # reported to the parent, which fails the test
        results.put(("error", f"{type(exc).__name__}: {exc}"))
