"""The console's settings, as ``ctrlrun serve`` reads them from its flags."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["NotifySettings"]


@dataclass(frozen=True)
class NotifySettings:
    webhooks: tuple[str, ...]
    format: str            # "json" | "slack"
    secret: bytes | None   # UTF-8 bytes of the env var --webhook-secret-env names
    escalate_after: float | None   # seconds
    escalate_webhook: str | None
    base_url: str | None
