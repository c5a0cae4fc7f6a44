"""A fake interceptor (forwards once, classifies with ``outcome.classify``, replies the relayed
answer or a ctrlrun error) and a pass-through catalog that records what it was shown."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ctrlrun.gateway import wire
from ctrlrun.gateway.intercept import Forward, Interceptor, Reply
from ctrlrun.gateway.outcome import Observation, classify
from ctrlrun.gateway.tools import Catalog

from .scripted import WAIT


@dataclass
class Seen:
    message: dict[str, Any]
    principal: Any
    revision: str | None
    observation: Observation | None = None
    forwarded: bool = False
    done: threading.Event = field(default_factory=threading.Event)


class FakeInterceptor(Interceptor):
    """Forwards each call once, as it came; ``before`` (if set) runs first, e.g. to wait."""

    def __init__(self) -> None:
        self.seen: list[Seen] = []
        self._changed = threading.Condition()
        self.before: Callable[[Seen], None] | None = None

    def call(self, message: dict[str, Any], *, principal: Any, revision: str | None, forward: Forward, reply: Reply) -> None:
        seen = Seen(message, principal, revision)
        with self._changed:
            self.seen.append(seen)
            self._changed.notify_all()
        try:
            if self.before is not None:
                self.before(seen)
            seen.forwarded = True
            seen.observation = forward(message)
            verdict = classify(seen.observation, revision=revision)
            if verdict.silent:
                return
            if verdict.relay is not None:
                reply(verdict.relay)
            else:
                code = -41011 if verdict.state == "failed" else -41010
                reply(wire.error(message["id"], code, verdict.detail, {"error": wire.CODES[code]}))
        finally:
            seen.done.set()

    def wait_for(self, count: int) -> list[Seen]:
        with self._changed:
            assert self._changed.wait_for(lambda: len(self.seen) >= count, WAIT), f"interceptor saw {len(self.seen)} of {count}"
            return list(self.seen)

    def settled(self, index: int = 0) -> Seen:
        seen = self.wait_for(index + 1)[index]
        assert seen.done.wait(WAIT), "the call never settled"
        return seen


class PassCatalog(Catalog):
    """Relays everything unchanged; records results and notifications; serves given schemas."""

    def __init__(self, schemas: dict[str, dict[str, Any]] | None = None) -> None:
        self.schemas = dict(schemas or {})
        self.results: list[tuple[str | None, dict[str, Any]]] = []
        self.notifications: list[dict[str, Any]] = []

    def relay_result(self, method: str | None, message: dict[str, Any]) -> dict[str, Any]:
        self.results.append((method, message))
        return message

    def relay_notification(self, message: dict[str, Any]) -> None:
        self.notifications.append(message)

    def schema(self, tool: str) -> dict[str, Any] | None:
        return self.schemas.get(tool)
