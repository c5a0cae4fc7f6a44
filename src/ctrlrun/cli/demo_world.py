"""The demo's world: its built-in policy, a fake payment API that can lose a reply, and the wiring."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._time import Clock, utc_now
from ..approvals.records import ScriptedApprovalProvider
from ..control.front import Control
from ..policy import Policy
from ..protect import protect
from ..evidence.receipt import JSONLEventSink
from ..store import SQLiteStateStore

__all__ = ["DEMO_DIR", "DEMO_FILES", "DemoWorld", "FakePayments", "build_world", "clear_demo_dir"]

DEMO_DIR = Path(".ctrlrun") / "demo"
DEMO_FILES = ("state.db", "state.db-wal", "state.db-shm", "receipts.jsonl", "events.jsonl")
DEMO_APPROVER = "human:demo"

DEMO_POLICY = """\
schema: ctrlrun.policy/v2
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    rules:
      - when: { amount_gte: 0, amount_lte: 100000 }     # up to 1,000.00: runs
        decision: allow
      - when: { amount_gte: 0, amount_lte: 1000000 }    # up to 10,000.00: a human approves
        decision: approve
      - decision: deny
"""

POLICY_SUMMARY = (
    "Policy: stripe.refund  ≤ 100000 minor units allow · ≤ 1000000 approve · above that deny"
)


@dataclass
class FakePayments:
    """A payment API that counts calls, can commit and then lose its reply, and can run a hook mid-call."""

    calls: list[tuple[str, int]] = field(default_factory=list)
    lose_next_reply: bool = False
    during_next_call: Callable[[], None] | None = None

    def refund(self, payment_id: str, amount: int) -> dict[str, Any]:
        self.calls.append((payment_id, amount))
        hook, self.during_next_call = self.during_next_call, None
        if hook is not None:
            hook()
        if self.lose_next_reply:
            self.lose_next_reply = False
            raise TimeoutError("the refund was sent, the reply never came back")
        return {"refund": f"re_{payment_id}", "amount": amount}

    def count(self, payment_id: str) -> int:
        return sum(1 for paid, _ in self.calls if paid == payment_id)


@dataclass
class DemoWorld:
    """Everything a scenario needs: the real Control and store, the protected refund, the fake API."""

    control: Control
    store: SQLiteStateStore
    api: FakePayments
    refund: Callable[..., Any]

    def grant(self, request_id: str) -> Any:
        """The scripted human grants a request through the store (no event, as any provider)."""
        return self.control.approvals.wait(request_id, None)

    def close(self) -> None:
        self.store.close()


def clear_demo_dir(root: Path) -> Path:
    """Delete, by name only, the files a previous demo run left; return the directory."""
    directory = root / DEMO_DIR
    for name in DEMO_FILES:
        (directory / name).unlink(missing_ok=True)
    return directory


def build_world(root: Path, *, clock: Clock = utc_now) -> DemoWorld:
    """A Control over a fresh SQLite store in ``<root>/.ctrlrun/demo``; reads no CTRLRUN_* variable."""
    directory = clear_demo_dir(root)
    policy = Policy.from_yaml(DEMO_POLICY, source="<ctrlrun demo policy>")
    store = SQLiteStateStore(directory / "state.db", clock=clock)
    try:
        approver = ScriptedApprovalProvider(store, ["grant"] * 4, approver=DEMO_APPROVER, clock=clock)
        control = Control(
            policy,
            store,
            approver,
            sinks=(JSONLEventSink(directory),),
            environment="production",
            clock=clock,
        )
    except BaseException:
        store.close()
        raise
    api = FakePayments()

    @protect("stripe.refund", effect="refund:{payment_id}", control=control)
    def refund(payment_id: str, amount: int) -> dict[str, Any]:
        return api.refund(payment_id, amount)

    return DemoWorld(control, store, api, refund)
