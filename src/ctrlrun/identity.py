"""Identity providers: who the principal of a protected call is."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from .action import Principal

__all__ = ["IdentityProvider", "StaticIdentityProvider"]


@runtime_checkable
class IdentityProvider(Protocol):
    """Decides the principal for an action; ``None`` means nobody (the call is denied)."""

    def principal(self, action_name: str) -> Principal | None: ...


class StaticIdentityProvider:
    """Always the same principal: for a worker that only ever acts as one agent."""

    def __init__(self, agent: str, user: str | None = None) -> None:
        self._principal = Principal(agent, user)

    def principal(self, action_name: str) -> Principal | None:
        return self._principal
