"""Two gateway processes on one store race the same effect key: it runs once (SQLite, Postgres)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ctrlrun.store import open_store_url

from .conftest import Counter, RawStdio, upstream_stdio_command
from .e2e import Site

INITIALIZE = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "race", "version": "0"}}}  # fmt: skip


def _race(site: Site, counter: Counter, keys: int = 3) -> list[dict[str, Any]]:
    open_store_url(site.store_url).close()  # created and migrated before the race
    gateways = [RawStdio(site.gateway(upstream_stdio_command(counter)), env=site.env()) for _ in range(2)]
    answers: list[dict[str, Any]] = []
    try:
        for raw in gateways:
            raw.send(INITIALIZE)
            assert json.loads(raw.receive())["id"] == 0
            raw.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        for n in range(keys):
            call = {"jsonrpc": "2.0", "id": 10 + n, "method": "tools/call",
                    "params": {"name": "refund", "arguments": {"order_id": f"race-{n}", "amount_cents": 100}}}  # fmt: skip
            for raw in gateways:  # both are sent before either is read
                raw.send(call)
            answers.extend(json.loads(raw.receive()) for raw in gateways)
    finally:
        codes = [raw.close() for raw in gateways]
    assert codes == [0, 0]
    return answers


def _check(answers: list[dict[str, Any]], counter: Counter, keys: int = 3) -> None:
    orders = [e["arguments"]["order_id"] for e in counter.executions("refund")]
    assert sorted(orders) == [f"race-{n}" for n in range(keys)]  # each key ran exactly once
    ran = [a for a in answers if "result" in a]
    refused = [a["error"] for a in answers if "error" in a]
    assert len(ran) == keys
    assert all(e["code"] == -41004 and e["data"]["state"] in ("committed", "in_progress") for e in refused), refused


@pytest.mark.slow
def test_two_gateways_on_one_sqlite_store_run_each_key_once(tmp_path: Path, counter: Counter) -> None:
    site = Site(tmp_path)
    _check(_race(site, counter), counter)


@pytest.mark.slow
@pytest.mark.postgres
def test_two_gateways_on_one_postgres_store_run_each_key_once(tmp_path: Path, counter: Counter, pg_url: str) -> None:
    from ..conftest import create_pg_schema, drop_pg_schema

    schema = create_pg_schema(pg_url)
    try:
        site = Site(tmp_path, store_url=f"{pg_url}?ctrlrun_schema={schema}")
        _check(_race(site, counter), counter)
    finally:
        drop_pg_schema(pg_url, schema)
