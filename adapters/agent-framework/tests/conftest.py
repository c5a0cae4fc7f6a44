"""Fixtures for the Agent Framework adapter suite: no network, a clean ctrlrun environment."""

from __future__ import annotations

import socket

import pytest


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Refuse every non-UNIX socket connection: the suite runs offline."""
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


@pytest.fixture
def store(tmp_path):
    from ctrlrun import SQLiteStateStore

    opened = SQLiteStateStore(tmp_path / "state.db")
    yield opened
    opened.close()
