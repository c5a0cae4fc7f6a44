"""Ids are 128 random bits each, never repeated within a process or across a fork."""

from __future__ import annotations

import os
import re

import pytest

from ctrlrun.action import new_id


def test_ids_are_prefixed_hex_and_distinct() -> None:
    ids = [new_id("act") for _ in range(1000)]
    assert all(re.fullmatch(r"act_[0-9a-f]{32}", i) for i in ids)
    assert len(set(ids)) == len(ids)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_forked_child_draws_ids_of_its_own() -> None:
    new_id("act")  # the parent holds ids drawn ahead
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: write its next ids and leave at once
        os.write(write, " ".join(new_id("act") for _ in range(8)).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = set(os.read(read, 10_000).decode().split())
    os.close(read)
    parent = {new_id("act") for _ in range(8)}
    assert len(child) == 8 and not child & parent
