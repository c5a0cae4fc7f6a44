"""What ``ctrlrun serve`` was started with: the console's own settings and the notifier's."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from .._time import utc_now

__all__ = ["ConsoleSettings", "NotifySettings"]


@dataclass(frozen=True, slots=True)
class NotifySettings:
    """The webhook and escalation flags, handed to ``ctrlrun.console.notify.start_notifier``."""

    webhooks: tuple[str, ...] = ()
    format: str = "json"
    secret: bytes | None = None
    escalate_after: float | None = None
    escalate_webhook: str | None = None
    base_url: str | None = None


@dataclass(frozen=True, slots=True)
class ConsoleSettings:
    """Who may use the console and how (exactly one of ``users_path`` or ``auth_header``)."""

    users_path: Path | None = None
    auth_header: str | None = None
    trusted_proxies: frozenset[str] = frozenset()
    base_url: str | None = None
    secret: bytes = b""
    policy_path: Path | None = None
    clock: Callable[[], datetime] = field(default=utc_now)

    @property
    def secure_cookie(self) -> bool:
        """The session cookie is ``Secure`` when the console is reached over https."""
        return self.base_url is not None and self.base_url.lower().startswith("https://")
