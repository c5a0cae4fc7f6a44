"""docs/gateway.md's host configuration, run as a host would run it, against the example server."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import anyio

from ..vectors import ROOT
from .conftest import connect
from .e2e import SRC, error_of

DOC_DIR = "/home/ada/refunds"


def _host_configuration() -> dict[str, Any]:
    text = (ROOT / "docs" / "gateway.md").read_text(encoding="utf-8")
    for block in re.findall(r"```json\n(.*?)```", text, flags=re.S):
        if '"mcpServers"' in block and '"gateway"' in block:
            return json.loads(block)["mcpServers"]["pay"]
    raise AssertionError("docs/gateway.md has no mcpServers configuration for the gateway")


def _as_here(configured: dict[str, Any], directory: Path) -> list[str]:
    """The configured command with the page's directory replaced by a fresh one, and its
    virtualenv's programs by this interpreter."""
    venv = f"{DOC_DIR}/.venv/bin/"
    argv = [configured["command"], *configured["args"]]
    out: list[str] = []
    for item in argv:
        if item == venv + "ctrlrun":
            out += [sys.executable, "-m", "ctrlrun"]
        elif item == venv + "python":
            out.append(sys.executable)
        else:
            out.append(item.replace(DOC_DIR, str(directory)))
    return out


def test_the_documented_host_configuration_works_against_the_example_server(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "examples" / "mcp", tmp_path / "examples" / "mcp")
    command = _as_here(_host_configuration(), tmp_path)
    env = {"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"}

    async def host() -> None:
        async with connect("stdio", "auto", command, env=env, cwd="/") as client:
            names = {tool.name for tool in (await client.list_tools()).tools}
            assert names == {"lookup", "refund"}
            looked = await client.call_tool("lookup", {"order_id": "ord_1001"})
            assert not looked.is_error
            small = await client.call_tool("refund", {"order_id": "ord_1001", "amount_cents": 500})
            assert small.meta["com.ctrlrun/receipt"]["result"] == "committed"
            try:
                await client.call_tool("refund", {"order_id": "ord_1002", "amount_cents": 9000})
            except Exception as exc:  # noqa: BLE001 - the SDK's MCPError
                error = error_of(exc)
                assert error is not None and error.code == -41002, exc
            else:
                raise AssertionError("a large refund must wait for a human")

    anyio.run(host)
    assert (tmp_path / "examples" / "mcp" / ".ctrlrun" / "state.db").is_file()  # the store beside the policy
