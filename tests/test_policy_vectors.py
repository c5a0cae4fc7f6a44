"""Every normative policy vector: decision or error, reason, warnings, controls, policy hash."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from ctrlrun.action import Action, Principal
from ctrlrun.errors import CTRLRunError
from ctrlrun.policy import Policy

from .vectors import load

CASES: list[dict[str, Any]] = load("policy_cases.json")


def test_vector_file_is_complete() -> None:
    assert len(CASES) == 254
    assert len({case["id"] for case in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_policy_vector(case: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    expect = case["expect"]
    try:
        policy = Policy.from_yaml(case["policy"])
        action = Action(case["action"], case["arguments"], Principal("agent"))
    except CTRLRunError as exc:
        assert expect == f"error:{type(exc).__name__}", f"{case['id']}: raised {exc!r}"
        if expect == "error:PolicyError":
            assert str(exc).startswith("<string>: "), str(exc)
        if "policy_hash" in case:
            assert Policy.from_yaml(case["policy"]).policy_hash == case["policy_hash"]
        return
    assert not expect.startswith("error:"), f"{case['id']}: loaded and built, expected {expect}"

    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="ctrlrun.policy"):
        evaluation = policy.evaluate(action)
    warnings = [
        r for r in caplog.records if r.name == "ctrlrun.policy" and r.levelno >= logging.WARNING
    ]

    assert str(evaluation.decision) == expect
    if "reason" in case:
        assert evaluation.reason == case["reason"]
    if "controls" in case:
        assert list(evaluation.controls) == case["controls"]
    if "warns" in case:
        assert bool(warnings) is case["warns"], [r.getMessage() for r in warnings]
    if "policy_hash" in case:
        assert policy.policy_hash == case["policy_hash"]
        assert policy.runtime_hash() == case["policy_hash"]
        assert policy.runtime_hash(policy.environment or "production") == case["policy_hash"]

    # evaluation is pure and repeatable
    assert policy.evaluate(action) == evaluation
