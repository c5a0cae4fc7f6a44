"""``async def`` protected steps in ``async def`` workflows: the same steps, the same answers."""

from __future__ import annotations

import pytest
from dbos import DBOS, SetWorkflowID

from ctrlrun import ActionDenied, context
from ctrlrun_dbos import PENDING_EVENT, answer, protected_step
from refund_app import remote_lines


@pytest.fixture
def async_app(launched):
    app = launched()

    @protected_step(app.control, "stripe.refund", name="refund_async")
    async def refund(payment_id: str, amount: int) -> dict:
        with app.settings.remote.open("a") as log:
            log.write(f"{payment_id} {amount}\n")
        return {"refund": "re_" + payment_id, "amount": amount}

    @DBOS.workflow()
    async def refund_workflow(payment_id: str, amount: int) -> dict:
        with context(agent="refund-agent"):
            return await refund(payment_id, amount)

    app.async_workflow = refund_workflow
    return app


def start(app, workflow_id: str, payment_id: str, amount: int):
    with SetWorkflowID(workflow_id):
        return DBOS.start_workflow(app.async_workflow, payment_id, amount)


def receipts(store) -> list[str]:
    return [f"{r.decision}/{r.result}/{r.approver}" for r in store.receipts()]


def test_an_allowed_async_call_runs_once_and_replays(async_app):
    assert start(async_app, "wf-a1", "txn_1", 50).get_result() == {"refund": "re_txn_1", "amount": 50}
    assert start(async_app, "wf-a2", "txn_1", 50).get_result() == {"refund": "re_txn_1", "amount": 50}
    assert remote_lines(async_app.settings.remote) == ["txn_1 50"]
    assert receipts(async_app.store) == ["allow/committed/None", "allow/blocked/None"]
    assert [s["function_name"] for s in DBOS.list_workflow_steps("wf-a1")] == ["refund_async"]


def test_an_async_call_waits_for_the_grant(async_app):
    handle = start(async_app, "wf-a3", "txn_2", 500)
    pending = DBOS.get_event("wf-a3", PENDING_EVENT, timeout_seconds=30)
    answer(DBOS, "wf-a3", approved=True, approver="alice@example.com", arguments=pending["arguments"])
    assert handle.get_result() == {"refund": "re_txn_2", "amount": 500}
    assert receipts(async_app.store) == ["approve/committed/alice@example.com"]
    assert [e.type.value for e in async_app.store.events()].count("APPROVAL_REQUESTED") == 1


def test_an_async_call_is_refused_after_a_denial(async_app):
    handle = start(async_app, "wf-a4", "txn_2", 500)
    DBOS.get_event("wf-a4", PENDING_EVENT, timeout_seconds=30)
    answer(DBOS, "wf-a4", approved=False, approver="bob@example.com")
    with pytest.raises(ActionDenied):
        handle.get_result()
    assert remote_lines(async_app.settings.remote) == []
    assert receipts(async_app.store) == ["approve/denied/bob@example.com"]
