"""A sink that raises on one record still gets every later one: the action's next events and its
receipt, on every path that fans evidence out (the straight allowed call, the pipeline, a refusal)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from ctrlrun import Control, DuplicateEffect, JSONLEventSink, InMemoryStateStore, Policy, context, protect
from ctrlrun.evidence.receipt import Event, Receipt

POLICY = "schema: ctrlrun.policy/v2\nactions:\n  note.delete:\n    decision: allow\n"


class Flaky:
    """Raises on the first event of each batch it is given; records the rest."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.receipts: list[str] = []
        self.failures = 0
        self._last_action: str | None = None

    def on_event(self, event: Event) -> None:
        if event.action_id != self._last_action:
            self._last_action = event.action_id
            self.failures += 1
            raise RuntimeError("sink down for a moment")
        self.events.append(event.type.value)

    def on_receipt(self, receipt: Receipt) -> None:
        self.receipts.append(str(receipt.result))


def test_a_sink_that_raises_on_an_event_still_gets_the_rest_and_the_receipt(caplog, clock):
    sink, second = Flaky(), Flaky()
    store = InMemoryStateStore(clock=clock)
    control = Control(Policy.from_yaml(POLICY), store, clock=clock, sinks=(sink, second))

    @protect("note.delete", effect="note:{note_id}", control=control)
    def delete(note_id: str) -> str:
        return "deleted"

    with caplog.at_level(logging.WARNING, logger="ctrlrun"), context(agent="agent-1"):
        assert delete(note_id="n1") == "deleted"
        with pytest.raises(DuplicateEffect):
            delete(note_id="n1")
    stored = [e.type.value for e in store.events()]
    for each in (sink, second):
        assert each.receipts == ["committed", "blocked"]
        # every event but the first of each action's (the one it raised on) arrived, in order
        assert len(each.events) == len(stored) - each.failures and each.failures == 2
    assert sum("event sink" in r.getMessage() for r in caplog.records) == 4


def test_the_jsonl_sink_writes_the_receipt_when_the_events_append_fails(tmp_path, monkeypatch):
    sink = JSONLEventSink(tmp_path)
    real = sink._append

    def events_fail(path: Any, line: str) -> None:
        if path == sink.events_path:
            raise OSError("disk full")
        real(path, line)

    monkeypatch.setattr(sink, "_append", events_fail)
    store = InMemoryStateStore()
    control = Control(Policy.from_yaml(POLICY), store, sinks=(sink,))

    @protect("note.delete", effect="note:{note_id}", control=control)
    def delete(note_id: str) -> str:
        return "deleted"

    with context(agent="agent-1"):
        delete(note_id="n1")
    assert len(sink.receipts_path.read_text(encoding="utf-8").splitlines()) == 1
