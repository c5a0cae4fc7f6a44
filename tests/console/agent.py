"""A real agent process for the console's tests: one protected ``stripe.refund`` call.

Run as ``python agent.py --arguments JSON --counter FILE [--agent A] [--user U]
[--approval ID] [--lose-reply]``, with ``CTRLRUN_CONFIG`` and ``CTRLRUN_STATE`` naming the
policy and the store. It prints one JSON line saying what happened: ``approval_required`` (with
the request id), ``ran``, or ``refused`` (with the refusal's class and reason). Each time the
refund's body runs it appends its arguments to the counter file, so a test counts the runs.
With ``--approval`` the call is retried under ``ctrlrun.with_approval(ID)``; if the human
approved edited arguments, it re-issues the call with exactly those, as an agent should.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import ctrlrun


def _refund(counter: Path, lose_reply: bool) -> Any:
    @ctrlrun.protect("stripe.refund", effect="refund:{payment_id}")
    def refund(payment_id: str, amount: int, note: str = "") -> dict[str, Any]:
        arguments = {"payment_id": payment_id, "amount": amount, "note": note}
        with counter.open("a", encoding="utf-8") as out:
            out.write(json.dumps(arguments) + "\n")
        if lose_reply:
            raise TimeoutError("the payment provider's reply was lost")
        return {"refunded": payment_id}

    return refund


def _call(refund: Any, arguments: dict[str, Any], approval: str | None) -> dict[str, Any]:
    if approval is None:
        return {"outcome": "ran", "result": refund(**arguments)}
    with ctrlrun.with_approval(approval):
        try:
            return {"outcome": "ran", "result": refund(**arguments)}
        except ctrlrun.ApprovalMismatch as exc:
            if exc.reason != "edited":
                raise
            edited = dict(exc.approved_arguments)
            return {"outcome": "ran", "edited": edited, "result": refund(**edited)}


def main(argv: list[str] | None = None) -> int:
    """Make the call once and print its outcome as one JSON line."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--arguments", required=True, help="the call's arguments, a JSON object")
    parser.add_argument("--counter", required=True, type=Path)
    parser.add_argument("--agent", default="support-agent")
    parser.add_argument("--user", default=None)
    parser.add_argument("--approval", default=None)
    parser.add_argument("--lose-reply", action="store_true")
    options = parser.parse_args(argv)
    refund = _refund(options.counter, options.lose_reply)
    try:
        with ctrlrun.context(agent=options.agent, user=options.user):
            outcome = _call(refund, json.loads(options.arguments), options.approval)
    except ctrlrun.ApprovalRequired as exc:
        outcome = {"outcome": "approval_required", "request_id": exc.request_id}
    except ctrlrun.Refusal as exc:
        outcome = {"outcome": "refused", "error": type(exc).__name__,
                   "reason": getattr(exc, "reason", None), "message": str(exc)}  # fmt: skip
    except TimeoutError as exc:
        outcome = {"outcome": "lost_reply", "message": str(exc)}
    print(json.dumps(outcome))
    return 0


if __name__ == "__main__":
    sys.exit(main())
