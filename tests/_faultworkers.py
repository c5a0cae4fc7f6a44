"""Child processes of the fault tests: ``python -m tests._faultworkers <mode> <json>``.

Each prints one line per step on stdout (``OPENED``, ``RUNNING``, ``DONE <value>``, ``ERROR
<type>: <message>``) and, where the test freezes it, stops itself (``SIGSTOP``) at exactly the
point the test names, so no timing decides where it stands.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

ALLOW = """\
schema: ctrlrun.policy/v2
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    decision: allow
"""


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def open_store(args: dict[str, Any]) -> Any:
    from ctrlrun.postgres import PostgresStateStore, PostgresTimeouts

    timeouts = PostgresTimeouts(**args.get("timeouts", {}))
    return PostgresStateStore(args["url"], schema=args["schema"], timeouts=timeouts)


def refund(store: Any, payment_id: str, inside: Any = None) -> str:
    from ctrlrun import Control, Policy, context, protect

    control = Control(Policy.from_yaml(ALLOW), store)

    @protect("stripe.refund", control=control)
    def call(payment_id: str, amount: int) -> str:
        if inside is not None:
            inside()
        return "ok"

    with context(agent=f"agent-{os.getpid()}"):
        return call(payment_id=payment_id, amount=100)  # type: ignore[no-any-return]


def main(mode: str, args: dict[str, Any]) -> None:
    from ctrlrun.errors import CTRLRunError

    try:
        store = open_store(args)
        say("OPENED")
        if mode == "open":
            return
        if mode == "call":  # one allowed call
            say("DONE " + refund(store, args["payment_id"]))
        elif mode == "stop_in_call":  # stopped inside the function: its start is committed
            inside = lambda: os.kill(os.getpid(), signal.SIGSTOP)  # noqa: E731
            say("DONE " + refund(store, args["payment_id"], inside))
        elif mode == "wait_in_call":  # inside the function until the test writes a line
            inside = lambda: (say("RUNNING"), sys.stdin.readline())  # noqa: E731
            say("DONE " + refund(store, args["payment_id"], inside))
        elif mode == "stop_before_commit":
            # consume an approval and reserve a key; stopped before the COMMIT, the
            # transaction open and holding the key's and the approval's rows
            def trace(text: str, params: Any) -> None:
                if text == "COMMIT" or text.endswith("; COMMIT"):
                    os.kill(os.getpid(), signal.SIGSTOP)

            store.trace = trace
            store.consume_approval_and_reserve(
                args["approval_id"], args["action_hash"], args["effect_key"], "frozen"
            )
            say("DONE reserved")
    except CTRLRunError as exc:
        say(f"ERROR {type(exc).__name__}: {exc}")


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]))
