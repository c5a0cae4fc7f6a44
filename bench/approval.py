"""The approval path: request → grant → execute, one new effect key per cycle.

A cycle is three steps, each timed:

1. ``refund(payment_id=<new>, amount=200000)`` → the policy says approve → the request is stored
   and ``ApprovalRequired`` is raised;
2. the human's grant: ``store.grant_approval(request_id, "bench-approver")`` (what
   ``ctrlrun approve`` does);
3. the same call inside ``with_approval(request_id)`` → the approval is consumed, the key
   reserved, the function runs, the receipt is written.
"""

from __future__ import annotations

from .common import (
    AGENT,
    APPROVAL_AMOUNT,
    Results,
    Row,
    Series,
    Settings,
    cpu_ns,
    fresh_dir,
    perf_ns,
)
from .pg import Postgres
from .stores import open_store, protected_refund, usable_stores


def run(settings: Settings, pg: Postgres, results: Results) -> None:
    for kind in usable_stores(settings, pg, results):
        _measure(kind, settings, pg, results)


def _measure(kind: str, settings: Settings, pg: Postgres, results: Results) -> None:
    import ctrlrun

    cycles = settings.approval_cycles
    print(f"- approval path, {kind}: {cycles} cycles", flush=True)
    with fresh_dir(settings, f"approval-{kind}") as directory:
        opened = open_store(kind, directory, pg, raw=False)
        try:
            store = opened.store
            _, protected = protected_refund(store)
            steps = {name: Series() for name in ("request", "grant", "execute", "cycle")}
            ran = {"n": 0}

            def cycle(i: int, timed: bool) -> None:
                key = f"p{i}"
                c0 = cpu_ns()
                t0 = perf_ns()
                try:
                    protected(payment_id=key, amount=APPROVAL_AMOUNT)
                except ctrlrun.ApprovalRequired as required:
                    request_id = required.request_id
                else:
                    raise AssertionError("an approve decision ran without an approval")
                t1 = perf_ns()
                store.grant_approval(request_id, "bench-approver")
                t2 = perf_ns()
                with ctrlrun.with_approval(request_id):
                    protected(payment_id=key, amount=APPROVAL_AMOUNT)
                t3 = perf_ns()
                c1 = cpu_ns()
                ran["n"] += 1
                if timed:
                    for name, ns in (("request", t1 - t0), ("grant", t2 - t1),
                                     ("execute", t3 - t2), ("cycle", t3 - t0)):  # fmt: skip
                        steps[name].samples.append(ns)
                        steps[name].wall_ns += ns
                    steps["cycle"].cpu_ns += c1 - c0

            with ctrlrun.context(agent=AGENT):
                for i in range(settings.warmup):
                    cycle(i, False)
                tx0 = store.transactions
                for i in range(settings.warmup, settings.warmup + cycles):
                    cycle(i, True)
                tx = (store.transactions - tx0) / cycles
            if ran["n"] != settings.warmup + cycles:
                results.violation(f"approval path on {kind}: {ran['n']} cycles completed")
            phases = " / ".join(
                f"{name} {steps[name].p(50) / 1000:.2f}" for name in ("request", "grant", "execute")
            )
            results.rows.append(
                Row("approval", kind, "request→grant→execute", steps["cycle"], tx,
                    f"p50 ms: {phases}",
                    {"phases_p50_us": {n: steps[n].p(50) for n in ("request", "grant", "execute")}})
            )  # fmt: skip
        finally:
            opened.close()
