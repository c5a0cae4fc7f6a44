"""Policy engine unit tests: loading, discovery, messages, accessors, hashing and templates."""

from __future__ import annotations

import base64
import enum
import hashlib
import logging
import os
import sys
from pathlib import Path

import pytest

from ctrlrun.action import Action, Principal
from ctrlrun.errors import EffectKeyError, InvalidArgument, PolicyError
from ctrlrun.policy import (
    Decision,
    Evaluation,
    Placeholder,
    Policy,
    TemplateSyntaxError,
    parse_template,
    render_effect_key,
    render_resource,
    template_placeholders,
)

REPO = Path(__file__).resolve().parents[1]

WORKED_EXAMPLE = """\
schema: ctrlrun.policy/v2
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    rules: [ { when: { amount_gte: 0, amount_lte: 50000 }, decision: allow }, { decision: approve } ]
"""
WORKED_HASH = "sha256:c7e429e14f9cc39ecf382d0fecc0b56db5562f6cc7fd996b9d40c7e446692401"


def act(action_name: str, /, **arguments: object) -> Action:
    return Action(action_name, arguments, Principal("agent"))


def load(text: str) -> Policy:
    return Policy.from_yaml(text)


def refused(text: str, *fragments: str) -> str:
    with pytest.raises(PolicyError) as info:
        Policy.from_yaml(text, source="p.yaml")
    message = str(info.value)
    assert message.startswith("p.yaml: "), message
    for fragment in fragments:
        assert fragment in message, message
    return message


# -- the worked example and the hash ---------------------------------------------------------


def test_worked_example_hash() -> None:
    policy = load(WORKED_EXAMPLE)
    assert policy.policy_hash == WORKED_HASH
    assert policy.runtime_hash() == WORKED_HASH
    assert policy.runtime_hash("production") == WORKED_HASH


def test_worked_example_hash_in_block_style_with_comments() -> None:
    text = """\
# a comment
schema: "ctrlrun.policy/v2"
actions:
  stripe.refund:
    rules:
      - decision: allow     # band
        when:
          amount_lte: 0xC350
          amount_gte: 0
      - decision: approve
    effect: 'refund:{payment_id}'
"""
    assert load(text).policy_hash == WORKED_HASH


def test_runtime_hash_substitutes_environment() -> None:
    policy = load(WORKED_EXAMPLE)
    staging = policy.runtime_hash("staging")
    assert staging != WORKED_HASH
    assert staging.startswith("sha256:") and len(staging) == 71
    documented = load(
        WORKED_EXAMPLE.replace("ctrlrun.policy/v2", "ctrlrun.policy/v3") + "environment: staging\n"
    )
    assert documented.environment == "staging"
    assert documented.runtime_hash() == documented.policy_hash
    assert documented.runtime_hash("staging") == documented.policy_hash
    assert documented.runtime_hash("production") != documented.policy_hash
    with pytest.raises(InvalidArgument):
        policy.runtime_hash("")


def test_hash_quirks_raw_actions() -> None:
    base = "schema: ctrlrun.policy/v4\nactions:\n  a: {decision: allow}\n"
    explicit = "schema: ctrlrun.policy/v4\nmode: enforce\nenvironment: production\nactions:\n  a: {decision: allow}\n"
    assert load(base).policy_hash == load(explicit).policy_hash
    as_rule = "schema: ctrlrun.policy/v4\nactions:\n  a: {rules: [{decision: allow}]}\n"
    assert load(base).policy_hash != load(as_rule).policy_hash
    with_null = "schema: ctrlrun.policy/v4\nactions:\n  a: {decision: allow, effect: null}\n"
    assert load(base).policy_hash != load(with_null).policy_hash
    empty_registry = base + "controls: {}\n"
    assert load(base).policy_hash != load(empty_registry).policy_hash
    assert load(base + "controls: null\n").policy_hash == load(base).policy_hash
    labelled = base + "version: '2026.2'\n"
    assert load(labelled).policy_hash == load(base).policy_hash
    assert load(labelled).version == "2026.2"
    observe = "schema: ctrlrun.policy/v4\nmode: observe\nactions:\n  a: {decision: allow}\n"
    assert load(observe).policy_hash != load(base).policy_hash


# -- the starter policy -----------------------------------------------------------------------


def test_starter_policy_loads_and_decides() -> None:
    policy = Policy.from_file(REPO / "ctrlrun.yaml")
    assert policy.schema == "ctrlrun.policy/v2"
    assert policy.mode == "enforce"
    assert set(policy.actions) == {
        "customer.read",
        "invoice.read",
        "email.send",
        "stripe.refund",
        "iam.grant_admin",
        "k8s.delete_namespace",
    }
    assert policy.unenforced_features() == []

    def decide(action_name: str, /, **arguments: object) -> tuple[Decision, str]:
        evaluation = policy.evaluate(act(action_name, **arguments))
        return evaluation.decision, evaluation.reason

    assert decide("customer.read", customer_id="cus_1") == (Decision.ALLOW, "decision")
    assert decide("invoice.read", invoice_id="in_1") == (Decision.ALLOW, "decision")
    assert decide("stripe.refund", payment_id="p", amount=50000) == (Decision.ALLOW, "rule[0]")
    assert decide("stripe.refund", payment_id="p", amount=500000) == (Decision.APPROVE, "rule[1]")
    assert decide("stripe.refund", payment_id="p", amount=500001) == (Decision.DENY, "rule[2]")
    assert decide("iam.grant_admin", user="u") == (Decision.DENY, "decision")
    assert decide("k8s.delete_namespace", cluster="c", name="n") == (Decision.APPROVE, "decision")
    assert policy.effect_template("k8s.delete_namespace") == "namespace:{cluster}:{name}"
    assert decide("email.send", message_id="m1") == (Decision.ALLOW, "decision")
    assert policy.effect_template("email.send") == "email:{message_id}"
    assert policy.effect_template("stripe.refund") == "refund:{payment_id}"
    assert decide("unknown.action") == (Decision.DENY, "unknown_action")


# -- from_file ----------------------------------------------------------------------------------

SIMPLE = "schema: ctrlrun.policy/v1\nactions:\n  a: {decision: allow}\n"


def test_from_file_explicit_path(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(SIMPLE, encoding="utf-8")
    policy = Policy.from_file(path)
    assert policy.source == str(path)
    assert Policy.from_file(str(path)).policy_hash == policy.policy_hash


def test_from_file_env_then_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    configured = tmp_path / "configured.yaml"
    configured.write_text(SIMPLE, encoding="utf-8")
    local = tmp_path / "cwd"
    local.mkdir()
    (local / "ctrlrun.yaml").write_text(SIMPLE.replace("allow", "deny"), encoding="utf-8")
    monkeypatch.chdir(local)
    monkeypatch.setenv("CTRLRUN_CONFIG", str(configured))
    assert Policy.from_file().source == str(configured)
    monkeypatch.delenv("CTRLRUN_CONFIG")
    policy = Policy.from_file()
    assert policy.source == str(local / "ctrlrun.yaml")
    assert policy.evaluate(act("a")).decision is Decision.DENY


@pytest.mark.parametrize("value", ["", "   ", "\t\n"])
def test_from_file_blank_env_refused(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CTRLRUN_CONFIG", value)
    with pytest.raises(PolicyError, match="CTRLRUN_CONFIG"):
        Policy.from_file()


def test_from_file_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(PolicyError, match="not found") as info:
        Policy.from_file(missing)
    assert str(missing) in str(info.value)
    monkeypatch.delenv("CTRLRUN_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PolicyError) as info:
        Policy.from_file()
    assert str(tmp_path / "ctrlrun.yaml") in str(info.value)


def test_from_file_directory(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="directory") as info:
        Policy.from_file(tmp_path)
    assert str(tmp_path) in str(info.value)


def test_from_file_undecodable(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(SIMPLE.encode() + b"# caf\xe9\n")
    with pytest.raises(PolicyError, match="UTF-8") as info:
        Policy.from_file(path)
    assert str(path) in str(info.value)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs mkfifo")
def test_from_file_not_a_regular_file(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    with pytest.raises(PolicyError, match="regular file"):
        Policy.from_file(fifo)


@pytest.mark.skipif(
    sys.platform == "win32" or (hasattr(os, "geteuid") and os.geteuid() == 0),
    reason="root can read any file",
)
def test_from_file_unreadable(tmp_path: Path) -> None:
    path = tmp_path / "secret.yaml"
    path.write_text(SIMPLE, encoding="utf-8")
    path.chmod(0)
    try:
        with pytest.raises(PolicyError, match="cannot be read"):
            Policy.from_file(path)
    finally:
        path.chmod(0o600)


def test_from_file_read_error_is_policy_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "denied.yaml"
    path.write_text(SIMPLE, encoding="utf-8")

    def deny(self: Path) -> bytes:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", deny)
    with pytest.raises(PolicyError, match="cannot be read") as info:
        Policy.from_file(path)
    assert str(path) in str(info.value)


def test_from_file_bom_and_markers(tmp_path: Path) -> None:
    path = tmp_path / "bom.yaml"
    path.write_bytes(b"\xef\xbb\xbf---\n" + SIMPLE.encode() + b"...\n")
    assert Policy.from_file(path).policy_hash == load(SIMPLE).policy_hash


def test_from_file_error_names_path(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "schema: ctrlrun.policy/v1\nactions:\n  a: {decision: maybe}\n", encoding="utf-8"
    )
    with pytest.raises(PolicyError) as info:
        Policy.from_file(path)
    assert str(info.value).startswith(f"{path}: ")
    assert "action 'a'" in str(info.value)


# -- strict YAML ------------------------------------------------------------------------------


def test_duplicate_key_names_key_and_line() -> None:
    text = "schema: ctrlrun.policy/v1\nactions:\n  a:\n    decision: allow\n    decision: deny\n"
    refused(text, "not valid YAML", "duplicate key 'decision'", "line 5", "line 4")


def test_duplicate_top_level_key() -> None:
    refused(
        "schema: ctrlrun.policy/v1\nschema: ctrlrun.policy/v2\nactions: {}\n",
        "not valid YAML",
        "'schema'",
    )


def test_duplicate_key_inside_operand_mapping() -> None:
    text = "schema: ctrlrun.policy/v1\nactions:\n  a:\n    rules:\n      - when: {m_eq: {x: 1, x: 2}}\n        decision: allow\n"
    refused(text, "not valid YAML", "duplicate key 'x'")


def test_bool_and_int_keys_are_not_duplicates_of_each_other() -> None:
    text = "schema: ctrlrun.policy/v1\nactions:\n  a:\n    rules:\n      - when: {m_eq: {1: a, true: b}}\n        decision: allow\n"
    message = refused(text)
    assert "duplicate" not in message


@pytest.mark.parametrize(
    "text",
    [
        "schema: ctrlrun.policy/v1\nactions: !!python/name:os.system {}\n",
        "schema: ctrlrun.policy/v1\nactions: !custom {}\n",
        "schema: ctrlrun.policy/v1\nactions: {}\n--- \nschema: x\n",
        "schema: ctrlrun.policy/v1\nactions: {a: {decision: allow}\n",
        "schema: ctrlrun.policy/v1\nactions:\n  base: &b {decision: allow}\n  a: {<<: *b}\n",
    ],
)
def test_yaml_refusals(text: str) -> None:
    refused(text, "not valid YAML")


def test_recursive_alias_refused() -> None:
    text = "schema: ctrlrun.policy/v1\nactions:\n  a:\n    rules:\n      - when: {x_in: &r [*r]}\n        decision: allow\n"
    refused(text, "not valid YAML", "recursive")


def test_alias_bomb_refused() -> None:
    lines = ["schema: ctrlrun.policy/v1", "x0: &x0 [a, a, a, a, a, a, a, a, a, a]"]
    for i in range(1, 8):
        prev = f"*x{i - 1}"
        lines.append(f"x{i}: &x{i} [{', '.join([prev] * 10)}]")
    lines.append("actions: {}")
    refused("\n".join(lines) + "\n", "not valid YAML", "aliases")


def test_anchors_expand_into_the_hash() -> None:
    aliased = "schema: ctrlrun.policy/v1\nactions:\n  a: &e {decision: allow}\n  b: *e\n"
    spelled = (
        "schema: ctrlrun.policy/v1\nactions:\n  a: {decision: allow}\n  b: {decision: allow}\n"
    )
    assert load(aliased).policy_hash == load(spelled).policy_hash


def test_bytes_text_accepted_and_checked() -> None:
    assert Policy.from_yaml(SIMPLE.encode()).policy_hash == load(SIMPLE).policy_hash
    with pytest.raises(PolicyError, match="UTF-8"):
        Policy.from_yaml(b"\xff\xfe")


# -- messages name the place ------------------------------------------------------------------


def test_message_names_action_rule_and_key() -> None:
    text = """\
schema: ctrlrun.policy/v1
actions:
  stripe.refund:
    rules:
      - when: { amount_lte: 50000 }
        decision: allow
      - when: { amount_lte: 500.0 }
        decision: approve
"""
    message = refused(
        text, "action 'stripe.refund'", "rule[1]", "amount_lte", "float", "minor units"
    )
    assert "line 7" in message


def test_message_for_schema_gate_names_required_schema() -> None:
    text = "schema: ctrlrun.policy/v4\nactions:\n  a: {decision: allow, max_attempts: 2}\n"
    refused(text, "action 'a'", "max_attempts", "ctrlrun.policy/v5", "ctrlrun.policy/v4")


def test_message_for_unknown_schema_lists_all() -> None:
    message = refused("schema: ctrlrun.policy/v9\nactions: {}\n", "unknown policy schema")
    for n in range(1, 9):
        assert f"ctrlrun.policy/v{n}" in message


def test_gate_applies_even_to_null_value() -> None:
    refused(
        "schema: ctrlrun.policy/v1\nactions:\n  a: {decision: allow, effect: null}\n",
        "effect",
        "ctrlrun.policy/v2",
    )
    refused(
        "schema: ctrlrun.policy/v2\nauthority: null\nactions: {}\n",
        "authority",
        "ctrlrun.policy/v3",
    )


def test_numeric_operand_message_mentions_minor_units() -> None:
    refused(
        "schema: ctrlrun.policy/v1\nactions:\n  a:\n    rules: [{when: {amount_gte: '5'}, decision: allow}]\n",
        "amount_gte",
        "integer minor units",
    )


def test_unknown_operator_lists_operators() -> None:
    refused(
        "schema: ctrlrun.policy/v1\nactions:\n  a:\n    rules: [{when: {amount_between: 5}, decision: allow}]\n",
        "eq, neq, lt, lte, gt, gte, in",
    )


def test_reserved_subject_message() -> None:
    refused(
        "schema: ctrlrun.policy/v8\nactions:\n  a:\n    rules: [{when: {principal_eq: x}, decision: allow}]\n",
        "arguments only",
        "rename",
    )


# -- more load rules ----------------------------------------------------------------------------


def test_controls_below_v4_only_empty() -> None:
    ok = load("schema: ctrlrun.policy/v1\nactions:\n  a: {decision: allow, controls: []}\n")
    assert ok.evaluate(act("a")).controls == ()
    refused(
        "schema: ctrlrun.policy/v1\nactions:\n  a: {decision: allow, controls: [x]}\n", "'x'", "v4"
    )


def test_controls_citations_rules() -> None:
    head = "schema: ctrlrun.policy/v6\ncontrols:\n  b: {title: B}\n  a: {title: A, approver_role: fin}\n"
    refused(head + "actions:\n  x: {decision: allow, controls: a}\n", "list")
    refused(head + "actions:\n  x: {decision: allow, controls: ['']}\n", "control id")
    refused(head.replace("fin}", "' fin'}") + "actions: {}\n", "approver_role")
    refused(head.replace("B}", "'  '}") + "actions: {}\n", "title")
    refused(
        head.replace("{title: B}", "{title: B, owner: me}") + "actions: {}\n", "unknown key 'owner'"
    )
    refused("schema: ctrlrun.policy/v4\ncontrols:\n  '\u200b': {title: T}\nactions: {}\n", "U+200B")
    refused(
        "schema: ctrlrun.policy/v4\ncontrols:\n  " + "c" * 201 + ": {title: T}\nactions: {}\n",
        "200",
    )
    policy = load(
        head
        + "actions:\n  x:\n    controls: [a, a]\n    rules:\n      - {when: {n_gt: 1}, decision: approve, controls: [a, b]}\n      - {decision: allow}\n"
    )
    assert policy.evaluate(act("x", n=2)).controls == ("b", "a")
    assert policy.evaluate(act("x", n=1)).controls == ("a",)
    assert policy.evaluate(act("y")).controls == ()
    registry = policy.controls_registry
    assert registry is not None and list(registry) == ["b", "a"]
    assert registry["a"]["approver_role"] == "fin"
    assert policy.control("a") is not None and policy.control("a").title == "A"
    assert load(SIMPLE).controls_registry is None


def test_data_labels() -> None:
    policy = load(
        "schema: ctrlrun.policy/v4\nactions:\n  p:\n    data: {pid: phi, note: {label: internal}}\n    decision: allow\n"
    )
    assert dict(policy.data_labels("p")) == {"pid": "phi", "note": "internal"}
    assert dict(policy.data_labels("nope")) == {}
    refused(
        "schema: ctrlrun.policy/v4\nactions:\n  p:\n    data: {pid: {lbl: phi}}\n    decision: allow\n",
        "label",
    )
    refused(
        "schema: ctrlrun.policy/v4\nactions:\n  p:\n    data: [pid]\n    decision: allow\n",
        "mapping",
    )
    refused(
        "schema: ctrlrun.policy/v4\nactions:\n  p:\n    data: {pid: '  '}\n    decision: allow\n",
        "label",
    )


def test_data_scope_placeholder_in_resource_refused() -> None:
    refused(
        "schema: ctrlrun.policy/v2\nactions:\n  a: {decision: allow, resource: 'r:{data_scope}'}\n",
        "data_scope",
    )


def test_reserved_change_action_templates_exempt() -> None:
    policy = load(
        "schema: ctrlrun.policy/v6\nactions:\n  ctrlrun.policy.change:\n    effect: 'policy:{to}'\n    decision: approve\n"
    )
    assert policy.effect_template("ctrlrun.policy.change") == "policy:{to}"
    assert policy.reachable_decisions("ctrlrun.policy.change") == {Decision.APPROVE}
    refused(
        "schema: ctrlrun.policy/v6\nactions:\n  a: {decision: allow, effect: 'x:ctrlrun.policy.change'}\n",
        "reserved",
    )


def test_reachable_decisions() -> None:
    policy = load(
        "schema: ctrlrun.policy/v1\nactions:\n  a:\n    rules: [{when: {n_gt: 1}, decision: approve}]\n  b:\n    rules: [{when: {n_gt: 1}, decision: approve}, {decision: allow}]\n"
    )
    assert policy.reachable_decisions("a") == {Decision.APPROVE, Decision.DENY}
    assert policy.reachable_decisions("b") == {Decision.APPROVE, Decision.ALLOW}
    assert policy.reachable_decisions("zzz") == {Decision.DENY}


def test_top_level_properties() -> None:
    policy = load(
        "schema: ctrlrun.policy/v4\nenvironment: staging\nmode: observe\nversion: v7\nactions:\n  b: {decision: deny}\n  a: {decision: allow}\n"
    )
    assert (policy.schema, policy.mode, policy.environment, policy.version) == (
        "ctrlrun.policy/v4",
        "observe",
        "staging",
        "v7",
    )
    assert policy.actions == ("b", "a")
    assert policy.source == "<string>"
    assert policy.authority is None
    assert policy.evaluate(act("a")).decision is Decision.ALLOW
    assert policy.unenforced_features() == []  # observe mode is enforced as observing
    plain = load(SIMPLE)
    assert (plain.mode, plain.environment, plain.version) == ("enforce", None, None)
    assert "Policy(" in repr(plain)


# -- accessors and unenforced features --------------------------------------------------------


def test_accessor_defaults_for_unknown_action() -> None:
    policy = load(SIMPLE)
    for name in ("a", "unknown"):
        assert policy.effect_template(name) is None
        assert policy.resource_template(name) is None
        assert policy.mcp_options(name) == {"not_executed_on_error": False}
        assert policy.max_attempts(name) is None
        assert policy.approvals_required(name) == 1
        assert policy.upstream_pin(name) is None
        assert dict(policy.data_labels(name)) == {}


def test_accessors_read_entry_settings() -> None:
    digest = "sha256:" + "b" * 64
    policy = load(
        f"""\
schema: ctrlrun.policy/v8
actions:
  a:
    effect: "e:{{id}}"
    resource: "r:{{id}}"
    mcp: {{not_executed_on_error: yes}}
    max_attempts: 3
    approvals_required: 2
    upstream: {{tls_cert_sha256: ["{digest}"], tool_schema_sha256: "{digest}"}}
    decision: approve
"""
    )
    assert policy.effect_template("a") == "e:{id}"
    assert policy.resource_template("a") == "r:{id}"
    assert policy.mcp_options("a") == {"not_executed_on_error": True}
    assert policy.max_attempts("a") == 3
    assert policy.approvals_required("a") == 2
    pin = policy.upstream_pin("a")
    assert (
        pin is not None
        and pin["tls_cert_sha256"] == (digest,)
        and pin["tool_schema_sha256"] == digest
    )
    assert policy.unenforced_features() == [
        "approvals_required: (a: 2)",
        "upstream: (a)",
    ]


def test_null_entry_keys_behave_as_absent() -> None:
    policy = load(
        "schema: ctrlrun.policy/v8\nactions:\n  a: {decision: allow, effect: null, resource: null, mcp: null, data: null, controls: null, upstream: null}\n"
    )
    assert policy.effect_template("a") is None
    assert policy.upstream_pin("a") is None
    assert policy.unenforced_features() == []
    refused(
        "schema: ctrlrun.policy/v8\nactions:\n  a: {decision: allow, max_attempts: null}\n",
        "max_attempts",
    )
    refused(
        "schema: ctrlrun.policy/v8\nactions:\n  a: {decision: allow, approvals_required: null}\n",
        "approvals_required",
    )


def test_authority_is_validated_and_enforced() -> None:
    text = """\
schema: ctrlrun.policy/v7
authority:
  grants:
    - id: g1
      subject: {agent: support}
      actions: [stripe.refund]
      tasks: [t1]
      constraints: {amount_lte: 2000}
actions:
  stripe.refund: {decision: allow}
"""
    policy = load(text)
    assert policy.authority is not None
    assert policy.authority["grants"][0]["id"] == "g1"
    assert policy.unenforced_features() == []  # a Control enforces it
    assert policy.evaluate(act("stripe.refund", amount=5)).decision is Decision.ALLOW
    refused(text.replace("amount_lte: 2000", "amount_lte: 20.5"), "authority", "float")
    refused(text.replace("id: g1", "id: ''"), "id")
    refused(text.replace("      tasks: [t1]\n", "      mode: observe\n"), "top-level")
    refused(text.replace("[stripe.refund]", "stripe.refund"), "actions")
    refused(text.replace("subject: {agent: support}", "subject: {agent: support, role: x}"), "role")
    two = text.replace(
        "actions:\n  stripe",
        "    - {id: g1, subject: {agent: a}, actions: [x]}\nactions:\n  stripe",
    )
    refused(two, "used twice")


def test_upstream_certificate_files(tmp_path: Path) -> None:
    der = b"not really DER but bytes all the same"
    pem = (
        b"-----BEGIN CERTIFICATE-----\n" + base64.encodebytes(der) + b"-----END CERTIFICATE-----\n"
    )
    (tmp_path / "cert.pem").write_bytes(pem)
    digest = "sha256:" + hashlib.sha256(der).hexdigest()
    other = "sha256:" + "c" * 64
    text = f"schema: ctrlrun.policy/v8\nactions:\n  a:\n    decision: allow\n    upstream: {{tls_cert_file: cert.pem, tls_cert_sha256: [{other}, {digest}]}}\n"
    path = tmp_path / "ctrlrun.yaml"
    path.write_text(text, encoding="utf-8")
    pin = Policy.from_file(path).upstream_pin("a")
    assert pin is not None and pin["tls_cert_file"] == (str(tmp_path / "cert.pem"),)
    path.write_text(text.replace(f", {digest}", ""), encoding="utf-8")
    with pytest.raises(PolicyError, match="matches"):
        Policy.from_file(path)
    (tmp_path / "empty.pem").write_text("nothing here\n")
    path.write_text(text.replace("cert.pem", "empty.pem"), encoding="utf-8")
    with pytest.raises(PolicyError, match="no PEM certificate"):
        Policy.from_file(path)
    path.write_text(text.replace("cert.pem", "missing.pem"), encoding="utf-8")
    with pytest.raises(PolicyError, match="cannot be read"):
        Policy.from_file(path)
    refused(
        "schema: ctrlrun.policy/v8\nactions:\n  a: {decision: allow, upstream: {}}\n",
        "pins nothing",
    )
    refused(
        "schema: ctrlrun.policy/v8\nactions:\n  a: {decision: allow, upstream: {tool_schema_sha256: [x]}}\n",
        "digest",
    )


# -- evaluation details -----------------------------------------------------------------------


def test_evaluation_is_frozen_and_unpacks() -> None:
    policy = load(WORKED_EXAMPLE)
    evaluation = policy.evaluate(act("stripe.refund", payment_id="p", amount=1))
    decision, reason, controls = evaluation
    assert (decision, reason, controls) == (Decision.ALLOW, "rule[0]", ())
    assert str(decision) == "allow" and f"{decision}" == "allow"
    assert isinstance(evaluation, Evaluation)
    with pytest.raises(AttributeError):
        evaluation.reason = "x"  # type: ignore[misc]
    assert [str(d) for d in Decision] == ["allow", "approve", "deny"]


def test_evaluate_never_raises_on_garbage() -> None:
    policy = load(WORKED_EXAMPLE)

    class Weird:
        name = "stripe.refund"

        @property
        def arguments(self) -> dict[str, object]:
            raise RuntimeError("boom")

    assert policy.evaluate(Weird()).decision is Decision.DENY
    assert policy.evaluate(object()).decision is Decision.DENY
    assert policy.evaluate(None).decision is Decision.DENY


def test_warning_names_action_key_argument_and_carried(caplog: pytest.LogCaptureFixture) -> None:
    policy = load(
        "schema: ctrlrun.policy/v1\nactions:\n  r:\n    rules: [{when: {amont_gte: 1}, decision: deny}, {decision: allow}]\n"
    )
    with caplog.at_level(logging.WARNING, logger="ctrlrun.policy"):
        assert policy.evaluate(act("r", amount=5, currency="EUR")).decision is Decision.ALLOW
    (record,) = [r for r in caplog.records if r.name == "ctrlrun.policy"]
    message = record.getMessage()
    for fragment in ("'r'", "'amont_gte'", "'amont'", "'amount'", "'currency'"):
        assert fragment in message


def test_type_warning_does_not_log_the_value(caplog: pytest.LogCaptureFixture) -> None:
    policy = load(
        "schema: ctrlrun.policy/v1\nactions:\n  r:\n    rules: [{when: {card_lte: 5}, decision: allow}]\n"
    )
    with caplog.at_level(logging.WARNING, logger="ctrlrun.policy"):
        policy.evaluate(act("r", card="4242424242424242"))
    text = " ".join(r.getMessage() for r in caplog.records)
    assert "card_lte" in text and "string" in text
    assert "4242" not in text


def test_data_scope_numeric_warns(caplog: pytest.LogCaptureFixture) -> None:
    policy = load(
        "schema: ctrlrun.policy/v4\nactions:\n  p:\n    data: {pid: phi}\n    rules: [{when: {data_scope_gte: 1}, decision: allow}]\n"
    )
    with caplog.at_level(logging.WARNING, logger="ctrlrun.policy"):
        assert policy.evaluate(act("p", pid=1)).reason == "no_matching_rule"
    assert any("data_scope" in r.getMessage() for r in caplog.records)


def test_data_scope_non_list_operand() -> None:
    policy = load(
        "schema: ctrlrun.policy/v4\nactions:\n  p:\n    data: {pid: phi}\n    rules:\n      - {when: {data_scope_eq: phi}, decision: deny}\n      - {when: {data_scope_neq: phi}, decision: approve}\n"
    )
    assert policy.evaluate(act("p", pid=1)).decision is Decision.APPROVE


def test_argument_named_data_scope_does_not_shadow_the_derived_set() -> None:
    policy = load(
        "schema: ctrlrun.policy/v1\nactions:\n  p:\n    rules: [{when: {data_scope_eq: []}, decision: allow}]\n"
    )
    assert policy.evaluate(act("p", data_scope=["x"])).decision is Decision.ALLOW


def test_conditions_see_canonical_arguments() -> None:
    policy = load(
        "schema: ctrlrun.policy/v1\nactions:\n  p:\n    rules: [{when: {v_eq: [1, 2], m_eq: {k: [a]}}, decision: allow}]\n"
    )
    assert policy.evaluate(act("p", v=(1, 2), m={"k": ("a",)})).decision is Decision.ALLOW


def test_enum_and_subclass_arguments_compare_as_their_canonical_values() -> None:
    class Currency(enum.StrEnum):
        EUR = "EUR"

    class Cents(enum.IntEnum):
        TEN = 10

    policy = load(
        "schema: ctrlrun.policy/v1\nactions:\n  p:\n    rules: [{when: {c_eq: EUR, n_lte: 10, l_eq: {a: [10, EUR]}}, decision: allow}]\n"
    )
    action = act("p", c=Currency.EUR, n=Cents.TEN, l={"a": (Cents.TEN, Currency.EUR)})
    assert policy.evaluate(action).decision is Decision.ALLOW
    canonical = Action("p", action.canonical_arguments, Principal("agent"))
    assert policy.evaluate(canonical) == policy.evaluate(action)


# -- templates --------------------------------------------------------------------------------


def test_parse_template() -> None:
    assert parse_template("refund:{payment_id}") == ("refund:", Placeholder("payment_id"))
    assert parse_template("{a}{b}") == (Placeholder("a"), Placeholder("b"))
    assert parse_template("literal") == ("literal",)
    assert template_placeholders("x:{a}:{b}:{a}") == ("a", "b")
    assert template_placeholders("nightly") == ()
    assert template_placeholders("{été}:{_x1}") == ("été", "_x1")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{{id}}",
        "{id:>5}",
        "{a.b}",
        "{a[0]}",
        "{ id }",
        "{}",
        "{1st}",
        "{id",
        "id}",
        "}{",
        "{a{b}}",
        "{a-b}",
    ],
)
def test_parse_template_refusals(text: str) -> None:
    with pytest.raises(TemplateSyntaxError):
        parse_template(text)
    assert issubclass(TemplateSyntaxError, ValueError)


def test_parse_template_non_string() -> None:
    with pytest.raises(TemplateSyntaxError):
        parse_template(17)


def test_render_effect_key() -> None:
    assert render_effect_key("refund:{payment_id}", {"payment_id": "txn_1"}, None) == "refund:txn_1"
    assert render_effect_key("n:{n}:{n}", {"n": -5}, None) == "n:-5:-5"
    assert render_effect_key("big:{n}", {"n": 2**80}, None) == f"big:{2**80}"
    assert render_effect_key("r:{resource}", {}, "srv-1") == "r:srv-1"
    assert render_effect_key("lit", {}, None) == "lit"
    assert render_effect_key("x:{a}:{b}", {"a": "1:2", "b": "3"}, None) == render_effect_key(
        "x:{a}:{b}", {"a": "1", "b": "2:3"}, None
    )


@pytest.mark.parametrize(
    ("template", "arguments", "resource", "fragment"),
    [
        ("r:{id}", {}, None, "{id}"),
        ("r:{id}", {"id": None}, None, "None"),
        ("r:{id}", {"id": ""}, None, "empty"),
        ("r:{id}", {"id": True}, None, "bool"),
        ("r:{id}", {"id": [1]}, None, "list"),
        ("r:{id}", {"id": {"a": 1}}, None, "dict"),
        ("r:{resource}", {}, None, "no"),
        ("r:{resource}", {"resource": "x"}, "srv", "ambiguous"),
        ("r:{{id}}", {"id": "x"}, None, "invalid"),
    ],
)
def test_render_effect_key_refusals(
    template: str, arguments: dict, resource: str | None, fragment: str
) -> None:
    with pytest.raises(EffectKeyError) as info:
        render_effect_key(template, arguments, resource)
    assert fragment in str(info.value)
    assert template in str(info.value)


def test_render_resource() -> None:
    assert (
        render_resource("payment:{payment_id}", {"payment_id": "p1", "amount": 5}) == "payment:p1"
    )
    assert render_resource("n:{resource}", {"resource": 7}) == "n:7"
    with pytest.raises(InvalidArgument, match="payment_id"):
        render_resource("payment:{payment_id}", {"amount": 5})
    for bad in (None, "", False, [1], {"a": 1}, 1.5):
        with pytest.raises(InvalidArgument):
            render_resource("p:{x}", {"x": bad})
    with pytest.raises(InvalidArgument):
        render_resource("p:{x", {"x": "1"})
