"""A DBOS refund workflow whose large refunds wait, durably, for a human, through ctrlrun.

    python main.py            # ada@example.com approves the EUR 2,500 refund
    python main.py --deny     # ada@example.com refuses it

Runs offline: DBOS keeps its workflows in .ctrlrun/dbos.sqlite, ctrlrun its state in
.ctrlrun/state.db. Run it again and nothing is refunded twice: the recorded outcomes replay.
Delete .ctrlrun/ to start over.
"""

from __future__ import annotations

import argparse


def parse_arguments() -> argparse.Namespace:
    """The command line, read before anything runs: ``--help`` shows what this does, and an
    option it does not take is refused (exit 2) instead of being ignored."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--deny", action="store_true",
                        help="ada@example.com refuses the EUR 2,500 refund (start from a fresh .ctrlrun/)")
    return parser.parse_args()


if __name__ == "__main__":  # first: --help needs no framework installed, and opens no store
    ARGUMENTS = parse_arguments()

import logging
import uuid
from pathlib import Path

from ctrlrun_dbos import PENDING_EVENT, DBOSInterrupt, answer, protected_step
from dbos import DBOS, SetWorkflowID

from ctrlrun import ActionDenied, Control, Policy, SQLiteStateStore, context
from ctrlrun.adapter import InterruptApprovalProvider

Path(".ctrlrun").mkdir(exist_ok=True)
DBOS(config={"name": "dbos-refund", "system_database_url": "sqlite:///.ctrlrun/dbos.sqlite",
             "application_version": "1", "log_level": "WARNING",
             "notification_listener_polling_interval_sec": 0.05})
# DBOS logs each failed workflow with its traceback; this program reports refusals itself
logging.getLogger("dbos").setLevel(logging.CRITICAL)

store = SQLiteStateStore(".ctrlrun/state.db")
control = Control(Policy.from_file("ctrlrun.yaml"), store,
    approvals=InterruptApprovalProvider(store, DBOSInterrupt(carries_approved_arguments=True)))

stripe_calls: list[str] = []  # what the (fake) payment provider was asked to do


@protected_step(control, "stripe.refund", effect="refund:{payment_id}")
def issue_refund(payment_id: str, amount: int) -> str:
    stripe_calls.append(payment_id)
    return f"re_{payment_id}"


@DBOS.workflow()
def refund_workflow(payment_id: str, amount: int) -> str:
    with context(agent="refund-agent"):
        return issue_refund(payment_id, amount)


def published_request(handle) -> dict | None:
    """The request the workflow waits on, or None once it finished without asking anyone."""
    while True:
        shown = DBOS.get_event(handle.get_workflow_id(), PENDING_EVENT, timeout_seconds=0.2)
        if shown is not None or handle.get_status().status != "PENDING":
            return shown


def refund(payment_id: str, amount: int, approve: bool) -> None:
    workflow_id = f"refund-{payment_id}-{uuid.uuid4().hex[:8]}"  # a new workflow each run
    with SetWorkflowID(workflow_id):
        handle = DBOS.start_workflow(refund_workflow, payment_id, amount)
    shown = published_request(handle)
    if shown is not None:  # the policy sent it to a human: the console shows the request
        print(f"{payment_id}: waiting for approval of {shown['action']} {shown['arguments']}")
        print(f"{payment_id}: request {shown['request_id']} bound to {shown['action_hash'][:19]}...")
        print(f"{payment_id}: ada@example.com {'approves' if approve else 'refuses'}")
        answer(DBOS, workflow_id, approved=approve, approver="ada@example.com",
               arguments=shown["arguments"] if approve else None)  # the arguments she saw
    try:
        refund_id = handle.get_result()
    except ActionDenied as refused:
        print(f"{payment_id}: refused ({refused.reason})")
        return
    if payment_id in stripe_calls:
        print(f"{payment_id}: refunded ({refund_id})")
    else:  # the effect key was committed before: its recorded outcome replayed
        print(f"{payment_id}: not run again (committed), replayed {refund_id}")


if __name__ == "__main__":
    approve = not ARGUMENTS.deny
    DBOS.launch()
    refund("txn_1", 40_000, approve)       # EUR 400: allowed, no human
    refund("txn_2", 250_000, approve)      # EUR 2,500: a human decides, the workflow waits
    print(f"stripe was called for: {', '.join(stripe_calls) or 'nothing'}")
    for receipt in store.receipts():
        print(f"receipt {receipt.action} {receipt.arguments['payment_id']}: "
              f"{receipt.decision}/{receipt.result} approver={receipt.approver}")
    DBOS.destroy()
