"""The gateway's configuration: one upstream under one alias, and where the principal comes from."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["GatewayConfig", "MIB"]

MIB = 1024 * 1024


@dataclass(frozen=True)
class GatewayConfig:
    """What ``ctrlrun gateway`` was started with (checked by the CLI before anything starts).

    stdio mode: ``command`` is the upstream child's argv and ``principal`` is fixed. http mode:
    ``upstream_url`` and ``listen``; the principal comes from ``principal`` or from the request
    headers ``principal_header``/``user_header``. ``upstream_headers`` are the values to send
    upstream (already read from the environment variables the flags named).
    """

    alias: str
    command: tuple[str, ...] = ()
    upstream_url: str | None = None
    listen: tuple[str, int] | None = None
    principal: tuple[str, str | None] | None = None
    principal_header: str | None = None
    user_header: str | None = None
    allow_remote: bool = False
    allow_origins: tuple[str, ...] = ()
    allow_hosts: tuple[str, ...] = ()
    upstream_headers: tuple[tuple[str, str], ...] = ()
    upstream_ca_file: str | None = None
    upstream_timeout: float = 120.0
    input_timeout: float = 120.0
    max_input_rounds: int = 8
    max_message_bytes: int = MIB
    policy_path: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def mode(self) -> str:
        """``stdio`` or ``http``."""
        return "http" if self.listen is not None else "stdio"
