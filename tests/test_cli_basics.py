"""CLI conventions, ``init`` and ``policy check``."""

from __future__ import annotations

import pytest

import ctrlrun
from ctrlrun import Action, Control, InMemoryStateStore, Policy, Principal
from ctrlrun.cli.commands_policy import starter_policy

from ._cli_helpers import invoke, tree
from .vectors import ROOT

COMMANDS = ["init", "demo", "approve", "deny", "pending", "resolve", "effects", "receipts", "policy"]


def test_version(workdir):
    result = invoke(["--version"])
    assert result.code == 0
    assert result.out == f"ctrlrun, version {ctrlrun.__version__}\n"


@pytest.mark.parametrize("command", [[], *([c] for c in COMMANDS), ["policy", "check"]])
def test_help_everywhere(workdir, command):
    result = invoke([*command, "--help"])
    assert result.code == 0, result.err
    assert "Usage:" in result.out
    assert tree(workdir) == []


def test_usage_errors_exit_2(workdir):
    for args in (["nosuchcommand"], ["approve"], ["deny"], ["resolve"], ["receipts", "--bogus"],
                 ["policy", "nosuch"], ["init", "extra"], ["demo", "extra"]):  # fmt: skip
        result = invoke(args)
        assert result.code == 2, args
        assert "Usage:" in result.err and "Error:" in result.err
        assert result.exception is None
    assert tree(workdir) == []


def test_unexpected_error_is_one_line_exit_1(project, monkeypatch):
    def boom(self, limit=None):
        raise RuntimeError("the disk is on fire")

    monkeypatch.setattr(ctrlrun.SQLiteStateStore, "pending_approvals", boom)
    result = invoke(["pending"])
    assert result.code == 1
    assert result.err == "Error: unexpected RuntimeError: the disk is on fire\n"
    assert result.exception is None and "Traceback" not in result.err


# ------------------------------------------------------------------- init


def test_starter_policy_is_the_repository_ctrlrun_yaml():
    assert starter_policy() == (ROOT / "ctrlrun.yaml").read_bytes()


def test_starter_policy_declares_the_required_actions():
    policy = Policy.from_yaml(starter_policy().decode("utf-8"))
    assert policy.schema == "ctrlrun.policy/v2"
    assert set(policy.actions) == {
        "customer.read", "invoice.read", "email.send", "stripe.refund", "iam.grant_admin",
        "k8s.delete_namespace",
    }  # fmt: skip
    assert policy.effect_template("email.send") == "email:{message_id}"
    assert policy.effect_template("stripe.refund") == "refund:{payment_id}"
    assert policy.effect_template("k8s.delete_namespace") == "namespace:{cluster}:{name}"

    def decide(action_name, **arguments):
        return str(policy.evaluate(Action(action_name, arguments, Principal("a"))).decision)

    assert decide("customer.read") == decide("invoice.read") == "allow"
    assert decide("email.send", message_id="m1") == "allow"
    assert decide("stripe.refund", payment_id="p", amount=50_000) == "allow"
    assert decide("stripe.refund", payment_id="p", amount=50_001) == "approve"
    assert decide("stripe.refund", payment_id="p", amount=500_000) == "approve"
    assert decide("stripe.refund", payment_id="p", amount=500_001) == "deny"
    assert decide("stripe.refund", payment_id="p", amount=-1) == "deny"
    assert decide("iam.grant_admin") == "deny"
    assert decide("k8s.delete_namespace", cluster="c", name="n") == "approve"
    assert b"#" in starter_policy()  # it carries comments


def test_init_writes_the_starter_policy(workdir, monkeypatch):
    monkeypatch.setenv("CTRLRUN_CONFIG", str(workdir / "elsewhere" / "policy.yaml"))
    result = invoke(["init"])
    assert result.code == 0, result.err
    assert result.lines == [
        f"wrote {workdir / 'ctrlrun.yaml'}",
        f"created {workdir / '.ctrlrun'}/",
        "edit the policy, then protect an action with @ctrlrun.protect(...)",
    ]
    assert (workdir / "ctrlrun.yaml").read_bytes() == starter_policy()
    assert (workdir / ".ctrlrun").is_dir()
    assert tree(workdir) == [".ctrlrun", "ctrlrun.yaml"]  # no database, CTRLRUN_CONFIG ignored
    Control.from_file(workdir / "ctrlrun.yaml")  # the starter loads and runs


def test_init_refuses_an_existing_policy(workdir):
    (workdir / "ctrlrun.yaml").write_text("mine\n", encoding="utf-8")
    result = invoke(["init"])
    assert result.code == 1
    assert result.err.startswith("Error: ") and "ctrlrun.yaml already exists" in result.err
    assert (workdir / "ctrlrun.yaml").read_text(encoding="utf-8") == "mine\n"
    assert tree(workdir) == ["ctrlrun.yaml"]


def test_init_refuses_a_state_path_that_is_a_file(workdir):
    (workdir / ".ctrlrun").write_text("", encoding="utf-8")
    result = invoke(["init"])
    assert result.code == 1 and "not a directory" in result.err
    assert not (workdir / "ctrlrun.yaml").exists()


# ------------------------------------------------------------------- policy check


def _check_lines(path, policy):
    return [
        f"ok {path}",
        f"schema {policy.schema}  mode {policy.mode}  actions {len(policy.actions)}",
        f"policy_hash {policy.policy_hash}",
    ]


def test_policy_check_default_file(workdir):
    (workdir / "ctrlrun.yaml").write_bytes(starter_policy())
    result = invoke(["policy", "check"])
    assert result.code == 0, result.err
    policy = Policy.from_file(workdir / "ctrlrun.yaml")
    assert result.lines == _check_lines(workdir / "ctrlrun.yaml", policy)
    assert result.lines[1] == "schema ctrlrun.policy/v2  mode enforce  actions 6"
    assert tree(workdir) == ["ctrlrun.yaml"]  # opens no store


def test_policy_check_hash_is_the_receipts_policy_hash(workdir):
    (workdir / "p.yaml").write_bytes(starter_policy())
    result = invoke(["policy", "check", "p.yaml"])
    assert result.code == 0
    control = Control(Policy.from_file(workdir / "p.yaml"), InMemoryStateStore())

    @ctrlrun.protect("customer.read", control=control)
    def read(customer_id: str) -> str:
        return customer_id

    with ctrlrun.context(agent="a"):
        read(customer_id="c1")
    receipt = control.store.receipts()[0]
    assert result.lines[2] == f"policy_hash {receipt.policy_hash}"
    assert result.lines[0] == f"ok {workdir / 'p.yaml'}"


def test_policy_check_uses_ctrlrun_config(workdir, monkeypatch):
    (workdir / "conf").mkdir()
    (workdir / "conf" / "x.yaml").write_bytes(starter_policy())
    monkeypatch.setenv("CTRLRUN_CONFIG", str(workdir / "conf" / "x.yaml"))
    result = invoke(["policy", "check"])
    assert result.code == 0
    assert result.lines[0] == f"ok {workdir / 'conf' / 'x.yaml'}"


def test_policy_check_blank_ctrlrun_config(workdir, monkeypatch):
    monkeypatch.setenv("CTRLRUN_CONFIG", " ")
    result = invoke(["policy", "check"])
    assert result.code == 1 and "CTRLRUN_CONFIG" in result.err


@pytest.mark.parametrize(
    "text, reason",
    [
        (None, "policy file not found"),
        ("schema: ctrlrun.policy/v2\nactions: [\n", "not valid YAML"),
        ("schema: ctrlrun.policy/v2\nactions:\n  a:\n    decision: maybe\n", ""),
        ("schema: ctrlrun.policy/v6\nactions:\n  a:\n    decision: approve\n    approvals_required: 2\n",
         "not enforced by this version"),
    ],
)  # fmt: skip
def test_policy_check_refusals(workdir, text, reason):
    path = workdir / "bad.yaml"
    if text is not None:
        path.write_text(text, encoding="utf-8")
    result = invoke(["policy", "check", "bad.yaml"])
    assert result.code == 1
    assert result.out == ""
    err = result.err.removeprefix("OBSERVE MODE — nothing is enforced\n")  # said first when observing
    assert err.startswith(f"Error: {path}: ")
    assert reason in err
    assert err.count("\n") == 1


def test_ctrl_c_in_any_command_is_a_clean_stop_with_130(project, monkeypatch):
    """A long listing or prune interrupted at the terminal stops quietly, as the servers do."""
    from ctrlrun.cli import commands_receipts

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(commands_receipts, "_print_rows", interrupted)
    result = invoke(["receipts"], clock=project.clock)
    assert result.code == 130 and "Aborted!" not in result.err
    assert result.err.strip() == "ctrlrun receipts: stopped (interrupted)"
