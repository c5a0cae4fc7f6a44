"""The stores under test, each with its raw two-commit baseline on the same database."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .baselines import RawPostgres, RawSQLite
from .pg import Postgres

STORES = ("sqlite-full", "sqlite-normal", "memory", "postgres")
LABELS = {
    "sqlite-full": "SQLite FULL",
    "sqlite-normal": "SQLite NORMAL",
    "memory": "in-memory",
    "postgres": "Postgres",
}


@dataclass
class Opened:
    kind: str
    store: Any
    raw: RawSQLite | RawPostgres | None
    spec: dict[str, Any]  # how another process opens the same store (contention)

    def close(self) -> None:
        self.store.close()
        if self.raw is not None:
            self.raw.close()


def open_store(kind: str, directory: str, pg: Postgres, *, raw: bool = True) -> Opened:
    """A fresh store of ``kind`` (a new file in ``directory`` or a new Postgres schema) and,
    when ``raw``, its baseline on a sibling file / the same schema."""
    from ctrlrun import InMemoryStateStore, SQLiteStateStore

    if kind.startswith("sqlite-"):
        durability = kind.split("-", 1)[1]
        path = os.path.join(directory, "state.db")
        store = SQLiteStateStore(path, durability=durability)
        baseline = RawSQLite(os.path.join(directory, "raw.db"), durability.upper()) if raw else None
        return Opened(kind, store, baseline, {"kind": kind, "path": path, "durability": durability})
    if kind == "memory":
        return Opened(kind, InMemoryStateStore(), None, {"kind": kind})
    if kind == "postgres":
        schema = pg.new_schema()
        store = pg.store(schema)
        baseline = RawPostgres(pg.connect(), schema) if raw else None
        return Opened(kind, store, baseline, {"kind": kind, "url": pg.url, "schema": schema})
    raise ValueError(f"unknown store {kind!r}")


def reopen(spec: dict[str, Any]) -> Any:
    """Open the store ``spec`` names again (in another process)."""
    kind = spec["kind"]
    if kind.startswith("sqlite-"):
        from ctrlrun import SQLiteStateStore

        return SQLiteStateStore(spec["path"], durability=spec["durability"])
    if kind == "postgres":
        from ctrlrun.postgres import PostgresStateStore, split_store_url

        return PostgresStateStore(split_store_url(spec["url"])[0], schema=spec["schema"])
    raise ValueError(f"store {kind!r} cannot be shared between processes")


def usable_stores(settings: Any, pg: Postgres, results: Any, *, shared: bool = False) -> list[str]:
    """The stores selected by ``--stores`` that can run here; a note for each one skipped."""
    chosen = []
    for kind in settings.stores:
        if shared and kind == "memory":
            continue
        if kind == "postgres" and not pg.available:
            continue
        chosen.append(kind)
    return chosen


def protected_refund(store: Any, sinks: Any = ()) -> tuple[Any, Callable[..., Any]]:
    """A Control over ``store`` with the refund policy, and the refund function protected by it."""
    import ctrlrun
    from ctrlrun import Control, Policy

    from .common import ACTION, EFFECT, REFUND_POLICY, refund

    control = Control(Policy.from_yaml(REFUND_POLICY, source="bench"), store, sinks=sinks)
    return control, ctrlrun.protect(ACTION, effect=EFFECT, control=control)(refund)


AUTHORITY = """\
authority:
  grants:
    - id: bench-grant
      subject: { agent: bench-agent }
      actions: [bench.refund]
      budgets:
        - { metric: count, limit: 1000000000, window: P1D }
"""


def protected_refund_authority(store: Any) -> Callable[..., Any]:
    """The same refund under an authority section: one root grant with a budget, so each call
    reads the delegations and takes a charge with its reservation."""
    import ctrlrun
    from ctrlrun import Control, Policy

    from .common import ACTION, EFFECT, REFUND_POLICY, refund

    text = REFUND_POLICY.replace("ctrlrun.policy/v2", "ctrlrun.policy/v7").replace("actions:\n", AUTHORITY + "actions:\n", 1)
    control = Control(Policy.from_yaml(text, source="bench authority"), store)
    return ctrlrun.protect(ACTION, effect=EFFECT, control=control)(refund)


def protected_refund_async(control: Any) -> Callable[..., Any]:
    """The same refund as an ``async def``, protected by ``control`` (the async allow path)."""
    import ctrlrun

    from .common import ACTION, EFFECT, refund

    async def refund_async(payment_id: str, amount: int) -> dict:
        return refund(payment_id=payment_id, amount=amount)

    return ctrlrun.protect(ACTION, effect=EFFECT, control=control)(refund_async)
