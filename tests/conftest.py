"""Shared fixtures: a settable clock and one ``store`` fixture run against every backend.

Postgres: tests that need a server read ``CTRLRUN_TEST_POSTGRES_URL`` and skip with a reason
without it (or when the server cannot be reached), except under ``CI``, where either is a failure.
Each Postgres test gets a fresh schema ``ctrlrun_t_<random>``, dropped afterwards.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ctrlrun.testing import Clock as TestingClock

POSTGRES_URL_VARIABLE = "CTRLRUN_TEST_POSTGRES_URL"
TEST_SCHEMA_PREFIX = "ctrlrun_t_"


class FakeClock(TestingClock):
    """An aware UTC clock that moves only when a test sets or advances it (``ctrlrun.testing``'s
    clock: ``set`` refuses a naive datetime with ``InvalidArgument``, a ``ValueError``)."""


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def _memory(tmp_path: Path, clock: FakeClock) -> Any:
    from ctrlrun.store import InMemoryStateStore

    return InMemoryStateStore(clock=clock)


def _sqlite(tmp_path: Path, clock: FakeClock) -> Any:
    from ctrlrun.store import SQLiteStateStore

    return SQLiteStateStore(tmp_path / "state.db", clock=clock)


# --------------------------------------------------------------------------- Postgres

_reachability: dict[str, str | None] = {}  # url -> None (reachable) or why not
_SESSION_SALT = secrets.token_hex(4)  # test schema names differ between concurrent sessions


def _under_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _unavailable(reason: str) -> None:
    if _under_ci():
        pytest.fail(f"{reason}; under CI the Postgres tests must run", pytrace=False)
    pytest.skip(reason)


def postgres_url() -> str:
    """The test server's URL; skips the calling test with a reason (fails it under ``CI``)."""
    url = os.environ.get(POSTGRES_URL_VARIABLE, "").strip()
    if not url:
        _unavailable(
            f"{POSTGRES_URL_VARIABLE} is not set "
            "(e.g. postgresql://postgres@127.0.0.1:5432/test)"
        )
    if url not in _reachability:
        try:
            import psycopg
        except ImportError:
            _reachability[url] = "psycopg is not installed (pip install -e '.[dev]')"
        else:
            try:
                psycopg.connect(url, connect_timeout=5).close()
                _reachability[url] = None
            except psycopg.Error as exc:
                _reachability[url] = f"cannot reach the Postgres server: {exc}".strip()
    reason = _reachability[url]
    if reason is not None:
        _unavailable(f"{POSTGRES_URL_VARIABLE}={url}: {reason}")
    return url


def _admin(url: str, *statements: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def create_pg_schema(url: str, name: str | None = None) -> str:
    """Create (if missing) and return a test schema; random name unless one is given."""
    name = name or TEST_SCHEMA_PREFIX + secrets.token_hex(6)
    _admin(url, f'CREATE SCHEMA IF NOT EXISTS "{name}"')
    return name


def drop_pg_schema(url: str, name: str) -> None:
    _admin(url, f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def pg_schema_for(tmp_path: Path) -> str:
    """The schema of one test directory: opening it twice reopens the same store."""
    digest = hashlib.sha256(f"{_SESSION_SALT}:{tmp_path}".encode()).hexdigest()
    return TEST_SCHEMA_PREFIX + digest[:12]


@pytest.fixture
def pg_url() -> str:
    return postgres_url()


@pytest.fixture
def pg_schema(pg_url: str) -> Iterator[str]:
    """A fresh, empty schema for this test, dropped afterwards."""
    name = create_pg_schema(pg_url)
    yield name
    drop_pg_schema(pg_url, name)


def _postgres(tmp_path: Path, clock: FakeClock, *, prepared: bool = False) -> Any:
    from ctrlrun.postgres import PostgresStateStore

    url = postgres_url()
    schema = create_pg_schema(url, pg_schema_for(tmp_path))
    return PostgresStateStore(url, schema=schema, clock=clock, prepared=prepared)


def _postgres_prepared(tmp_path: Path, clock: FakeClock) -> Any:
    return _postgres(tmp_path, clock, prepared=True)


# Every backend the conformance suite runs against. ``factory(tmp_path, clock)`` opens the store
# of that test directory; calling it again reopens the same storage (not for "memory").
STORE_FACTORIES: dict[str, Callable[[Path, FakeClock], Any]] = {
    "memory": _memory,
    "sqlite": _sqlite,
    "postgres": _postgres,
}
DURABLE_STORES = ("postgres", "sqlite")
# The conformance suite also runs the Postgres store with its writes as prepared statements.
CONFORMANCE_FACTORIES = {**STORE_FACTORIES, "postgres-prepared": _postgres_prepared}


def backend_params(names: Any) -> list[Any]:
    return [
        pytest.param(name, marks=pytest.mark.postgres) if name.startswith("postgres") else name
        for name in sorted(names)
    ]


def drop_test_store(kind: str, tmp_path: Path) -> None:
    """Drop the Postgres schema of one test directory (nothing for the other backends)."""
    if kind.startswith("postgres") and os.environ.get(POSTGRES_URL_VARIABLE, "").strip():
        try:
            drop_pg_schema(os.environ[POSTGRES_URL_VARIABLE].strip(), pg_schema_for(tmp_path))
        except Exception:
            pass  # the server went away; the test itself reported it


@pytest.fixture(params=backend_params(STORE_FACTORIES))
def store_kind(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Which backend this test runs against; cleans up a Postgres test schema afterwards."""
    yield request.param
    drop_test_store(request.param, tmp_path)


@pytest.fixture(params=backend_params(DURABLE_STORES))
def durable_kind(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The backends whose storage outlives a store object (reopen tests)."""
    yield request.param
    drop_test_store(request.param, tmp_path)


@pytest.fixture
def store(store_kind: str, tmp_path: Path, clock: FakeClock) -> Iterator[Any]:
    instance = STORE_FACTORIES[store_kind](tmp_path, clock)
    yield instance
    instance.close()


# The CLI tests' fixtures (an empty working directory; a project with a store in it).
from ._cli_helpers import project, workdir  # noqa: E402, F401
