"""A billing worker whose payment provider sometimes loses replies, and a reconcile hook that
asks the provider what really happened instead of guessing.

    python main.py

Three invoices: the provider charges one and loses the reply; never receives the next request;
and cannot be asked about the third. Every run starts from a clean store in .ctrlrun/.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import ctrlrun
from ctrlrun import Control, JSONLEventSink, Policy, SQLiteStateStore
from ctrlrun.effect import idempotency_token_for

HERE = Path(__file__).resolve().parent
STATE = HERE / ".ctrlrun"


class FakeProvider:
    """A payment provider that deduplicates on an idempotency key and can be searched by it.

    `lose` says what goes wrong on the next request: "reply" (the charge happens, the answer is
    lost), "request" (the request never arrives) or None. `searchable` turns its search API off.
    """

    def __init__(self) -> None:
        self.charges: dict[str, dict[str, object]] = {}  # idempotency key -> charge
        self.lose: str | None = None
        self.searchable = True

    def charge(self, invoice_id: str, amount: int, idempotency_key: str) -> str:
        if self.lose == "request":
            raise TimeoutError("timed out waiting for the provider")
        charge = self.charges.setdefault(
            idempotency_key, {"id": f"ch_{len(self.charges) + 1}", "invoice": invoice_id, "amount": amount})
        if self.lose == "reply":
            raise TimeoutError("timed out waiting for the provider")
        return str(charge["id"])

    def find(self, idempotency_key: str) -> dict[str, object] | None:
        if not self.searchable:
            raise ConnectionError("provider search API unavailable")
        return self.charges.get(idempotency_key)


def main() -> None:
    shutil.rmtree(STATE, ignore_errors=True)  # a clean slate on every run
    store = SQLiteStateStore(STATE / "state.db")
    control = Control(Policy.from_file(HERE / "ctrlrun.yaml"), store, sinks=[JSONLEventSink(STATE)])
    provider = FakeProvider()

    def ask_provider(effect_key: str) -> ctrlrun.ReconcileOutcome:
        """Called by ctrlrun when a call meets an AMBIGUOUS charge: did it happen?"""
        attempt = store.get_effect(effect_key).attempt
        found = provider.find(idempotency_token_for(effect_key, attempt))  # may raise: "unknown"
        print(f"  reconcile {effect_key}: the provider {'has a' if found else 'has no'} charge for it")
        # This provider answers synchronously, so "not found" means it will never happen. With a
        # provider where a delayed request could still land, answer "unknown" instead.
        return "committed" if found else "not_executed"

    @ctrlrun.protect("billing.charge", effect="charge:{invoice_id}", reconcile=ask_provider,
                     control=control)
    def charge(invoice_id: str, amount: int) -> str:
        return provider.charge(invoice_id, amount, idempotency_key=ctrlrun.idempotency_token())

    def run_job(invoice_id: str, amount: int) -> None:
        """One delivery of the billing job; the queue redelivers it when it fails."""
        try:
            print(f"  {invoice_id}: charged ({charge(invoice_id=invoice_id, amount=amount)})")
        except TimeoutError as lost:
            print(f"  {invoice_id}: {lost}; the outcome is unknown (AMBIGUOUS)")
        except ctrlrun.DuplicateEffect as refused:
            print(f"  {invoice_id}: not charged again, {refused.effect_key} is {refused.state}")
        except ctrlrun.AmbiguousEffect as refused:
            print(f"  {invoice_id}: still ambiguous; a human runs "
                  f"`ctrlrun resolve {refused.effect_key} --committed` or `--failed`")

    with ctrlrun.context(agent="billing-worker"):
        for invoice_id, lost in (("inv_1001", "reply"), ("inv_1002", "request"), ("inv_1003", "reply")):
            print(f"{invoice_id}, first delivery ({lost} lost):")
            provider.lose = lost
            run_job(invoice_id, 4_200)
        provider.lose = None

        print("inv_1001, redelivered:")
        run_job("inv_1001", 4_200)   # the hook finds the charge: committed, not charged twice
        print("inv_1002, redelivered:")
        run_job("inv_1002", 4_200)   # the hook finds nothing: failed, so it runs again (attempt 2)
        print("inv_1003, redelivered while the provider cannot be asked:")
        provider.searchable = False
        run_job("inv_1003", 4_200)   # the hook raises: nothing moves, the retry is refused

    print("provider charges: " + ", ".join(
        f"{c['invoice']} {c['id']}" for c in provider.charges.values()))
    print("effects:")
    for record in store.list_effects():
        resolved = f"  resolved by {record.resolved_by}" if record.resolved_by else ""
        print(f"  {record.effect_key}  {record.state}  attempt {record.attempt}{resolved}")
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
