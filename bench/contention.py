"""Contention: P OS processes race over the same keys on one store.

P = 2, 4, 8 worker processes (``multiprocessing`` spawn, started once and reused; a fresh store
per run) each call ``refund(payment_id=k<j>)`` for the same keys j = 0..K-1 in the same order, so
the processes collide on every key. Each process counts the executions its function body actually
performed. The run reports the wall time (first start to last finish, read from the
system-wide monotonic clock), executions per key — exactly 1 is the promise, anything else is a
VIOLATION — the refusals (``DuplicateEffect``: committed / in_progress) and any other error.
"""

from __future__ import annotations

import queue
import traceback
from collections import Counter
from typing import Any

from .common import AGENT, ALLOWED_AMOUNT, Results, Settings, fresh_dir
from .pg import Postgres
from .stores import open_store, reopen, usable_stores

_TIMEOUT = 300.0  # seconds a run may take before it is called failed


def _worker(index: int, commands: Any, replies: Any) -> None:
    """One contending process: wait for a task, open the store, report ready, race on 'go'."""
    import time

    import ctrlrun
    from ctrlrun import Control, Policy

    from .common import ACTION, EFFECT, REFUND_POLICY

    replies.put(("started", index, None))
    while True:
        task = commands.get()
        if task is None:
            return
        store = None
        try:
            store = reopen(task["spec"])
            control = Control(Policy.from_yaml(REFUND_POLICY, source="bench"), store)
            executed: list[str] = []

            # The executions are counted by the body itself. (Not through a parameter: a protected
            # function receives fresh canonical copies of its arguments.)
            def refund(payment_id: str, amount: int) -> dict:
                executed.append(payment_id)  # noqa: B023 - called only within this task
                return {"id": "re_" + payment_id, "amount": amount}

            protected = ctrlrun.protect(ACTION, effect=EFFECT, control=control)(refund)
            store.get_effect("bench:warm-up")  # open this process's connection
            replies.put(("ready", index, None))
            if commands.get() != "go":
                raise RuntimeError("expected 'go'")
            refused: Counter[str] = Counter()
            errors: list[str] = []
            tx0 = store.transactions
            with ctrlrun.context(agent=f"{AGENT}-{index}"):
                t0 = time.perf_counter_ns()
                for j in range(task["keys"]):
                    try:
                        protected(payment_id=f"k{j}", amount=ALLOWED_AMOUNT)
                    except ctrlrun.DuplicateEffect as exc:
                        refused[str(exc.state)] += 1
                    except ctrlrun.AmbiguousEffect:
                        refused["ambiguous"] += 1
                    except Exception as exc:  # reported, never hidden
                        errors.append(f"{type(exc).__name__}: {exc}")
                t1 = time.perf_counter_ns()
            replies.put(("done", index, {
                "t0": t0, "t1": t1, "executed": executed, "refused": dict(refused),
                "errors": errors, "tx": store.transactions - tx0,
            }))  # fmt: skip
        except BaseException:
            replies.put(("failed", index, traceback.format_exc(limit=3)))
        finally:
            if store is not None:
                try:
                    store.close()
                except Exception:
                    pass


class Pool:
    """``size`` spawned workers, each with its own command queue and one shared reply queue."""

    def __init__(self, size: int) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self.replies = ctx.Queue()
        self.commands = [ctx.Queue() for _ in range(size)]
        self.procs = [
            ctx.Process(target=_worker, args=(i, self.commands[i], self.replies), daemon=True)
            for i in range(size)
        ]
        for proc in self.procs:
            proc.start()
        for _ in range(size):
            self._get()  # "started": every import done before any timing

    def _get(self) -> tuple[str, int, Any]:
        while True:
            try:
                return self.replies.get(timeout=_TIMEOUT)
            except queue.Empty:
                dead = [i for i, p in enumerate(self.procs) if not p.is_alive()]
                raise RuntimeError(f"no reply from the workers in {_TIMEOUT:.0f} s (dead: {dead})")

    def race(self, procs: int, spec: dict[str, Any], keys: int) -> tuple[dict[int, Any], dict[int, str]]:
        for i in range(procs):
            self.commands[i].put({"spec": spec, "keys": keys})
        ready, failed, done = [], {}, {}
        while len(ready) + len(failed) < procs:
            kind, index, payload = self._get()
            if kind == "ready":
                ready.append(index)
            else:
                failed[index] = str(payload)
        for i in ready:
            self.commands[i].put("go")
        while len(done) < len(ready):
            kind, index, payload = self._get()
            if kind == "done":
                done[index] = payload
            else:
                failed[index] = str(payload)
                ready.remove(index)
        return done, failed

    def close(self) -> None:
        for q in self.commands:
            q.put(None)
        for proc in self.procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)


def run(settings: Settings, pg: Postgres, results: Results) -> None:
    kinds = usable_stores(settings, pg, results, shared=True)
    if not kinds:
        results.note("contention: no store shared between processes was selected")
        return
    keys = settings.contention_keys
    print(
        f"- contention: P = {', '.join(map(str, settings.contention_procs))} processes on the same "
        f"{keys} keys ({', '.join(kinds)}); starting {max(settings.contention_procs)} workers",
        flush=True,
    )
    pool = Pool(max(settings.contention_procs))
    try:
        for kind in kinds:
            for procs in settings.contention_procs:
                with fresh_dir(settings, f"contention-{kind}-{procs}") as directory:
                    opened = open_store(kind, directory, pg, raw=False)  # created and migrated here
                    spec = opened.spec
                    opened.close()
                    done, failed = pool.race(procs, spec, keys)
                    check = reopen(spec)
                    try:
                        stored = Counter(str(r.state) for r in check.list_effects())
                    finally:
                        check.close()
                results.contention.append(_summarize(results, kind, procs, keys, done, failed, stored))
                line = results.contention[-1]
                print(
                    f"    {kind} P={procs}: {line['wall_s']:.2f} s, executions per key "
                    f"{line['exec_per_key']}, errors {line['errors']}",
                    flush=True,
                )
    finally:
        pool.close()


def _summarize(results: Results, kind: str, procs: int, keys: int, done: dict[int, Any],
               failed: dict[int, str], stored: Counter[str]) -> dict[str, Any]:  # fmt: skip
    per_key: Counter[str] = Counter({f"k{j}": 0 for j in range(keys)})
    refused: Counter[str] = Counter()
    errors: list[str] = []
    tx = 0
    for payload in done.values():
        per_key.update(payload["executed"])
        refused.update(payload["refused"])
        errors.extend(payload["errors"])
        tx += payload["tx"]
    for index, text in failed.items():
        errors.append(f"worker {index} failed: {text.strip().splitlines()[-1]}")
    counts = Counter(per_key.values())
    twice = sorted(k for k, n in per_key.items() if n > 1)
    never = sorted(k for k, n in per_key.items() if n == 0)
    if twice:
        results.violation(
            f"contention {kind} P={procs}: {len(twice)} key(s) executed more than once: "
            + ", ".join(f"{k}×{per_key[k]}" for k in twice[:10])
        )
    if never:
        results.violation(
            f"contention {kind} P={procs}: {len(never)} key(s) never executed "
            f"(errors: {len(errors)}): {', '.join(never[:10])}"
        )
    if stored.get("committed", 0) != keys or sum(stored.values()) != keys:
        results.violation(
            f"contention {kind} P={procs}: the store holds {dict(stored)} for {keys} keys, "
            f"not {keys} committed"
        )
    if errors:
        results.note(f"contention {kind} P={procs}: {len(errors)} error(s), first: {errors[0]}")
    if done:
        wall = (max(p["t1"] for p in done.values()) - min(p["t0"] for p in done.values())) / 1e9
    else:
        wall = float("nan")
    calls = procs * keys
    spread = "1" if set(counts) == {1} else ", ".join(f"{n}: {c} keys" for n, c in sorted(counts.items()))
    return {
        "store": kind,
        "procs": procs,
        "keys": keys,
        "wall_s": wall,
        "calls": calls,
        "calls_per_s": calls / wall if wall > 0 else None,
        "executed": sum(per_key.values()),
        "exec_per_key": spread,
        "violations": len(twice) + len(never),
        "refused": dict(refused),
        "errors": len(errors),
        "error_samples": errors[:3],
        "tx_per_call": tx / calls if calls else None,
        "stored_states": dict(stored),
    }
