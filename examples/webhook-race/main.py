"""Two worker processes receive the same webhook (a redelivery) at the same moment. Both decide
to ship the order; ctrlrun lets exactly one of them.

    python main.py

The workers are real OS processes sharing one SQLite store (.ctrlrun/state.db). The race is made
deterministic with events: worker A is inside the shipping call when worker B receives the
redelivery. Every run starts from a clean store.
"""

from __future__ import annotations

import argparse
import multiprocessing
import shutil
from pathlib import Path
from typing import Any

import ctrlrun
from ctrlrun import Control, JSONLEventSink, Policy, SQLiteStateStore

HERE = Path(__file__).resolve().parent
STATE = HERE / ".ctrlrun"
SHIPMENTS = STATE / "shipments.log"  # the warehouse: one line per parcel actually sent
WEBHOOK = {"event_id": "evt_7Hq2", "type": "payment.succeeded", "order_id": "ord_42"}
WAIT = 60  # seconds; generous, so a slow machine never breaks the demonstration


def worker(name: str, delivery: dict[str, Any], inside: Any, proceed: Any, results: Any) -> None:
    """One worker process: its own Control over the shared store, then one webhook delivery."""
    store = SQLiteStateStore(STATE / "state.db")
    control = Control(Policy.from_file(HERE / "ctrlrun.yaml"), store, sinks=[JSONLEventSink(STATE)])

    @ctrlrun.protect("orders.ship", control=control)  # effect key from the policy: ship:{order_id}
    def ship(order_id: str, event_id: str) -> str:
        if inside is not None:
            inside.set()            # tell the parent we hold the key and are shipping...
            proceed.wait(WAIT)      # ...and take our time, as a real warehouse API would
        with SHIPMENTS.open("a", encoding="utf-8") as warehouse:
            warehouse.write(f"{order_id} shipped by {name}\n")
        return f"parcel for {order_id}"

    with ctrlrun.context(agent=name):
        try:
            outcome = f"shipped the {ship(order_id=delivery['order_id'], event_id=delivery['event_id'])}"
        except ctrlrun.DuplicateEffect as refused:
            outcome = f"refused: {refused.effect_key} is {refused.state}"
    store.close()
    results.put((name, outcome))


def main() -> None:
    shutil.rmtree(STATE, ignore_errors=True)  # a clean slate on every run
    SQLiteStateStore(STATE / "state.db").close()  # create the store before the workers race
    spawn = multiprocessing.get_context("spawn")
    inside, proceed, results = spawn.Event(), spawn.Event(), spawn.Queue()

    print(f"webhook {WEBHOOK['event_id']} ({WEBHOOK['type']}, {WEBHOOK['order_id']}) delivered to worker-a")
    a = spawn.Process(target=worker, args=("worker-a", WEBHOOK, inside, proceed, results))
    a.start()
    if not inside.wait(WAIT):
        raise SystemExit("worker-a never started shipping")

    print(f"webhook {WEBHOOK['event_id']} redelivered to worker-b while worker-a is still shipping")
    b = spawn.Process(target=worker, args=("worker-b", WEBHOOK, None, None, results))
    b.start()
    name, outcome = results.get(timeout=WAIT)
    print(f"  {name}: {outcome}")
    proceed.set()  # worker-a finishes
    name, outcome = results.get(timeout=WAIT)
    print(f"  {name}: {outcome}")
    for process in (a, b):
        process.join(WAIT)

    print(f"webhook {WEBHOOK['event_id']} redelivered again, an hour later, to worker-c")
    c = spawn.Process(target=worker, args=("worker-c", WEBHOOK, None, None, results))
    c.start()
    name, outcome = results.get(timeout=WAIT)
    print(f"  {name}: {outcome}")
    c.join(WAIT)

    shipped = SHIPMENTS.read_text(encoding="utf-8").splitlines()
    print(f"warehouse: {len(shipped)} parcel(s): {'; '.join(shipped)}")
    store = SQLiteStateStore(STATE / "state.db")
    for receipt in store.receipts():
        print(f"receipt  {receipt.principal.agent}  {receipt.effect_key}  "
              f"{receipt.decision}/{receipt.result}  {receipt.error or ''}".rstrip())
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
