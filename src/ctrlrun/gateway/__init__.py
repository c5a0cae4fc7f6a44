"""``ctrlrun.gateway``: the MCP gateway (``ctrlrun gateway``) and the operator's MCP server.

Needs the ``mcp`` extra (``pip install '.[mcp]'`` from the clone) for HTTP and the operator;
``import ctrlrun`` never imports this package.
"""

from ._gateway import Gateway
from .config import GatewayConfig

__all__ = ["Gateway", "GatewayConfig"]
