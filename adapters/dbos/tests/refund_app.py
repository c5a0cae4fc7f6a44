"""The DBOS test application: a refund workflow over one ``protected_step``.

Imported by the in-process tests (``build(settings)``) and run as a program by the crash tests:

    python refund_app.py start WORKFLOW_ID PAYMENT_ID AMOUNT   # launch, start, print the outcome
    python refund_app.py recover WORKFLOW_ID [...]             # launch (DBOS recovers), print them
    python refund_app.py fork WORKFLOW_ID STEP                 # launch, fork from STEP, print it
    python refund_app.py init                                  # launch (the databases made), exit

Settings come from ``CTRLRUN_DBOS_TEST_*`` environment variables (see ``Settings.from_env``).
The test hook ``KILL`` (never part of the adapter) sends this process ``SIGKILL`` at a named point:
``before_reserve`` (the store's start), ``after_reserve`` (the function's first line),
``after_execute`` (after the fake remote wrote its line, before the function returns) and
``after_outcome`` (after the store wrote the outcome, before DBOS checkpoints the step).
The fake remote is a file of lines, one per effect, fsynced before the function goes on.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from ctrlrun import Control, Policy, context
from ctrlrun.adapter import InterruptApprovalProvider
from ctrlrun.errors import NotExecuted
from ctrlrun.store.postgres import PostgresStateStore
from ctrlrun.store.sqlite import SQLiteStateStore

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    rules:
      - when: { amount_gte: 0, amount_lte: 100 }
        decision: allow
      - when: { amount_gte: 0, amount_lte: 1000 }
        decision: approve
      - decision: deny
"""


@dataclass
class Settings:
    dbos_url: str
    store_url: str
    remote: Path
    dbos_schema: str | None = None
    kill: str = ""
    lease_seconds: float = 2.0
    hook: str = ""  # a reconcile hook's fixed answer: committed, not_executed, unknown
    ttl_seconds: float = 900.0
    not_executed_first: bool = False  # the first try raises NotExecuted (nothing happened)
    executor_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    ENV = "CTRLRUN_DBOS_TEST_"

    def to_env(self) -> dict[str, str]:
        values = {
            "DBOS_URL": self.dbos_url, "STORE_URL": self.store_url, "REMOTE": str(self.remote),
            "DBOS_SCHEMA": self.dbos_schema or "", "KILL": self.kill,
            "LEASE": str(self.lease_seconds), "HOOK": self.hook, "TTL": str(self.ttl_seconds),
            "NOT_EXECUTED_FIRST": "1" if self.not_executed_first else "",
            "EXECUTOR": self.executor_id or "",
        }  # fmt: skip
        return {self.ENV + k: v for k, v in values.items()}

    @classmethod
    def from_env(cls) -> Settings:
        env = {k[len(cls.ENV):]: v for k, v in os.environ.items() if k.startswith(cls.ENV)}
        return cls(
            dbos_url=env["DBOS_URL"], store_url=env["STORE_URL"], remote=Path(env["REMOTE"]),
            dbos_schema=env.get("DBOS_SCHEMA") or None, kill=env.get("KILL", ""),
            lease_seconds=float(env.get("LEASE", "2")), hook=env.get("HOOK", ""),
            ttl_seconds=float(env.get("TTL", "900")),
            not_executed_first=bool(env.get("NOT_EXECUTED_FIRST")),
            executor_id=env.get("EXECUTOR") or None,
        )  # fmt: skip


def _kill_at(settings: Settings, point: str) -> None:
    if settings.kill == point:
        os.kill(os.getpid(), signal.SIGKILL)


def remote_lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _store(settings: Settings) -> Any:
    """The store, with the test hook's kill points around the start and the outcome."""
    url = settings.store_url
    base: type[Any] = SQLiteStateStore if url.startswith("sqlite://") else PostgresStateStore

    class Hooked(base):  # type: ignore[misc, valid-type]
        def start_attempt(self, **kwargs: Any) -> Any:
            _kill_at(settings, "before_reserve")
            return super().start_attempt(**kwargs)

        def finish_attempt(self, **kwargs: Any) -> Any:
            out = super().finish_attempt(**kwargs)
            if kwargs.get("outcome") is not None:
                _kill_at(settings, "after_outcome")
            return out

    return Hooked(url.removeprefix("sqlite://") if base is SQLiteStateStore else url)


@dataclass
class App:
    control: Control
    store: Any
    refund: Any
    workflow: Any
    settings: Settings


def build(settings: Settings) -> App:
    """A DBOS instance (not launched), the Control and the registered steps and workflow."""
    from dbos import DBOS, DBOSConfig

    from ctrlrun_dbos import DBOSInterrupt, protected_step

    config: DBOSConfig = {
        "name": "ctrlrun-dbos-test", "system_database_url": settings.dbos_url,
        "application_version": "test-1", "notification_listener_polling_interval_sec": 0.05,
        "log_level": "WARNING", "scheduler_polling_interval_sec": 0.05,
    }  # fmt: skip
    if settings.dbos_schema:
        config["dbos_system_schema"] = settings.dbos_schema
    if settings.executor_id:
        config["executor_id"] = settings.executor_id
    DBOS(config=config)
    store = _store(settings)
    control = Control(
        Policy.from_yaml(POLICY), store,
        approvals=InterruptApprovalProvider(store, DBOSInterrupt(carries_approved_arguments=True)),
        approval_ttl=timedelta(seconds=settings.ttl_seconds),
    )  # fmt: skip
    hook = None
    if settings.hook:
        answer = settings.hook

        def hook(effect_key: str) -> str:
            return answer

    tries: list[int] = []

    @protected_step(control, "stripe.refund", lease=timedelta(seconds=settings.lease_seconds),
                    reconcile=hook, interval_seconds=0.2, backoff_rate=1.0, max_attempts=40, name="refund")  # fmt: skip
    def refund(payment_id: str, amount: int) -> dict[str, Any]:
        _kill_at(settings, "after_reserve")
        tries.append(1)
        if settings.not_executed_first and len(tries) == 1:
            raise NotExecuted("the provider refused the connection: nothing was sent")
        with settings.remote.open("a") as log:
            log.write(f"{payment_id} {amount}\n")
            log.flush()
            os.fsync(log.fileno())
        _kill_at(settings, "after_execute")
        return {"refund": "re_" + payment_id, "amount": amount}

    @DBOS.workflow()
    def refund_workflow(payment_id: str, amount: int) -> dict[str, Any]:
        with context(agent="refund-agent"):
            return refund(payment_id, amount)

    return App(control, store, refund, refund_workflow, settings)


def outcome(handle: Any) -> dict[str, Any]:
    """A workflow's result, or its exception as ``{"error": type, "message", "state"?}``."""
    try:
        return {"value": handle.get_result(polling_interval_sec=0.05)}
    except Exception as error:  # noqa: BLE001 - reported to the test as data
        out = {"error": type(error).__name__, "message": str(error)}
        for name in ("state", "replayable", "reason"):
            if hasattr(error, name):
                out[name] = getattr(error, name)
        return out


def main(argv: list[str]) -> None:
    from dbos import DBOS, SetWorkflowID

    settings = Settings.from_env()
    app = build(settings)
    DBOS.launch()
    command, workflow_ids = argv[0], argv[1:]
    if command == "init":  # the system database made, nothing run
        results: dict[str, Any] = {}
    elif command == "start":
        workflow_id, payment_id, amount = argv[1], argv[2], int(argv[3])
        with SetWorkflowID(workflow_id):
            handle = DBOS.start_workflow(app.workflow, payment_id, amount)
        results = {workflow_id: outcome(handle)}
    elif command == "fork":
        handle = DBOS.fork_workflow(argv[1], int(argv[2]))
        results = {handle.get_workflow_id(): outcome(handle)}
    else:
        assert command == "recover"
        results = {w: outcome(DBOS.retrieve_workflow(w)) for w in workflow_ids}
    print(json.dumps(results), flush=True)
    DBOS.destroy()


if __name__ == "__main__":
    main(sys.argv[1:])
