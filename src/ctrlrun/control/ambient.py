"""Context variables shared by ``protect`` and ``Control``: principal, approval, executor run."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from contextvars import ContextVar, Token
from collections.abc import Iterator

from ..errors import InvalidArgument

__all__ = ["context", "with_approval", "idempotency_token", "current_hint", "presented_approval"]

_principal: ContextVar[tuple[str, str | None] | None] = ContextVar("ctrlrun_principal", default=None)
_approval: ContextVar[str | None] = ContextVar("ctrlrun_approval", default=None)

#: Bumped before every byte ``ctrlrun.transport`` offers outside an open run (a thread that did
#: not copy an executor's context, or outlived the run it copied): a run whose ``foreign`` differs
#: has seen such a byte, so every open run is marked at once, with no registry of them to leak.
_foreign_sends = 0
_foreign_lock = threading.Lock()


class Run:
    """One executor run: the effect key and attempt it holds, and whether a request byte went out
    through ``ctrlrun.transport`` during it (a mark never cleared)."""

    __slots__ = ("effect_key", "attempt", "parent", "foreign", "sent", "token")

    def __init__(self, effect_key: str | None, attempt: int, parent: Run | None) -> None:
        self.effect_key = effect_key or None
        self.attempt = attempt
        self.parent = parent  # the run this one is nested in: a byte sent here is sent there too
        self.foreign = _foreign_sends
        self.sent = False
        self.token: Token[Run | None] | None = None  # None once released

    def clean(self) -> bool:
        """Open, and since it began no transport byte was offered in it nor outside every run."""
        return self.token is not None and not self.sent and self.foreign == _foreign_sends


_run: ContextVar[Run | None] = ContextVar("ctrlrun_run", default=None)


def _check_name(value: object, what: str, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str) or not value.strip():
        raise InvalidArgument(f"{what} must be a non-empty string, got {value!r}")


@contextmanager
def context(agent: str, user: str | None = None) -> Iterator[None]:
    """Bind the principal (who is acting) for protected calls in this block."""
    _check_name(agent, "context(agent=...)")
    _check_name(user, "context(user=...)", optional=True)
    reset = _principal.set((agent, user))
    try:
        yield
    finally:
        _principal.reset(reset)


@contextmanager
def with_approval(request_id: str) -> Iterator[None]:
    """Present an approval id to protected calls in this block; it must still match the action."""
    _check_name(request_id, "with_approval(request_id)")
    reset = _approval.set(request_id)
    try:
        yield
    finally:
        _approval.reset(reset)


def current_hint() -> tuple[str, str | None] | None:
    """The ``(agent, user)`` bound by the innermost ``context()``, if any."""
    return _principal.get()


def presented_approval() -> str | None:
    """The approval id presented by the innermost ``with_approval()``, if any."""
    return _approval.get()


@contextmanager
def holding_effect(effect_key: str | None, attempt: int) -> Iterator[None]:
    """Mark the running executor as the holder of ``effect_key`` at ``attempt``: a fresh run."""
    run = hold(effect_key, attempt)
    try:
        yield
    finally:
        release(run)


def hold(effect_key: str | None, attempt: int) -> Run:
    """``holding_effect`` without the context manager: the handle to give ``release``."""
    run = Run(effect_key, attempt, _run.get())
    run.token = _run.set(run)
    return run


def release(run: Run) -> None:
    """End what ``hold`` began; the run is closed for good."""
    token = run.token
    if token is not None:
        _run.reset(token)
        run.token = None


def current_run() -> Run | None:
    """The executor run this context is in, open or already released; ``None`` outside any."""
    return _run.get()


def offered_byte() -> None:
    """Note that a request byte is about to go out: marks this run and the runs it is nested in,
    or, from outside every open run, every open run."""
    run = _run.get()
    if run is None or run.token is None:
        global _foreign_sends
        with _foreign_lock:
            _foreign_sends += 1
        return
    while run is not None:
        run.sent = True
        run = run.parent


def idempotency_token() -> str:
    """A UUID stable within this attempt of this effect key; new after a ``failed`` renewal."""
    from ..effects.records import idempotency_token_for

    run = _run.get()
    if run is None or run.effect_key is None:
        raise InvalidArgument(
            "idempotency_token() works only inside a protected function whose call holds an "
            "effect key (give @protect an effect= template)"
        )
    return idempotency_token_for(run.effect_key, run.attempt)
