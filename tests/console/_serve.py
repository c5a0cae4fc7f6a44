"""Helpers for the console tests: a project store with pending requests, a logged-in client,
and real ``ctrlrun serve`` processes."""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

import ctrlrun
from ctrlrun import Control, Policy, SQLiteStateStore
from ctrlrun.cli.stores import Settings, open_operator_store
from ctrlrun.console.app import build_app
from ctrlrun.console.auth import add_user
from ctrlrun.console.settings import ConsoleSettings

from ..conftest import FakeClock
from ..vectors import ROOT

SRC = Path(__file__).resolve().parents[2] / "src"
START = datetime(2026, 11, 30, 9, 0, tzinfo=timezone.utc)
PASSWORDS = {"ada": "ada-secret-1", "bob": "bob-secret-2"}
_CSRF = re.compile(r'name="csrf_token" value="([^"]*)"')


def csrf_of(page: str) -> str:
    match = _CSRF.search(page)
    assert match is not None, "the page has no CSRF field"
    return html.unescape(match.group(1))


class Project:
    """A SQLite store written by a real Control under the starter policy, and its users file."""

    def __init__(self, directory: Path, clock: FakeClock) -> None:
        self.directory = directory
        self.clock = clock
        self.policy = directory / "ctrlrun.yaml"
        shutil.copy(ROOT / "ctrlrun.yaml", self.policy)
        self.db = directory / "state.db"
        self.url = f"sqlite://{self.db}"
        self.store = SQLiteStateStore(self.db, clock=clock)
        self.control = Control(Policy.from_file(self.policy), self.store, clock=clock, environment="production")
        self.users = directory / "users.yaml"
        for name, password in PASSWORDS.items():
            add_user(self.users, name, password)
        self.runs: list[dict[str, Any]] = []
        self.lose_reply = False

        @ctrlrun.protect("stripe.refund", effect="refund:{payment_id}", control=self.control)
        def refund(payment_id: str, amount: int) -> dict[str, Any]:
            self.runs.append({"payment_id": payment_id, "amount": amount})
            if self.lose_reply:
                raise TimeoutError("reply lost")
            return {"ok": payment_id}

        self.refund = refund

    def call(self, *, user: str | None = "bob", approval: str | None = None, **arguments: Any) -> Any:
        with ctrlrun.context(agent="support-agent", user=user):
            if approval is None:
                return self.refund(**arguments)
            with ctrlrun.with_approval(approval):
                return self.refund(**arguments)

    def request(self, user: str | None = "bob", **arguments: Any) -> str:
        """A pending request (the starter policy asks a human for 500.01 to 5,000.00)."""
        arguments.setdefault("payment_id", "txn_1")
        arguments.setdefault("amount", 100_000)
        with pytest.raises(ctrlrun.ApprovalRequired) as required:
            self.call(user=user, **arguments)
        return required.value.request_id

    def ambiguous(self, payment_id: str = "txn_9") -> str:
        self.lose_reply = True
        with pytest.raises(TimeoutError):
            self.call(payment_id=payment_id, amount=1_000)
        self.lose_reply = False
        return f"refund:{payment_id}"

    def events(self) -> list[Any]:
        return list(self.store.events())


@contextmanager
def console_client(project: Project, client_base: str = "http://127.0.0.1", **overrides: Any) -> Iterator[Any]:
    """A Starlette TestClient on the console over the project's store, opened as the CLI opens it."""
    from starlette.testclient import TestClient

    fields: dict[str, Any] = {"users_path": project.users, "secret": b"s" * 32, "policy_path": project.policy,
                              "clock": project.clock}  # fmt: skip
    fields.update(overrides)
    with open_operator_store(Settings(clock=project.clock), project.url) as store:
        app = build_app(store, ConsoleSettings(**fields))
        with TestClient(app, base_url=client_base) as client:
            yield client


def login(client: Any, name: str, password: str | None = None) -> Any:
    """Log in through the form; returns the POST's response."""
    page = client.get("/login")
    token = csrf_of(page.text)
    data = {"username": name, "password": PASSWORDS.get(name, "") if password is None else password, "csrf_token": token}
    return client.post("/login", data=data, follow_redirects=False)


def token(client: Any, path: str = "/") -> str:
    return csrf_of(client.get(path).text)


def cli_env(project: Project) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTRLRUN_")}
    env.update({"PYTHONPATH": str(SRC), "CTRLRUN_CONFIG": str(project.policy), "CTRLRUN_STORE_URL": project.url,
                "CTRLRUN_CONSOLE_SECRET": "shared-test-secret"})  # fmt: skip
    return env


class Served:
    """A running ``ctrlrun serve`` process and the URL its listening line named."""

    def __init__(self, process: subprocess.Popen[str], url: str) -> None:
        self.process = process
        self.url = url


@contextmanager
def serve(project: Project, *args: str) -> Iterator[Served]:
    """Start ``ctrlrun serve --listen 127.0.0.1:0`` and wait for its listening line on stderr."""
    command = [sys.executable, "-m", "ctrlrun", "serve", "--listen", "127.0.0.1:0", "--users", str(project.users), *args]
    process = subprocess.Popen(command, env=cli_env(project), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                               text=True, cwd=project.directory)  # fmt: skip
    try:
        assert process.stderr is not None
        seen = []
        deadline = time.monotonic() + 60
        url = None
        while time.monotonic() < deadline:  # the process prints the line once it is bound
            line = process.stderr.readline()
            if not line:
                break
            seen.append(line)
            match = re.match(r"listening on (http://127\.0\.0\.1:\d+)$", line.strip())
            if match:
                url = match.group(1)
                break
        assert url is not None, f"no listening line; stderr: {''.join(seen)}"
        yield Served(process, url)
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
