"""The allow path: a protected call with a new effect key each time, next to its baselines.

Per store, three variants run interleaved in the same process:

- ``protected``   — ``@protect``ed ``refund(payment_id=<new>, amount=12000)`` (policy: allow);
- ``async protected`` — the same as an ``async def``, awaited in one running event loop (store
  work in worker threads);
- ``protected + JSONL sink`` (SQLite) — the same with the evidence copy the default wiring adds
  (``ctrlrun.yaml`` next to a SQLite store: ``.ctrlrun/evidence/*.jsonl``);
- ``protected, prepared=True`` (Postgres) — the same on a second schema whose store runs its
  writes as server-side prepared statements (the opt-in for direct connections);
- ``unprotected`` — the same function called directly;
- ``raw 2 commits`` — the minimum durable work on the same kind of database (baselines.py).

The store's ``transactions`` counter is read around the protected batches only.
"""

from __future__ import annotations

import os
from contextlib import closing

from .common import (
    AGENT,
    ALLOWED_AMOUNT,
    Results,
    Row,
    Settings,
    fresh_dir,
    interleave,
    refund,
)
from .pg import Postgres

PREPARED = "protected, prepared=True"
from .stores import open_store, protected_refund, protected_refund_async, protected_refund_authority, usable_stores


def run(settings: Settings, pg: Postgres, results: Results) -> None:
    for kind in usable_stores(settings, pg, results):
        _measure(kind, settings, pg, results)


def _measure(kind: str, settings: Settings, pg: Postgres, results: Results) -> None:
    import asyncio

    import ctrlrun

    print(f"- allow path, {kind}: {settings.calls} calls per variant", flush=True)
    loop = asyncio.new_event_loop()  # one running loop for every async call
    with fresh_dir(settings, f"allow-{kind}") as directory, closing(loop):
        opened = open_store(kind, directory, pg)
        prepared_store = None
        try:
            store = opened.store
            control, protected = protected_refund(store)
            aprotected = protected_refund_async(control)
            authorized = protected_refund_authority(store)
            executed = {"n": 0}
            sinked = None
            if kind == "postgres":
                prepared_store = pg.store(pg.new_schema(), prepared=True)
                prepared = protected_refund(prepared_store)[1]
            if kind.startswith("sqlite-"):
                from ctrlrun import JSONLEventSink

                sink = JSONLEventSink(os.path.join(directory, "evidence"))
                sinked = protected_refund(store, sinks=(sink,))[1]

            def call_protected(i: int) -> None:
                protected(payment_id=f"p{i}", amount=ALLOWED_AMOUNT)
                executed["n"] += 1

            def call_sinked(i: int) -> None:
                assert sinked is not None
                sinked(payment_id=f"j{i}", amount=ALLOWED_AMOUNT)

            def call_prepared(i: int) -> None:
                prepared(payment_id=f"p{i}", amount=ALLOWED_AMOUNT)
                executed["n"] += 1

            def call_authorized(i: int) -> None:
                authorized(payment_id=f"g{i}", amount=ALLOWED_AMOUNT)

            def call_async(i: int) -> None:
                loop.run_until_complete(aprotected(payment_id=f"a{i}", amount=ALLOWED_AMOUNT))

            def call_unprotected(i: int) -> None:
                refund(payment_id=f"p{i}", amount=ALLOWED_AMOUNT)

            variants = [
                ("protected", call_protected),
                ("protected + authority", call_authorized),
                ("async protected", call_async),
                ("unprotected", call_unprotected),
            ]
            if sinked is not None:
                variants.insert(1, ("protected + JSONL sink", call_sinked))
            if prepared_store is not None:
                variants.insert(1, (PREPARED, call_prepared))
            if opened.raw is not None:
                variants.append(("raw 2 commits", opened.raw.two_commits))

            counted: dict[str, list[int]] = {}  # variant: [transactions, calls]
            mark = {"tx": 0}

            def counting(name: str) -> object:
                return prepared_store if name == PREPARED else store

            def before(name: str) -> None:
                mark["tx"] = counting(name).transactions  # type: ignore[attr-defined]

            def after(name: str, n: int) -> None:
                if name.startswith("protected"):
                    seen = counted.setdefault(name, [0, 0])
                    seen[0] += counting(name).transactions - mark["tx"]  # type: ignore[attr-defined]
                    seen[1] += n

            with ctrlrun.context(agent=AGENT):
                series = interleave(
                    variants,
                    calls=settings.calls,
                    rounds=settings.rounds,
                    warmup=settings.warmup,
                    before=before,
                    after=after,
                )
            expected = (settings.calls + settings.warmup) * (2 if prepared_store is not None else 1)
            if executed["n"] != expected:
                results.violation(
                    f"allow path on {kind}: the function ran {executed['n']} times for "
                    f"{expected} allowed calls"
                )
            def tx(name: str) -> float | None:
                transactions, calls = counted.get(name, (0, 0))
                return transactions / calls if calls else None

            results.rows.append(Row("allow", kind, "protected", series["protected"], tx("protected")))
            if prepared_store is not None:
                results.rows.append(Row("allow", kind, PREPARED, series[PREPARED], tx(PREPARED),
                                        "the opt-in for direct connections: writes as server-side prepared statements"))  # fmt: skip
            if sinked is not None:
                results.rows.append(Row("allow", kind, "protected + JSONL sink",
                                        series["protected + JSONL sink"], tx("protected + JSONL sink"),
                                        "the default wiring's evidence copy"))  # fmt: skip
            results.rows.append(Row("allow", kind, "protected + authority", series["protected + authority"],
                                    tx("protected + authority"),
                                    "one grant with a budget: reads the delegations, charges with the reservation"))  # fmt: skip
            results.rows.append(Row("allow", kind, "async protected", series["async protected"]))
            results.rows.append(Row("allow", kind, "unprotected", series["unprotected"]))
            if opened.raw is not None:
                note = ""
                if kind.startswith("sqlite-"):
                    note = f"synchronous={opened.raw.synchronous} (0 OFF,1 NORMAL,2 FULL), WAL"
                results.rows.append(
                    Row("allow", kind, "raw 2 commits", series["raw 2 commits"], 2.0, note)
                )
        finally:
            if prepared_store is not None:
                prepared_store.close()
            opened.close()
