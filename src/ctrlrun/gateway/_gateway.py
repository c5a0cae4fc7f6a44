"""``Gateway``: one upstream, one alias, one Control; the transports are picked by the config."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, BinaryIO, TextIO

from ..control.front import Control
from .config import GatewayConfig
from .intercept import Interceptor
from .tools import Catalog

if TYPE_CHECKING:
    from .http import Listening

__all__ = ["Gateway"]


class Gateway:
    """Stands between an MCP client and one upstream server; every ``tools/call`` runs through
    ``control``. Tests inject their own Control; the CLI builds one like ``Control.from_file``."""

    def __init__(self, config: GatewayConfig, control: Control, *, stderr: TextIO | None = None) -> None:
        self.config = config
        self.control = control
        self.stderr = stderr if stderr is not None else sys.stderr
        self.catalog = Catalog(control.policy, config.alias, stderr=self.stderr)
        self.interceptor = Interceptor(config, control, self.catalog)

    def serve_stdio(self, stdin: BinaryIO, stdout: BinaryIO, **options: Any) -> int:
        """Relay between ``stdin``/``stdout`` (the host) and the upstream child until either
        side ends; the exit code: 0 when the host closed stdin, 1 when the child exited first."""
        from .stdio import serve_stdio

        return serve_stdio(self.config, self.interceptor, self.catalog, stdin, stdout, stderr=self.stderr, **options)

    def serve_http(self) -> Listening:
        """Listen on ``config.listen`` (path ``/mcp``) in background threads; ``close()`` stops."""
        from .http import serve_http

        return serve_http(self.config, self.interceptor, self.catalog, log=self.stderr)

    def startup_block(self, listening: tuple[str, int] | None = None) -> str:
        """What the gateway says on stderr once serving."""
        config, control = self.config, self.control
        policy = control.policy
        lines = []
        if control.policy.mode == "observe":
            lines.append("OBSERVE MODE — nothing is enforced")
        lines.append("ctrlrun gateway")
        if config.mode == "http":
            host, port = listening if listening is not None else (config.listen or ("?", 0))
            shown = f"[{host}]" if ":" in host else host
            lines.append(f"  mode:        http, listening on http://{shown}:{port}/mcp")
            lines.append(f"  upstream:    {config.upstream_url}")
        else:
            lines.append("  mode:        stdio")
            lines.append(f"  upstream:    {' '.join(config.command)}")
        lines.append(f"  alias:       {config.alias} (actions mcp.{config.alias}.<tool>)")
        lines.append(f"  policy:      {config.policy_path or policy.source} ({control.policy_hash})")
        lines.append(f"  store:       {_store_name(control)}")
        lines.append(f"  environment: {control.environment}")
        if config.principal is not None:
            agent, user = config.principal
            lines.append(f"  principal:   {agent}" + (f" (user {user})" if user else "") + " (configured)")
        else:
            user = f", user from header {config.user_header}" if config.user_header else ""
            lines.append(f"  principal:   from header {config.principal_header}{user}")
            lines.append("  warning:     an identity header is worth what the proxy setting it guarantees: it must "
                         "authenticate the caller and overwrite the header on every request")  # fmt: skip
        prefix = f"mcp.{config.alias}."
        for name in policy.actions:
            if name.startswith(prefix) and policy.effect_template(name) is None:
                lines.append(f"  no effect key: {name} (a retry may repeat its effect; give it effect:)")
        return "\n".join(lines) + "\n"


def _store_name(control: Control) -> str:
    store: Any = control.store
    for attribute in ("path", "schema"):
        value = getattr(store, attribute, None)
        if isinstance(value, (str, os.PathLike)) and str(value):
            return f"{type(store).__name__} {value}"
    return type(store).__name__
