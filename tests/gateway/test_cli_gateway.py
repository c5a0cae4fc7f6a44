"""``ctrlrun gateway``'s start-up refusals: exit 1 naming the flag and the fix, before the child is
started or a port bound; other usage errors exit 2."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from .._cli_helpers import invoke, workdir  # noqa: F401

POLICY = "schema: ctrlrun.policy/v2\nactions:\n  mcp.pay.refund:\n    effect: 'refund:{order_id}'\n    decision: allow\n  mcp.pay.lookup:\n    decision: allow\n"


@pytest.fixture
def policy(workdir: Path) -> Path:  # noqa: F811
    path = workdir / "gw.yaml"
    path.write_text(POLICY)
    return path


def _child(workdir: Path) -> list[str]:
    """A command that leaves a file behind if anyone starts it."""
    return [sys.executable, "-c", f"open({str(workdir / 'started')!r}, 'w')"]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--principal", "a"], "--alias is required"),
        (["--alias", "Pay.x", "--principal", "a"], "--alias 'Pay.x' is not usable"),
        (["--alias", "pay"], "exactly one principal source"),
        (["--alias", "pay", "--principal", "a", "--principal-header", "X-Agent"], "exactly one principal source"),
        (["--alias", "pay", "--principal-header", "X-Agent"], "--principal-header is for http mode"),
        (["--alias", "pay", "--principal", "a", "--allow-origin", "http://x"], "--allow-origin is for http mode"),
        (["--alias", "pay", "--principal", "a", "--user-header", "X-User"], "--user-header needs --principal-header"),
        (["--alias", "pay", "--principal", "a", "--listen", "127.0.0.1:0"], "--listen and --upstream go together"),
        (["--alias", "pay", "--principal", "a", "--upstream-header", "Authorization=NOPE_UNSET_VAR"],
         "--upstream-header is for http mode"),
    ],
)
def test_stdio_refusals_exit_1_before_the_child_starts(workdir: Path, policy: Path, args: list[str], says: str) -> None:  # noqa: F811
    result = invoke(["gateway", "--policy", str(policy), *args, "--", *_child(workdir)])
    assert result.code == 1, result
    assert says in result.err
    assert not (workdir / "started").exists()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--listen", "127.0.0.1:0"], "--listen and --upstream go together"),
        (["--upstream", "http://127.0.0.1:9/mcp"], "--listen and --upstream go together"),
        (["--upstream", "ftp://x/mcp", "--listen", "127.0.0.1:0"], "is not an http(s) URL"),
        (["--upstream", "http://127.0.0.1:9/mcp", "--listen", "0.0.0.0:0"], "add --allow-remote"),
        (["--upstream", "http://127.0.0.1:9/mcp", "--listen", "127.0.0.1:0", "--upstream-header", "Authorization=NOPE_UNSET_VAR"],
         "NOPE_UNSET_VAR is not set"),
        (["--upstream", "http://127.0.0.1:9/mcp", "--listen", "127.0.0.1:0", "--upstream-header", "Authorization"],
         "is not NAME=ENVVAR"),
    ],
)
def test_http_refusals_exit_1(workdir: Path, policy: Path, args: list[str], says: str) -> None:  # noqa: F811
    result = invoke(["gateway", "--alias", "pay", "--principal", "a", "--policy", str(policy), *args])
    assert result.code == 1, result
    assert says in result.err


def test_stdio_needs_an_explicit_policy(workdir: Path, policy: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    (workdir / "ctrlrun.yaml").write_text(POLICY)
    monkeypatch.delenv("CTRLRUN_CONFIG", raising=False)
    result = invoke(["gateway", "--alias", "pay", "--principal", "a", "--", *_child(workdir)])
    assert result.code == 1 and "--policy PATH" in result.err
    assert not (workdir / "started").exists()


def test_a_malformed_value_is_a_usage_error(workdir: Path, policy: Path) -> None:  # noqa: F811
    result = invoke(["gateway", "--alias", "pay", "--principal", "a", "--policy", str(policy),
                     "--upstream", "http://127.0.0.1:9/mcp", "--listen", "nope"])  # fmt: skip
    assert result.code == 2
    result = invoke(["gateway", "--alias", "pay", "--principal", "a", "--upstream-timeout", "-1", "--policy", str(policy),
                     "--", *_child(workdir)])  # fmt: skip
    assert result.code == 2


def test_the_startup_block_names_what_the_gateway_serves(tmp_path: Path) -> None:
    from ctrlrun import Control, InMemoryStateStore, Policy
    from ctrlrun.gateway import Gateway, GatewayConfig

    observe = POLICY.replace("schema: ctrlrun.policy/v2", "schema: ctrlrun.policy/v3\nmode: observe")
    control = Control(Policy.from_yaml(observe), InMemoryStateStore())
    stdio = Gateway(GatewayConfig(alias="pay", command=("python", "server.py"), principal=("agent-1", None)), control)
    block = stdio.startup_block()
    assert block.startswith("OBSERVE MODE — nothing is enforced\n")
    assert "mode:        stdio" in block and "python server.py" in block
    assert "principal:   agent-1 (configured)" in block
    assert "no effect key: mcp.pay.lookup" in block and "mcp.pay.refund (" not in block
    http = Gateway(GatewayConfig(alias="pay", upstream_url="http://127.0.0.1:9/mcp", listen=("127.0.0.1", 0),
                                 principal_header="X-Agent"), control)  # fmt: skip
    block = http.startup_block(("127.0.0.1", 54321))
    assert "listening on http://127.0.0.1:54321/mcp" in block
    assert "from header X-Agent" in block and "overwrite the header" in block
