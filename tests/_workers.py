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


CEILING_POLICY = """\
schema: ctrlrun.policy/v5
actions:
  job.run:
    effect: "job:{job_id}"
    max_attempts: 2
    rules:
      - { when: { size_lte: 10 }, decision: allow }
      - { decision: approve }
"""


def ceiling_worker(directory: str, barrier: Any, results: Any, store_url: str | None = None) -> None:
    os.chdir(directory)
    import ctrlrun

    if store_url is None:
        store = ctrlrun.SQLiteStateStore(Path(directory) / "state.db")
    else:
        from ctrlrun.store import open_store_url

        store = open_store_url(store_url)
    control = ctrlrun.Control(ctrlrun.Policy.from_yaml(CEILING_POLICY), store)

    @ctrlrun.protect("job.run", effect="job:{job_id}", control=control)
    def run(job_id: str, size: int) -> str:
        with open(Path(directory) / "dispatched.log", "a", encoding="utf-8") as log:
            log.write(f"{os.getpid()}\n")
        raise ctrlrun.NotExecuted("not sent")

    barrier.wait()
    seen = []
    with ctrlrun.context(agent=f"worker-{os.getpid()}"):
        for _ in range(20_000):  # a refusal while another attempt holds the key is retried
            try:
                run(job_id="race", size=1)
            except ctrlrun.NotExecuted:
                seen.append("failed")
            except ctrlrun.DuplicateEffect as exc:
                seen.append(exc.state)
            except ctrlrun.ActionDenied as exc:
                seen.append(exc.reason)
                break
            except Exception as exc:
                seen.append(f"error {type(exc).__name__}: {exc}")
                break
    store.close()
    results.put(seen)
