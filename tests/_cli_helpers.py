"""Shared helpers for the CLI tests: a clean working directory, a CliRunner wrapper, populated stores."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import ctrlrun
from ctrlrun import Control, JSONLEventSink, Policy, SQLiteStateStore
from ctrlrun.cli import cli
from ctrlrun.cli.stores import Settings

from .conftest import FakeClock
from .vectors import ROOT

ENV_VARS = ("CTRLRUN_CONFIG", "CTRLRUN_STATE", "CTRLRUN_STORE_URL", "CTRLRUN_ENVIRONMENT")
START = datetime(2026, 11, 30, 9, 0, tzinfo=timezone.utc)


@dataclass
class Outcome:
    code: int
    out: str
    err: str
    exception: BaseException | None

    @property
    def lines(self) -> list[str]:
        return self.out.splitlines()


def _runner() -> CliRunner:
    try:
        return CliRunner(mix_stderr=False)  # click 8.1
    except TypeError:
        return CliRunner()  # click >= 8.2 keeps stderr apart


def invoke(args: list[str], *, clock: Callable[[], datetime] | None = None,
           env: dict[str, str | None] | None = None) -> Outcome:  # fmt: skip
    """Run ``ctrlrun <args>`` in process; the CLI's clock is ``clock`` when given."""
    settings = Settings(clock=clock) if clock is not None else Settings()
    result = _runner().invoke(cli, args, obj=settings, env=env, catch_exceptions=True)
    exception = result.exception if not isinstance(result.exception, SystemExit) else None
    return Outcome(result.exit_code, result.stdout, result.stderr, exception)


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty current directory with no CTRLRUN_* variable set."""
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    ctrlrun.reset()
    yield tmp_path
    ctrlrun.reset()


def starter_policy() -> Policy:
    return Policy.from_file(ROOT / "ctrlrun.yaml")


class Project:
    """A store at ``<dir>/.ctrlrun/state.db`` (the CLI's default) written through the real Control."""

    def __init__(self, directory: Path, clock: FakeClock) -> None:
        self.directory = directory
        self.clock = clock
        self.db = directory / ".ctrlrun" / "state.db"
        self.store = SQLiteStateStore(self.db, clock=clock)
        self.control = Control(
            starter_policy(),
            self.store,
            clock=clock,
            environment="production",
            sinks=(JSONLEventSink(self.db.parent),),
        )
        self.remote: list[dict[str, Any]] = []
        self.lose_reply = False

        @ctrlrun.protect("stripe.refund", effect="refund:{payment_id}", control=self.control)
        def refund(payment_id: str, amount: int) -> dict[str, Any]:
            self.remote.append({"payment_id": payment_id, "amount": amount})
            if self.lose_reply:
                raise TimeoutError("reply lost")
            return {"ok": payment_id}

        self.refund = refund

    def call(self, agent: str = "support-agent", user: str | None = None, *,
             approval: str | None = None, **arguments: Any) -> Any:  # fmt: skip
        with ctrlrun.context(agent=agent, user=user):
            if approval is None:
                return self.refund(**arguments)
            with ctrlrun.with_approval(approval):
                return self.refund(**arguments)

    def request(self, agent: str = "support-agent", **arguments: Any) -> str:
        """Propose an action the policy sends to a human; return the pending request id."""
        with pytest.raises(ctrlrun.ApprovalRequired) as required:
            self.call(agent, **arguments)
        return required.value.request_id

    def ambiguous(self, payment_id: str = "txn_9") -> str:
        self.lose_reply = True
        with pytest.raises(TimeoutError):
            self.call(payment_id=payment_id, amount=1_000)
        self.lose_reply = False
        return f"refund:{payment_id}"

    def close(self) -> None:
        self.store.close()


@pytest.fixture
def project(workdir: Path) -> Iterator[Project]:
    """A project directory with a store written at a fixed clock (2026-11-30T09:00Z)."""
    instance = Project(workdir, FakeClock(START))
    yield instance
    instance.close()


def sql(db: Path, statement: str, *params: Any) -> list[tuple[Any, ...]]:
    """Run plain SQL on the database file, as a tamperer would."""
    conn = sqlite3.connect(db)
    try:
        rows = conn.execute(statement, params).fetchall()
        conn.commit()
        return rows
    finally:
        conn.close()


def later(clock: FakeClock, **delta: float) -> FakeClock:
    """A separate clock ``delta`` after ``clock`` (the CLI's view of now)."""
    return FakeClock(clock.now + timedelta(**delta))


def tree(directory: Path) -> list[str]:
    """Every path below ``directory``, to show a command created nothing."""
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))
