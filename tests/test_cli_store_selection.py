"""Which store a command opens, and that reading or answering never creates or migrates one."""

from __future__ import annotations

import pytest

from ctrlrun import SQLiteStateStore

from ._cli_helpers import START, invoke, sql, tree
from .conftest import FakeClock

READERS = [
    ["approve", "apr_00000000000000000000000000000000"],
    ["deny", "apr_00000000000000000000000000000000"],
    ["pending"],
    ["pending", "--json"],
    ["resolve", "refund:txn_1", "--failed"],
    ["effects"],
    ["receipts"],
    ["receipts", "--json"],
    ["receipts", "--verify-chain"],
]


def _seed(path, payment_id):
    """Write one committed refund into a store at ``path``."""
    import ctrlrun
    from ctrlrun import Control

    from ._cli_helpers import starter_policy

    clock = FakeClock(START)
    store = SQLiteStateStore(path, clock=clock)
    control = Control(starter_policy(), store, clock=clock, environment="production")

    @ctrlrun.protect("stripe.refund", effect="refund:{payment_id}", control=control)
    def refund(payment_id: str, amount: int) -> None:
        return None

    with ctrlrun.context(agent="seed"):
        refund(payment_id=payment_id, amount=1)
    store.close()


def _shown_key(result):
    assert result.code == 0, result.err
    return result.out.split()[0]


def test_default_is_beside_ctrlrun_yaml_in_the_working_directory(workdir):
    _seed(workdir / ".ctrlrun" / "state.db", "here")
    assert _shown_key(invoke(["effects"])) == "refund:here"


def test_default_follows_ctrlrun_config_even_without_the_file(workdir, monkeypatch):
    _seed(workdir / ".ctrlrun" / "state.db", "here")
    _seed(workdir / "conf" / ".ctrlrun" / "state.db", "conf")
    monkeypatch.setenv("CTRLRUN_CONFIG", str(workdir / "conf" / "ctrlrun.yaml"))
    assert _shown_key(invoke(["effects"])) == "refund:conf"


def test_ctrlrun_state_wins_over_the_policy_location(workdir, monkeypatch):
    _seed(workdir / ".ctrlrun" / "state.db", "here")
    _seed(workdir / "s.db", "state")
    monkeypatch.setenv("CTRLRUN_STATE", "s.db")
    assert _shown_key(invoke(["effects"])) == "refund:state"


def test_store_url_variable_wins_over_ctrlrun_state(workdir, monkeypatch):
    _seed(workdir / "s.db", "state")
    _seed(workdir / "u.db", "url")
    monkeypatch.setenv("CTRLRUN_STATE", "s.db")
    monkeypatch.setenv("CTRLRUN_STORE_URL", f"sqlite://{workdir / 'u.db'}")
    assert _shown_key(invoke(["effects"])) == "refund:url"


def test_store_url_option_wins_over_everything(workdir, monkeypatch):
    _seed(workdir / "u.db", "url")
    _seed(workdir / "o.db", "option")
    monkeypatch.setenv("CTRLRUN_STORE_URL", f"sqlite://{workdir / 'u.db'}")
    monkeypatch.setenv("CTRLRUN_STATE", str(workdir / "u.db"))
    assert _shown_key(invoke(["effects", "--store-url", "sqlite://o.db"])) == "refund:option"


@pytest.mark.parametrize("command", [c for c in READERS if c[0] != "pending" or len(c) == 1])
def test_every_store_command_takes_store_url(workdir, command):
    _seed(workdir / "o.db", "option")
    result = invoke([*command, "--store-url", "sqlite://o.db"])
    assert result.code in (0, 1), result.err  # never a usage error
    assert "no database" not in result.err


@pytest.mark.parametrize("variable", ["CTRLRUN_STORE_URL", "CTRLRUN_STATE", "CTRLRUN_CONFIG"])
@pytest.mark.parametrize("value", ["", "  "])
def test_blank_variables_are_refused_by_name(workdir, monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    result = invoke(["effects"])
    assert result.code == 1
    assert result.err.startswith("Error: ") and variable in result.err
    assert tree(workdir) == []


@pytest.mark.parametrize(
    "url", ["mysql://x/y", "file:///tmp/x.db", "sqlite://", "state.db", "postgresql://u@127.0.0.1:1/db"]
)
def test_unsupported_store_urls_exit_1(workdir, url):
    result = invoke(["receipts", "--store-url", url])
    assert result.code == 1 and result.err.startswith("Error: ")
    assert tree(workdir) == []


@pytest.mark.parametrize("blank", ["CTRLRUN_STATE", "CTRLRUN_CONFIG"])
def test_a_blank_variable_is_refused_even_below_a_set_one(workdir, monkeypatch, blank):
    _seed(workdir / "u.db", "url")
    monkeypatch.setenv("CTRLRUN_STORE_URL", "sqlite://u.db")
    monkeypatch.setenv(blank, "")
    result = invoke(["effects"])
    assert result.code == 1 and blank in result.err
    assert invoke(["effects", "--store-url", "sqlite://u.db"]).code == 0  # the option decides alone


def test_blank_store_url_option_exit_1(workdir):
    result = invoke(["receipts", "--store-url", " "])
    assert result.code == 1 and "--store-url" in result.err


def test_in_memory_state_is_refused(workdir, monkeypatch):
    monkeypatch.setenv("CTRLRUN_STATE", ":memory:")
    result = invoke(["receipts"])
    assert result.code == 1 and "in-memory" in result.err


@pytest.mark.parametrize("command", READERS, ids=" ".join)
def test_missing_database_exits_1_and_creates_nothing(workdir, command):
    result = invoke(command)
    assert result.code == 1
    expected = workdir / ".ctrlrun" / "state.db"
    assert result.err.startswith(f"Error: no database at '{expected}'")
    assert "run a protected call" in result.err
    assert result.out == ""
    assert tree(workdir) == []


@pytest.mark.parametrize("command", READERS, ids=" ".join)
def test_missing_database_named_by_option_creates_nothing(workdir, command):
    result = invoke([*command, "--store-url", "sqlite://sub/dir/x.db"])
    assert result.code == 1
    assert f"no database at '{workdir / 'sub' / 'dir' / 'x.db'}'" in result.err
    assert tree(workdir) == []


def test_a_directory_is_not_a_database(workdir):
    (workdir / "d.db").mkdir()
    result = invoke(["receipts", "--store-url", "sqlite://d.db"])
    assert result.code == 1 and "not a database file" in result.err


@pytest.mark.parametrize("command", READERS, ids=" ".join)
def test_an_unmigrated_database_is_neither_created_nor_upgraded(workdir, command):
    empty = workdir / "empty.db"
    sql(empty, "CREATE TABLE unrelated (x)")
    before = empty.read_bytes()
    result = invoke([*command, "--store-url", "sqlite://empty.db"])
    assert result.code == 1 and result.err.startswith("Error: ")
    assert empty.read_bytes() == before
    assert sql(empty, "SELECT name FROM sqlite_master WHERE type='table'") == [("unrelated",)]


def test_an_empty_file_is_not_migrated(workdir, monkeypatch):
    from ctrlrun.store import sqlite

    monkeypatch.setattr(sqlite, "_EMPTY_WAIT", 0.0)  # no other process is creating it
    (workdir / "zero.db").write_bytes(b"")
    result = invoke(["pending", "--store-url", "sqlite://zero.db"])
    assert result.code == 1 and "empty file, not a ctrlrun store" in result.err
    assert (workdir / "zero.db").read_bytes() == b""


def test_a_file_that_is_not_sqlite(workdir):
    (workdir / "junk.db").write_bytes(b"this is not a database" * 100)
    result = invoke(["receipts", "--store-url", "sqlite://junk.db"])
    assert result.code == 1 and result.err.startswith("Error: ")
    assert "Traceback" not in result.err
