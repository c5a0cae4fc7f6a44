"""The default Control: discovery from ./ctrlrun.yaml and the environment, and bad input."""

from __future__ import annotations

import shutil

import pytest

import ctrlrun
from ctrlrun import CTRLRunError, InvalidArgument, PolicyError, SQLiteStateStore

from .vectors import ROOT

ENV = ("CTRLRUN_CONFIG", "CTRLRUN_STATE", "CTRLRUN_STORE_URL", "CTRLRUN_ENVIRONMENT")


@pytest.fixture
def project(tmp_path, monkeypatch):
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    shutil.copy(ROOT / "ctrlrun.yaml", tmp_path / "ctrlrun.yaml")
    monkeypatch.chdir(tmp_path)
    ctrlrun.reset()
    yield tmp_path
    ctrlrun.reset()


@ctrlrun.protect("customer.read")
def read(customer_id: str) -> str:
    return customer_id


def call():
    with ctrlrun.context(agent="a"):
        return read("c1")


def test_store_lives_next_to_the_policy(project, tmp_path_factory, monkeypatch):
    elsewhere = tmp_path_factory.mktemp("policies")
    shutil.copy(ROOT / "ctrlrun.yaml", elsewhere / "ctrlrun.yaml")
    monkeypatch.setenv("CTRLRUN_CONFIG", str(elsewhere / "ctrlrun.yaml"))
    assert call() == "c1"
    assert (elsewhere / ".ctrlrun" / "state.db").is_file()
    assert (elsewhere / ".ctrlrun" / "receipts.jsonl").is_file()
    assert (elsewhere / ".ctrlrun" / "events.jsonl").is_file()
    assert not (project / ".ctrlrun").exists()


def test_ctrlrun_state_and_store_url(project, monkeypatch):
    monkeypatch.setenv("CTRLRUN_STATE", str(project / "custom" / "s.db"))
    call()
    assert (project / "custom" / "s.db").is_file()
    monkeypatch.setenv("CTRLRUN_STORE_URL", "sqlite://" + str(project / "url.db"))
    call()  # the cache notices the change
    assert (project / "url.db").is_file()
    store = SQLiteStateStore(project / "url.db")
    assert len(store.receipts()) == 1
    store.close()


@pytest.mark.parametrize(
    ("name", "value", "error"),
    [
        ("CTRLRUN_STATE", " ", InvalidArgument),
        ("CTRLRUN_STATE", ":memory:", InvalidArgument),
        ("CTRLRUN_STORE_URL", "", InvalidArgument),
        ("CTRLRUN_STORE_URL", "mysql://x", InvalidArgument),
        ("CTRLRUN_CONFIG", "  ", PolicyError),
        ("CTRLRUN_CONFIG", "missing.yaml", PolicyError),
    ],
)
def test_bad_environment(project, monkeypatch, name, value, error):
    monkeypatch.setenv(name, value)
    with pytest.raises(error) as info:
        call()
    assert name in str(info.value) or value.strip() in str(info.value)


def test_malformed_policy(project):
    (project / "ctrlrun.yaml").write_text("schema: ctrlrun.policy/v2\nactions:\n  a: {decision: allow}\n  a: {decision: deny}\n")
    with pytest.raises(PolicyError) as info:
        call()
    message = str(info.value)
    assert "ctrlrun.yaml" in message and "'a'" in message
    assert not (project / ".ctrlrun" / "state.db").exists()


def test_corrupt_database(project):
    (project / ".ctrlrun").mkdir()
    db = project / ".ctrlrun" / "state.db"
    junk = b"this is not a database, it is a grocery list\n" * 100
    db.write_bytes(junk)
    with pytest.raises(CTRLRunError) as info:
        call()
    assert "state.db" in str(info.value)
    assert db.read_bytes() == junk


def test_reset_and_cwd_change(project, tmp_path_factory, monkeypatch):
    call()
    first = ctrlrun.control.default.default_control()
    assert ctrlrun.control.default.default_control() is first
    ctrlrun.reset()
    assert ctrlrun.control.default.default_control() is not first
    other = tmp_path_factory.mktemp("other")
    shutil.copy(ROOT / "ctrlrun.yaml", other / "ctrlrun.yaml")
    monkeypatch.chdir(other)
    call()
    assert (other / ".ctrlrun" / "state.db").is_file()
