"""OS processes charging one grant's budget at once (one SQLite file, one Postgres schema): the
committed charges never pass the limit, and every refusal is ``BudgetExhausted``.

Each process opens its own store (its own engine and connections), as separate hosts do, and
races its calls on keys of its own, so only the budget is shared.
"""

from __future__ import annotations

import multiprocessing
from typing import Any

import pytest

from ctrlrun.authority.ledger import Charge
from ctrlrun.effects.records import EffectState
from ctrlrun.errors import BudgetExhausted, CTRLRunError

from .conftest import create_pg_schema, drop_pg_schema, postgres_url
from .test_store_processes import Site, open_site

pytestmark = pytest.mark.slow

PROCESSES = 8
CALLS_EACH = 6
AMOUNT = 7
LIMIT = 100  # fits 14 charges of 7: fewer than the 48 calls
_barrier: Any = None


def _init(barrier) -> None:
    global _barrier
    _barrier = barrier


def _charge_many(site: Site, worker: int, fail_every: int) -> list[tuple[str, object]]:
    """Start ``CALLS_EACH`` calls charging the shared budget; commit each one that starts, or
    (every ``fail_every``-th) fail it, which releases its charge."""
    store = open_site(site)
    charges = [Charge("head-of-support", "amount", AMOUNT, LIMIT, 86400),
               Charge("head-of-support", "count", 1, LIMIT, 3600)]  # fmt: skip
    outcomes: list[tuple[str, object]] = []
    try:
        assert _barrier is not None
        _barrier.wait(timeout=60)
        for n in range(CALLS_EACH):
            key, action_id = f"refund:{worker}-{n}", f"act_{worker}_{n}"
            try:
                store.start_attempt(
                    action_id=action_id, effect_key=key, charges=charges,
                    events=lambda a, r: [],
                )  # fmt: skip
            except BudgetExhausted as exc:
                outcomes.append(("exhausted", (exc.grant_id, exc.metric, exc.window)))
                continue
            except CTRLRunError as exc:
                outcomes.append(("error", repr(exc)))
                continue
            outcome = EffectState.FAILED if fail_every and n % fail_every == 0 else EffectState.COMMITTED
            store.finish_attempt(effect_key=key, action_id=action_id, outcome=outcome)
            outcomes.append((outcome.value, key))
    finally:
        store.close()
    return outcomes


@pytest.fixture(scope="module")
def pool():
    spawn = multiprocessing.get_context("spawn")
    workers = spawn.Pool(PROCESSES, initializer=_init, initargs=(spawn.Barrier(PROCESSES),))
    yield workers
    workers.terminate()
    workers.join()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def site(request, tmp_path):
    if request.param == "sqlite":
        yield ("sqlite", str(tmp_path / "state.db"))
        return
    url = postgres_url()
    schema = create_pg_schema(url)
    yield ("postgres", url, schema)
    drop_pg_schema(url, schema)


def _race(pool, site: Site, fail_every: int) -> tuple[list[tuple[str, object]], Any]:
    open_site(site).close()  # migrated up front
    pending = [pool.apply_async(_charge_many, (site, i, fail_every)) for i in range(PROCESSES)]
    outcomes = [o for p in pending for o in p.get(timeout=180)]
    assert [o for o in outcomes if o[0] == "error"] == []
    assert len(outcomes) == PROCESSES * CALLS_EACH
    # every refusal is the budget's, naming the first charge that did not fit
    assert {o[1] for o in outcomes if o[0] == "exhausted"} <= {
        ("head-of-support", "amount", 86400)
    }
    return outcomes, open_site(site)


def _held(store: Any, metric: str) -> int:
    rows = store.consumptions(grant_id="head-of-support", metric=metric)
    return sum(c.amount for c in rows if c.released_at is None)


def test_racing_processes_never_pass_the_limit(pool, site):
    outcomes, store = _race(pool, site, fail_every=0)
    try:
        committed = [o[1] for o in outcomes if o[0] == "committed"]
        assert len(committed) == LIMIT // AMOUNT  # as many as fit, not one more
        assert _held(store, "amount") == AMOUNT * len(committed) <= LIMIT
        assert _held(store, "count") == len(committed)
        charged = {c.effect_key for c in store.consumptions()}
        assert charged == set(committed)  # a refused call left no row
        assert {r.effect_key for r in store.list_effects()} == set(committed)
    finally:
        store.close()


def test_racing_processes_with_releases_never_pass_the_limit(pool, site):
    outcomes, store = _race(pool, site, fail_every=2)
    try:
        committed = [o[1] for o in outcomes if o[0] == "committed"]
        failed = [o[1] for o in outcomes if o[0] == "failed"]
        assert _held(store, "amount") == AMOUNT * len(committed) <= LIMIT
        rows = store.consumptions(metric="amount")
        assert sorted(c.effect_key for c in rows) == sorted(committed + failed)
        assert all((c.released_at is not None) == (c.effect_key in failed) for c in rows)
        assert committed and failed
    finally:
        store.close()
