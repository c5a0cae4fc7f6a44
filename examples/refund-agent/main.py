"""A support agent's refunds through ctrlrun: small ones run, large ones wait for a human, the
rest are refused.

    python main.py

Runs unattended: the team lead's approval is granted through the store, exactly as
`ctrlrun approve <id>` does it. Every run starts from a clean store in .ctrlrun/; afterwards,
`ctrlrun receipts` in this directory shows what happened.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import ctrlrun
from ctrlrun import Control, JSONLEventSink, Policy, SQLiteStateStore
from ctrlrun.receipt import verify_chain

HERE = Path(__file__).resolve().parent
STATE = HERE / ".ctrlrun"


class FakeStripe:
    """Stands in for the payment provider and remembers every refund it was asked for."""

    def __init__(self) -> None:
        self.refunds: list[tuple[str, int]] = []

    def refund(self, payment_id: str, amount: int) -> str:
        self.refunds.append((payment_id, amount))
        return f"re_{len(self.refunds)}"


def main() -> None:
    shutil.rmtree(STATE, ignore_errors=True)  # a clean slate on every run
    store = SQLiteStateStore(STATE / "state.db")
    control = Control(Policy.from_file(HERE / "ctrlrun.yaml"), store, sinks=[JSONLEventSink(STATE)])
    stripe = FakeStripe()

    @ctrlrun.protect("stripe.refund", effect="refund:{payment_id}", control=control)
    def refund(payment_id: str, amount: int) -> str:
        return stripe.refund(payment_id, amount)

    def attempt(label: str, payment_id: str, amount: int) -> str | None:
        """Ask for one refund; print what ctrlrun decided. Returns a request id if one was made."""
        try:
            print(f"{label}: refunded ({refund(payment_id=payment_id, amount=amount)})")
        except ctrlrun.ApprovalRequired as asked:
            print(f"{label}: needs a human, request {asked.request_id}")
            return asked.request_id
        except ctrlrun.ApprovalMismatch as refused:
            print(f"{label}: refused, approval {refused.reason}")
        except ctrlrun.DuplicateEffect as refused:
            print(f"{label}: refused, {refused.effect_key} already {refused.state}")
        except ctrlrun.ActionDenied as refused:
            print(f"{label}: denied by policy ({refused.reason})")
        return None

    with ctrlrun.context(agent="support-agent"):
        print("allow band")
        attempt("  txn_100 EUR 120", "txn_100", 12_000)
        attempt("  txn_100 EUR 120 again", "txn_100", 12_000)  # the agent retries

        print("approve band")
        request_id = attempt("  txn_200 EUR 2,500", "txn_200", 250_000)
        assert request_id is not None
        approval = store.grant_approval(request_id, "lead@example.com")  # = ctrlrun approve
        print(f"  lead@example.com approves {request_id}, bound to {approval.action_hash[:23]}...")
        with ctrlrun.with_approval(request_id):
            attempt("  txn_200 EUR 3,000 with the approval", "txn_200", 300_000)  # changed amount
            attempt("  txn_200 EUR 2,500 with the approval", "txn_200", 250_000)  # what was approved
            attempt("  txn_200 EUR 2,500 with it again", "txn_200", 250_000)      # replayed

        print("deny band")
        attempt("  txn_300 EUR 7,500", "txn_300", 750_000)
        attempt("  txn_400 EUR -50", "txn_400", -5_000)

    print(f"stripe refunds: {stripe.refunds}")
    print("receipts:")
    for receipt in store.receipts():
        print(f"  {receipt.effect_key}  {receipt.decision}/{receipt.result}  "
              f"approver={receipt.approver}  controls={list(receipt.controls)}")
    report = verify_chain(store)
    print(f"chain: {report.verified} of {report.chained} receipts verified, intact={report.ok}")
    store.close()


def parse_arguments() -> argparse.Namespace:
    """The command line, read before anything runs: ``--help`` shows what this does, and an
    option it does not take is refused (exit 2) instead of being ignored."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    return parser.parse_args()


if __name__ == "__main__":
    parse_arguments()  # it takes no options
    main()
