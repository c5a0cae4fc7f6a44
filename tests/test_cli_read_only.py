"""The reading commands on a store the user may only read; writes on such a store are refused.

A read-only place is a real one: a read-only filesystem (a tmpfs remounted ``ro``) when the tests
run as root, whom file modes do not stop, else file modes (0444 files, 0555 directories).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ctrlrun import InvalidArgument, SQLiteStateStore
from ctrlrun.effects.records import EffectState
from ctrlrun.evidence.receipt import Event, EventType

from ._cli_helpers import Project, invoke, tree
from .conftest import FakeClock
from .vectors import ROOT

READING = (["receipts"], ["receipts", "--json"], ["receipts", "--verify-chain"], ["effects"],
           ["effects", "--json"], ["pending"], ["pending", "--json"])  # fmt: skip
SNAPSHOT_NOTE = "is read as a snapshot"


class Place:
    """A directory that ``freeze`` makes read-only for this process, whoever runs the tests."""

    def __init__(self, directory: Path, mounted: bool) -> None:
        self.directory = directory
        self.mounted = mounted

    def freeze(self) -> None:
        if self.mounted:
            subprocess.run(["mount", "-o", "remount,ro", str(self.directory)], check=True)
            return
        for path in sorted(self.directory.rglob("*"), reverse=True):
            path.chmod(0o555 if path.is_dir() else 0o444)
        self.directory.chmod(0o555)
        if os.access(self.directory, os.W_OK):
            pytest.skip("file modes do not stop this user from writing")

    def thaw(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.directory)], check=False)
            return
        self.directory.chmod(0o755)
        for path in self.directory.rglob("*"):
            path.chmod(stat.S_IRWXU if path.is_dir() else stat.S_IRUSR | stat.S_IWUSR)


@pytest.fixture
def place(workdir: Path) -> Iterator[Place]:
    """The working directory's ``project/``, which a test fills and then freezes."""
    directory = workdir / "project"
    directory.mkdir()
    mounted = False
    if os.geteuid() == 0:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(directory)],
                              capture_output=True)  # fmt: skip
        if done.returncode != 0:
            pytest.skip(f"running as root, and cannot mount a filesystem to make read-only: "
                        f"{done.stderr.decode().strip()}")  # fmt: skip
        mounted = True
    chosen = Place(directory, mounted)
    try:
        yield chosen
    finally:
        chosen.thaw()


def _fill(directory: Path) -> tuple[Project, str]:
    """A store with receipts, an ambiguous effect and a pending request, and the policy beside it."""
    (directory / "ctrlrun.yaml").write_bytes((ROOT / "ctrlrun.yaml").read_bytes())
    project = Project(directory, FakeClock())
    project.call(payment_id="txn_1", amount=100)
    project.ambiguous("txn_9")
    return project, project.request(payment_id="txn_2", amount=500_000)


def _env(place: Place) -> dict[str, str | None]:
    return {"CTRLRUN_CONFIG": str(place.directory / "ctrlrun.yaml")}


def test_reading_commands_work_where_nothing_may_be_written(place):
    project, request_id = _fill(place.directory)
    project.close()  # the last connection gone: no -wal or -shm file is left
    place.freeze()
    before = tree(place.directory)
    assert ".ctrlrun/state.db" in before and not [p for p in before if p.endswith(("-wal", "-shm"))]
    outputs = {}
    for args in READING:
        result = invoke(args, clock=project.clock, env=_env(place))
        assert result.code == 0, (args, result.err)
        assert SNAPSHOT_NOTE in result.err and str(project.db) in result.err, args
        outputs[" ".join(args)] = result.lines
    assert tree(place.directory) == before  # created nothing
    assert len(outputs["receipts"]) == 2 and outputs["receipts --verify-chain"] == [
        "chain: 2 of 2 receipts verified", "full check of seq 1..2", "the chain is intact"]  # fmt: skip
    assert [json.loads(line)["state"] for line in outputs["effects --json"]] == ["committed", "ambiguous"]
    assert outputs["pending"][0].startswith(request_id) and "  refund:txn_2  new  " in outputs["pending"][0]

    for args in (["approve", request_id], ["deny", request_id], ["resolve", "refund:txn_9", "--failed"]):
        refused = invoke(args, clock=project.clock, env=_env(place))
        assert refused.code == 1, (args, refused.out)
        assert str(project.db) in refused.err and "Traceback" not in refused.err
    assert tree(place.directory) == before


def test_reading_beside_a_live_writer_sees_its_latest_writes(place, tmp_path):
    """A WAL store whose -wal and -shm exist (a writer has it open) is shared, not snapshotted."""
    source = tmp_path / "live"
    source.mkdir()
    project, _ = _fill(source)
    project.call(payment_id="txn_3", amount=100)  # still in the WAL: the writer is open
    assert (project.db.parent / "state.db-wal").is_file() and (project.db.parent / "state.db-shm").is_file()
    shutil.copytree(source, place.directory, dirs_exist_ok=True)  # a frozen copy, writer included
    project.close()
    place.freeze()
    result = invoke(["receipts"], clock=project.clock, env=_env(place))
    assert result.code == 0, result.err
    assert result.err == "" and len(result.lines) == 3


def test_a_read_only_store_refuses_every_write(project):
    project.close()
    store = SQLiteStateStore(project.db, clock=project.clock, migrate=False, read_only=True)
    try:
        assert store.read_only and not store.snapshot
        assert len(store.receipts()) == 0 and store.list_effects() == ()
        writes = [
            lambda: store.reserve_effect("job:1", "act_1"),
            lambda: store.append_event(Event(type=EventType.EFFECT_RESOLVED, ts="2026-11-30T09:00:00.000Z",
                                             action_id="act_1", data={})),  # fmt: skip
            lambda: store.resolve_effect("job:1", EffectState.FAILED, "cli:local"),
        ]
        for write in writes:
            with pytest.raises(InvalidArgument) as refused:
                write()
            assert str(project.db) in str(refused.value) and "read-only" in str(refused.value)
    finally:
        store.close()
    assert SQLiteStateStore(project.db, clock=project.clock).get_effect("job:1") is None


def test_read_only_needs_an_existing_store(workdir):
    with pytest.raises(InvalidArgument, match="migrate=False"):
        SQLiteStateStore(workdir / "state.db", read_only=True)
    with pytest.raises(InvalidArgument, match="no ctrlrun store"):
        SQLiteStateStore(workdir / "state.db", migrate=False, read_only=True)
    assert tree(workdir) == []
