"""``ctrlrun.gateway``: the MCP gateway (``ctrlrun gateway``) and the operator's MCP server.

Needs the ``mcp`` extra (``pip install '.[mcp]'`` from the clone); ``import ctrlrun`` never
imports this package.
"""
