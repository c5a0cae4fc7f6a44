"""What the Control answers: ``evaluate`` says what ``execute`` would, a denial of an action the
policy does not name says which file and the nearest name, and a function's own exception is
never replaced by what the store said of its outcome."""

from __future__ import annotations

from datetime import timedelta

import pytest

from ctrlrun import (
    Action,
    ActionDenied,
    Control,
    InvalidArgument,
    Policy,
    Principal,
    SQLiteStateStore,
    context,
    protect,
)
from ctrlrun.effects.records import EffectState
from ctrlrun.policy import Decision

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    decision: allow
  notes.delete:
    decision: allow
"""


def _control(tmp_path, clock, **kwargs):
    store = SQLiteStateStore(tmp_path / "state.db", clock=clock)
    return Control(Policy.from_yaml(POLICY, source="team/ctrlrun.yaml"), store, clock=clock, **kwargs)


def test_evaluate_refuses_another_environment_as_execute_does(tmp_path, clock):
    control = _control(tmp_path, clock, environment="production")
    action = Action(name="notes.delete", arguments={"id": "n1"}, principal=Principal(agent="a"),
                    environment="staging")  # fmt: skip
    with pytest.raises(InvalidArgument) as executing:
        control.execute(action, lambda: "ran")
    with pytest.raises(InvalidArgument) as evaluating:
        control.evaluate(action)
    assert str(evaluating.value) == str(executing.value) and "staging" in str(evaluating.value)


def test_evaluate_denies_an_expired_principal_as_execute_does(tmp_path, clock):
    control = _control(tmp_path, clock)
    principal = Principal(agent="a", expires_at=clock() - timedelta(seconds=1))
    action = Action(name="notes.delete", arguments={"id": "n1"}, principal=principal,
                    environment=control.environment)  # fmt: skip
    evaluation = control.evaluate(action)
    assert (evaluation.decision, evaluation.reason) == (Decision.DENY, "principal_expired")
    with pytest.raises(ActionDenied) as info:
        control.execute(action, lambda: "ran")
    assert info.value.reason == evaluation.reason


def test_an_unknown_action_names_the_policy_file_and_the_nearest_name(tmp_path, clock):
    control = _control(tmp_path, clock)

    @protect("stripe.refnd", control=control)
    def refund(payment_id: str) -> str:
        return "ran"

    with context(agent="a"), pytest.raises(ActionDenied) as info:
        refund(payment_id="p1")
    message = str(info.value)
    assert info.value.reason == "unknown_action"
    assert "team/ctrlrun.yaml" in message and "'stripe.refund'" in message, message

    @protect("mail.send", control=control)
    def send(to: str) -> str:
        return "ran"

    with context(agent="a"), pytest.raises(ActionDenied) as info:
        send(to="x")
    assert "'stripe.refund', 'notes.delete'" in str(info.value)


@pytest.mark.parametrize("kind", [TimeoutError, KeyboardInterrupt])
def test_a_resolution_while_the_function_runs_leaves_the_functions_own_exception(tmp_path, clock, kind):
    raised = kind("the provider did not answer")  # made here: a parameter would outlive the test
    control = _control(tmp_path, clock)
    store = control.store

    @protect("stripe.refund", effect="refund:{payment_id}", control=control)
    def refund(payment_id: str) -> str:
        record = store.get_effect("refund:" + payment_id)
        store.mark_ambiguous(record.effect_key, record.action_id, "judged lapsed by another worker")
        store.resolve_effect(record.effect_key, "committed", "cli:local")  # an operator, meanwhile
        raise raised

    with context(agent="a"), pytest.raises(type(raised)) as info:
        refund(payment_id="p1")
    assert info.value is raised
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "refund:p1" in notes and "committed" in notes, notes
    assert store.get_effect("refund:p1").state is EffectState.COMMITTED
    assert store.receipts()[-1].result == "ambiguous"  # the attempt's own outcome is kept
    raised.__traceback__ = None  # its frames hold the run's state
