"""Context variables shared by ``protect`` and ``Control``: principal, approval, token."""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar, Token
from collections.abc import Iterator

from .errors import InvalidArgument

__all__ = ["context", "with_approval", "idempotency_token", "current_hint", "presented_approval"]

_principal: ContextVar[tuple[str, str | None] | None] = ContextVar("ctrlrun_principal", default=None)
_approval: ContextVar[str | None] = ContextVar("ctrlrun_approval", default=None)
_token: ContextVar[tuple[str, int] | None] = ContextVar("ctrlrun_token", default=None)


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
    """Mark the running executor as the holder of ``effect_key`` at ``attempt``."""
    reset = hold(effect_key, attempt)
    try:
        yield
    finally:
        _token.reset(reset)


def hold(effect_key: str | None, attempt: int) -> Token[tuple[str, int] | None]:
    """``holding_effect`` without the context manager: the token to give ``release``."""
    return _token.set((effect_key, attempt) if effect_key else None)


def release(token: Token[tuple[str, int] | None]) -> None:
    """End what ``hold`` began."""
    _token.reset(token)


def idempotency_token() -> str:
    """A UUID stable within this attempt of this effect key; new after a ``failed`` renewal."""
    from .effect import idempotency_token_for

    held = _token.get()
    if held is None:
        raise InvalidArgument(
            "idempotency_token() works only inside a protected function whose call holds an "
            "effect key (give @protect an effect= template)"
        )
    return idempotency_token_for(*held)
