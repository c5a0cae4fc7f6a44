"""Calls that need more input (``input_required``): the pipeline keeps running and keeps its
reservation while the client answers the upstream's questions in a continuation call.

The hold lives in memory only: after a restart the lease lapses and the record turns
``ambiguous``. An approval covers the call as proposed, not the answers given to the upstream.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..action import Action
from .outcome import Forward, Reply, Verdict, classify

if TYPE_CHECKING:
    from ._answers import Answers

__all__ = ["Rounds", "Settling"]


class Settling:
    """A continuation's reply: the continuation's own request returns once it was used."""

    def __init__(self, reply: Reply) -> None:
        self._reply = reply
        self.done = threading.Event()

    def __call__(self, message: dict[str, Any]) -> None:
        try:
            self._reply(message)
        finally:
            self.done.set()

    def settle(self) -> None:
        """Release the continuation's request without an answer (the client cancelled)."""
        self.done.set()


class _Hold:
    def __init__(self, action: Action, request_state: Any) -> None:
        self.action_hash = action.action_hash
        self.request_state = request_state
        self.taken = False
        self.ready = threading.Event()
        self.continuation: tuple[dict[str, Any], Forward, Settling] | None = None


class Rounds:
    """The calls waiting for a continuation, by action hash."""

    def __init__(self, timeout: float) -> None:
        self._timeout = timeout
        self._lock = threading.Lock()
        self._holds: dict[str, _Hold] = {}

    def hold(
        self, action: Action, verdict: Verdict, reply: Reply, answers: Answers, *, revision: str | None,
        flags: dict[str, bool], forward_request: Callable[[dict[str, Any]], dict[str, Any]], max_rounds: int,
    ) -> tuple[Verdict, Reply]:  # fmt: skip
        """Relay each ``input_required`` answer and wait for its continuation; answers the final
        verdict and the reply it goes to."""
        rounds = 0
        while verdict.state == "waiting":
            rounds += 1
            if rounds > max_rounds:
                return Verdict("ambiguous", None, f"the upstream asked for input more than {max_rounds} times"), reply
            assert verdict.relay is not None
            result = verdict.relay.get("result")
            state = result.get("requestState") if isinstance(result, dict) else None
            held = _Hold(action, state)
            with self._lock:
                self._holds[held.action_hash] = held
            reply(answers.with_receipt(verdict.relay, None, "waiting"))
            if isinstance(reply, Settling):
                reply.done.set()
            arrived = held.ready.wait(self._timeout)
            with self._lock:
                held.taken = True
            if not arrived or held.continuation is None:
                self._forget(held)
                return Verdict("ambiguous", None, "no continuation came within --input-timeout", silent=True), reply
            message, forward, reply = held.continuation
            verdict = classify(forward(forward_request(message)), revision=revision,
                               not_executed_on_error=flags["not_executed_on_error"])  # fmt: skip
            if verdict.state != "waiting":
                self._forget(held)
        return verdict, reply

    def abort(self) -> None:
        """End every wait for a continuation (the connection is closing): each turns ambiguous."""
        with self._lock:
            waiting = [held for held in self._holds.values() if not held.taken]
        for held in waiting:
            held.ready.set()

    def _forget(self, held: _Hold) -> None:
        with self._lock:
            if self._holds.get(held.action_hash) is held:
                del self._holds[held.action_hash]

    def continue_call(self, action: Action, params: dict[str, Any], forward: Forward, reply: Reply, answers: Answers) -> None:
        """A ``tools/call`` with ``inputResponses``: hand it to the call that waits for it (same
        principal and action hash, the upstream's ``requestState`` unchanged), and return once
        that call has answered it; else refuse."""
        with self._lock:
            held = self._holds.get(action.action_hash)
            matches = held is not None and (held.request_state is None or params.get("requestState") == held.request_state)
            if held is None or not matches:
                refusal = answers.unknown_continuation()
            elif held.taken:
                refusal = answers.duplicate(answers.effect_key or "", "in_progress")
            else:
                held.taken = True
                settling = Settling(reply)
                held.continuation = ({"jsonrpc": "2.0", "id": answers.request_id, "method": "tools/call",
                                      "params": params}, forward, settling)  # fmt: skip
                refusal = None
        if refusal is not None:
            reply(refusal)
            return
        assert held is not None
        held.ready.set()
        settling.done.wait()
