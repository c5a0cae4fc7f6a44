"""``ctrlrun.postgres``: the public home of ``PostgresStateStore`` (its code is in ``store/``).

Not re-exported by ``ctrlrun``; importing this module does not import the driver (psycopg), which
loads only when a store is built.
"""

from __future__ import annotations

from .store.postgres import PostgresStateStore, PostgresTimeouts, clock_skew, split_store_url

__all__ = ["PostgresStateStore", "PostgresTimeouts", "clock_skew", "split_store_url"]
