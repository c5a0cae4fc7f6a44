"""Fixtures for the DBOS adapter suite: no network, a fresh DBOS system database and ctrlrun
store per test, on SQLite and on the Postgres server named by ``CTRLRUN_TEST_POSTGRES_URL``."""

from __future__ import annotations

import os
import secrets
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from refund_app import Settings  # noqa: E402

POSTGRES_URL_VARIABLE = "CTRLRUN_TEST_POSTGRES_URL"


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Refuse every non-UNIX socket connection from Python: the suite runs offline (the
    Postgres driver, libpq, connects from C and is not affected)."""
    real_connect = socket.socket.connect

    def connect(self, address):
        if self.family != getattr(socket, "AF_UNIX", None):
            raise ConnectionRefusedError(f"network refused in tests: {address!r}")
        return real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    for name in ("CTRLRUN_CONFIG", "CTRLRUN_STATE", "CTRLRUN_STORE_URL", "CTRLRUN_ENVIRONMENT"):
        monkeypatch.delenv(name, raising=False)


def _postgres_url() -> str:
    url = os.environ.get(POSTGRES_URL_VARIABLE, "").strip()
    if not url:
        reason = f"{POSTGRES_URL_VARIABLE} is not set (e.g. postgresql://postgres@127.0.0.1:5432/test)"
        if os.environ.get("CI"):
            pytest.fail(reason + "; CI must test DBOS on Postgres")
        pytest.skip(reason)
    return url


def _admin(url: str, sql: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def settings(request, tmp_path: Path) -> Iterator[Settings]:
    """Where this test's DBOS system database and ctrlrun store live (both fresh)."""
    remote = tmp_path / "remote.log"
    if request.param == "sqlite":
        yield Settings(
            dbos_url=f"sqlite:///{tmp_path / 'dbos.sqlite'}",
            store_url=f"sqlite://{tmp_path / 'state.db'}",
            remote=remote,
        )
        return
    url = _postgres_url()
    token = secrets.token_hex(5)
    dbos_schema, store_schema = f"dbos_t_{token}", f"ctrlrun_dbos_t_{token}"
    _admin(url, f'CREATE SCHEMA "{store_schema}"')
    try:
        yield Settings(dbos_url=url, store_url=f"{url}?ctrlrun_schema={store_schema}",
                       remote=remote, dbos_schema=dbos_schema)  # fmt: skip
    finally:
        for schema in (dbos_schema, store_schema):
            _admin(url, f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture
def launched(settings: Settings):
    """Build and launch the test application in this process; shut it down after."""
    from dbos import DBOS

    from refund_app import build

    made: list[object] = []

    def launch(**changes: object):
        for name, value in changes.items():
            setattr(settings, name, value)
        app = build(settings)
        DBOS.launch()
        made.append(app)
        return app

    yield launch
    DBOS.destroy(destroy_registry=True)
    for app in made:
        app.store.close()  # type: ignore[attr-defined]
