"""The SQLite store binds None through an adapter to itself: NULL as before, an earlier one kept."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap

import ctrlrun.store.sqlite  # noqa: F401  (registers the adapter)


def test_none_binds_as_null_through_the_registered_adapter() -> None:
    adapter = sqlite3.adapters[(type(None), sqlite3.PrepareProtocol)]
    assert adapter(None) is None
    with sqlite3.connect(":memory:") as db:
        assert db.execute("SELECT ? IS NULL, typeof(?)", (None, None)).fetchone() == (1, "null")


def test_an_adapter_registered_before_the_store_loads_is_kept() -> None:
    script = textwrap.dedent("""
        import sqlite3
        mine = lambda value: None
        sqlite3.register_adapter(type(None), mine)
        import ctrlrun.store.sqlite
        assert sqlite3.adapters[(type(None), sqlite3.PrepareProtocol)] is mine
    """)
    subprocess.run([sys.executable, "-c", script], check=True)
