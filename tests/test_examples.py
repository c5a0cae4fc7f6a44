"""The examples run as documented.

- Every ``examples/*/main.py`` (except the two adapter examples, which their adapters' suites run
  against the real frameworks) runs in a temporary copy of its directory, as a subprocess with
  the ``ctrlrun`` under test on ``PYTHONPATH``, and must exit 0 and print its key lines in order.
- Every example, the adapter ones too where their adapter is installed, runs twice in a row in
  one copy (its ``.ctrlrun/`` kept) and exits 0 both times: a user runs it again.
- Every starter policy in ``examples/policies/`` loads, builds a ``Control`` (so it uses only what
  this version enforces), passes ``ctrlrun policy check``, and decides a few calls as its
  comments say.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import ctrlrun
from ctrlrun import Action, Control, InMemoryStateStore, Policy, Principal
from ctrlrun.cli import cli
from ctrlrun.policy import template_placeholders

from .vectors import ROOT

EXAMPLES = ROOT / "examples"
SRC = Path(ctrlrun.__file__).resolve().parents[1]  # the ctrlrun under test
#: Examples that need a framework; each adapter's own suite runs them.
ADAPTER_EXAMPLES = {
    "langgraph-refund": "adapters/langgraph/tests/test_langgraph_example.py",
    "openai-agents-support": "adapters/openai-agents/tests/test_agents_example.py",
    "pydantic-ai-refund": "adapters/pydantic-ai/tests/test_pydantic_ai_example.py",
    "agent-framework-refund": "adapters/agent-framework/tests/test_agent_framework_example.py",
    "dbos-refund": "adapters/dbos/tests/test_dbos_example.py",
}
APR = r"apr_[0-9a-f]{32}"
#: What each adapter example imports besides ctrlrun; without it the example is skipped here.
ADAPTER_MODULES = {
    "langgraph-refund": "ctrlrun_langgraph", "openai-agents-support": "ctrlrun_openai_agents",
    "pydantic-ai-refund": "ctrlrun_pydantic_ai", "agent-framework-refund": "ctrlrun_agent_framework",
    "dbos-refund": "ctrlrun_dbos",
}  # fmt: skip
#: Lines the second run of a kept-state example prints (the effects happened once, the first time).
SECOND_RUN_LINES = {
    "langgraph-refund": [r"txn_1: not run again \(committed\)", r"stripe was called for: nothing"],
    "openai-agents-support": [r"txn_1: not run again \(committed\)", r"txn_2: not run again \(committed\)",
                              r"stripe was called for: nothing"],  # fmt: skip
    "pydantic-ai-refund": [r"txn_1: not run again \(committed\)", r"txn_2: not run again \(committed\)",
                           r"stripe was called for: nothing"],  # fmt: skip
    "agent-framework-refund": [r"txn_1: not run again \(committed\)", r"txn_2: not run again \(committed\)",
                               r"stripe was called for: nothing"],  # fmt: skip
    "dbos-refund": [r"txn_1: not run again \(committed\), replayed re_txn_1",
                    r"txn_2: not run again \(committed\), replayed re_txn_2",
                    r"stripe was called for: nothing"],  # fmt: skip
}

#: For each program: lines (regular expressions, matched whole) that must appear, in this order.
KEY_LINES: dict[str, list[str]] = {
    "refund-agent": [
        r"  txn_100 EUR 120: refunded \(re_1\)",
        r"  txn_100 EUR 120 again: refused, refund:txn_100 already committed",
        rf"  txn_200 EUR 2,500: needs a human, request {APR}",
        rf"  lead@example\.com approves {APR}, bound to sha256:[0-9a-f]{{16}}\.\.\.",
        r"  txn_200 EUR 3,000 with the approval: refused, approval mismatch",
        r"  txn_200 EUR 2,500 with the approval: refunded \(re_2\)",
        r"  txn_200 EUR 2,500 with it again: refused, approval consumed",
        r"  txn_300 EUR 7,500: denied by policy \(rule\[2\]\)",
        r"  txn_400 EUR -50: denied by policy \(rule\[2\]\)",
        r"stripe refunds: \[\('txn_100', 12000\), \('txn_200', 250000\)\]",
        r"  refund:txn_200  approve/committed  approver=lead@example\.com  controls=\['four-eyes'\]",
        r"chain: 7 of 7 receipts verified, intact=True",
    ],
    "deploy-agent": [
        r"delete staging-eu/preview-412: namespace preview-412 deleted from staging-eu",
        r"delete staging-eu/preview-412: refused, namespace:staging-eu:preview-412 already committed",
        r"delete prod-eu/payments: refused \(approval_denied\)",
        r"delete staging-us/preview-412: namespace preview-412 deleted from staging-us",
        r"web scaled to 4",
        rf"scale web to 200: waiting for on-call \(`ctrlrun approve {APR}`\)",
        r"deleted: staging-eu/preview-412, staging-us/preview-412",
        r"prod-eu still has: default, payments",
        r"  k8s\.delete_namespace  namespace:prod-eu:payments  approve/denied  approver=oncall@example\.com",
        r"pending requests: 1",
    ],
    "reconcile-lost-reply": [
        r"  inv_1001: timed out waiting for the provider; the outcome is unknown \(AMBIGUOUS\)",
        r"  reconcile charge:inv_1001: the provider has a charge for it",
        r"  inv_1001: not charged again, charge:inv_1001 is committed",
        r"  reconcile charge:inv_1002: the provider has no charge for it",
        r"  inv_1002: charged \(ch_3\)",
        r"  inv_1003: still ambiguous; a human runs `ctrlrun resolve charge:inv_1003 --committed` or `--failed`",
        r"provider charges: inv_1001 ch_1, inv_1003 ch_2, inv_1002 ch_3",
        r"  charge:inv_1001  committed  attempt 1  resolved by reconcile:billing\.charge",
        r"  charge:inv_1002  committed  attempt 2",
        r"  charge:inv_1003  ambiguous  attempt 1",
    ],
    "webhook-race": [
        r"  worker-b: refused: ship:ord_42 is in_progress",
        r"  worker-a: shipped the parcel for ord_42",
        r"  worker-c: refused: ship:ord_42 is committed",
        r"warehouse: 1 parcel\(s\): ord_42 shipped by worker-a",
        r"receipt  worker-b  ship:ord_42  allow/blocked  effect ship:ord_42 is held by another attempt \(in_progress\)",
        r"receipt  worker-a  ship:ord_42  allow/committed",
        r"receipt  worker-c  ship:ord_42  allow/blocked  effect ship:ord_42 already committed \(duplicate\)",
    ],
}


def programs() -> list[str]:
    return sorted(p.parent.name for p in EXAMPLES.glob("*/main.py"))


def test_every_example_program_is_checked() -> None:
    assert set(programs()) == set(KEY_LINES) | set(ADAPTER_EXAMPLES)
    for name in programs():
        for required in ("README.md", "ctrlrun.yaml", "main.py"):
            assert (EXAMPLES / name / required).is_file(), f"examples/{name}/{required} is missing"
    for name, test in ADAPTER_EXAMPLES.items():
        assert (ROOT / test).is_file(), f"examples/{name} is run by {test}, which is missing"


def assert_lines_in_order(output: str, expected: list[str]) -> None:
    lines = output.splitlines()
    position = 0
    for pattern in expected:
        compiled = re.compile(pattern)
        while position < len(lines) and not compiled.fullmatch(lines[position]):
            position += 1
        assert position < len(lines), f"missing, in order: {pattern!r}\n--- output ---\n{output}"
        position += 1


def copy_example(name: str, tmp_path: Path) -> Path:
    copy = tmp_path / name
    shutil.copytree(EXAMPLES / name, copy, ignore=shutil.ignore_patterns(".ctrlrun", "__pycache__"))
    return copy


def run_example(name: str, copy: Path) -> str:
    """``python main.py`` in ``copy``; its stdout, once it exited 0."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTRLRUN_")}
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(OPENAI_API_KEY="", OPENAI_AGENTS_DISABLE_TRACING="1")  # the agents example is offline
    done = subprocess.run(
        [sys.executable, "main.py"],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, f"examples/{name}/main.py exited {done.returncode}\n{done.stderr}"
    return done.stdout


@pytest.mark.parametrize("name", sorted(KEY_LINES))
def test_example_runs(name: str, tmp_path: Path) -> None:
    copy = copy_example(name, tmp_path)
    assert_lines_in_order(run_example(name, copy), KEY_LINES[name])
    assert (copy / ".ctrlrun" / "state.db").is_file()


@pytest.mark.parametrize("name", programs())
def test_example_runs_twice_in_a_row(name: str, tmp_path: Path) -> None:
    module = ADAPTER_MODULES.get(name)
    if module is not None and importlib.util.find_spec(module) is None:
        pytest.skip(f"examples/{name} needs {module} (bash adapters/run-tests.sh installs it)")
    copy = copy_example(name, tmp_path)
    run_example(name, copy)
    second = run_example(name, copy)  # the state of the first run is still there
    assert_lines_in_order(second, KEY_LINES.get(name) or SECOND_RUN_LINES[name])


# --------------------------------------------------------------------------- starter policies

#: (action, arguments, decision, reason) per policy file.
DECISIONS: dict[str, list[tuple[str, dict[str, Any], str, str]]] = {
    "devops.yaml": [
        ("k8s.get_logs", {"pod": "web-1"}, "allow", "decision"),
        ("deploy.rollout", {"stage": "staging", "service": "web", "version": "1.4.2"}, "allow", "rule[0]"),
        ("deploy.rollout", {"stage": "production", "service": "web", "version": "1.4.2"}, "approve", "rule[1]"),
        ("deploy.rollout", {"stage": "prod", "service": "web", "version": "1.4.2"}, "deny", "rule[2]"),
        ("k8s.scale_deployment", {"deployment": "web", "replicas": 6}, "allow", "rule[0]"),
        ("k8s.scale_deployment", {"deployment": "web", "replicas": 0}, "approve", "rule[1]"),
        ("k8s.delete_namespace", {"cluster": "eu-1", "name": "preview-9"}, "approve", "decision"),
        ("terraform.apply", {"workspace": "staging", "plan_sha256": "ab12", "resources_destroyed": 0},
         "allow", "rule[0]"),
        ("terraform.apply", {"workspace": "staging", "plan_sha256": "ab12", "resources_destroyed": 3},
         "approve", "rule[1]"),
        ("iam.grant_role", {"principal": "deploy-agent", "role": "admin"}, "deny", "decision"),
        ("k8s.drain_node", {"node": "n1"}, "deny", "unknown_action"),
    ],
    "healthcare.yaml": [
        ("appointment.book", {"patient_id": "p_17", "slot_id": "s_2026_12_01_0900"}, "allow", "decision"),
        ("appointment.cancel", {"patient_id": "p_17", "appointment_id": "a_5", "hours_before": 48},
         "allow", "rule[0]"),
        ("appointment.cancel", {"patient_id": "p_17", "appointment_id": "a_5", "hours_before": 3},
         "approve", "rule[1]"),
        ("patient.update_contact", {"patient_id": "p_17", "change_id": "c_1", "phone": "+15550100",
                                    "email": None}, "approve", "rule[0]"),
        ("prescription.refill", {"patient_id": "p_17", "prescription_id": "rx_3", "refill_number": 2,
                                 "controlled_substance": False, "days_supply": 30}, "approve", "rule[0]"),
        ("prescription.refill", {"patient_id": "p_17", "prescription_id": "rx_4", "refill_number": 1,
                                 "controlled_substance": True, "days_supply": 30}, "deny", "rule[1]"),
        ("records.export", {"patient_id": "p_17", "request_id": "r_1", "destination": "patient_portal"},
         "approve", "rule[0]"),
        ("records.export", {"patient_id": "p_17", "request_id": "r_2", "destination": "email"},
         "deny", "rule[1]"),
        ("patient.merge_records", {"from_id": "p_1", "into_id": "p_2"}, "deny", "decision"),
    ],
    "hr.yaml": [
        ("employee.lookup", {"employee_id": "e_4"}, "allow", "decision"),
        ("leave.approve", {"request_id": "l_1", "days": 3, "leave_type": "vacation"}, "allow", "rule[0]"),
        ("leave.approve", {"request_id": "l_2", "days": 15, "leave_type": "vacation"}, "approve", "rule[1]"),
        ("offer.send", {"candidate_id": "c_9", "requisition_id": "req_2"}, "approve", "decision"),
        ("payroll.adjust", {"employee_id": "e_4", "pay_period": "2026-11", "amount": 25_000},
         "approve", "rule[0]"),
        ("payroll.adjust", {"employee_id": "e_4", "pay_period": "2026-11", "amount": 2_500_000},
         "deny", "rule[1]"),
        ("employee.terminate", {"employee_id": "e_4"}, "deny", "decision"),
    ],
    "security.yaml": [
        ("user.disable", {"user_id": "u_8", "case_id": "case_1", "reason": "credentials_compromised"},
         "allow", "rule[0]"),
        ("user.disable", {"user_id": "u_8", "case_id": "case_2", "reason": "suspicious"}, "approve", "rule[1]"),
        ("host.isolate", {"host_id": "h_3", "case_id": "case_1", "severity": "critical"}, "allow", "rule[0]"),
        ("host.isolate", {"host_id": "h_3", "case_id": "case_3", "severity": "low"}, "approve", "rule[1]"),
        ("firewall.open_port", {"rule_id": "fw_1", "port": 22, "source_cidr": "0.0.0.0/0"}, "deny", "rule[0]"),
        ("firewall.open_port", {"rule_id": "fw_2", "port": 443, "source_cidr": "0.0.0.0/0"},
         "approve", "rule[1]"),
        ("iam.grant_role", {"principal_id": "u_8", "role": "admin"}, "deny", "rule[0]"),
        ("iam.grant_role", {"principal_id": "u_8", "role": "viewer"}, "approve", "rule[1]"),
        ("audit_log.delete", {"log": "auth"}, "deny", "decision"),
    ],
    "ecommerce.yaml": [
        ("order.refund", {"order_id": "o_1", "amount": 4_999}, "allow", "rule[0]"),
        ("order.refund", {"order_id": "o_1", "amount": 60_000}, "approve", "rule[1]"),
        ("order.refund", {"order_id": "o_1", "amount": 0}, "deny", "rule[2]"),
        ("order.cancel", {"order_id": "o_2", "status": "paid"}, "allow", "rule[0]"),
        ("order.cancel", {"order_id": "o_2", "status": "shipped"}, "approve", "rule[1]"),
        ("order.cancel", {"order_id": "o_2", "status": "delivered"}, "deny", "rule[2]"),
        ("coupon.create", {"code": "SORRY10", "percent_off": 10, "single_use": True}, "allow", "rule[0]"),
        ("coupon.create", {"code": "VIP40", "percent_off": 40, "single_use": False}, "approve", "rule[1]"),
        ("coupon.create", {"code": "FREE", "percent_off": 100, "single_use": True}, "deny", "rule[2]"),
        ("customer.erase", {"customer_id": "cu_5"}, "deny", "decision"),
    ],
}


def test_every_starter_policy_is_checked() -> None:
    files = sorted(p.name for p in (EXAMPLES / "policies").glob("*.yaml"))
    assert files == sorted(DECISIONS)
    assert len(files) >= 5


@pytest.mark.parametrize("name", sorted(DECISIONS))
def test_starter_policy(name: str) -> None:
    path = EXAMPLES / "policies" / name
    policy = Policy.from_file(path)
    assert policy.unenforced_features() == []
    Control(policy, InMemoryStateStore())  # refuses any feature this version does not enforce

    result = CliRunner().invoke(cli, ["policy", "check", str(path)], catch_exceptions=False)
    assert result.exit_code == 0, result.output

    agent = Principal("starter-policy-test")
    for action, arguments, decision, reason in DECISIONS[name]:
        evaluation = policy.evaluate(Action(action, arguments, agent))
        assert (str(evaluation.decision), evaluation.reason) == (decision, reason), (action, arguments)
        template = policy.effect_template(action)
        if template is not None:  # the case carries every argument its effect key names
            missing = set(template_placeholders(template)) - set(arguments)
            assert not missing, f"{name}: {action} effect {template!r} needs {sorted(missing)}"


def test_example_readmes_link_to_files_that_exist() -> None:
    link = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
    broken = [
        f"{readme.relative_to(ROOT)}: {target}"
        for readme in sorted(EXAMPLES.glob("*/README.md"))
        for target in link.findall(readme.read_text(encoding="utf-8"))
        if "://" not in target and not (readme.parent / target).exists()
    ]
    assert not broken, "broken links:\n" + "\n".join(broken)
