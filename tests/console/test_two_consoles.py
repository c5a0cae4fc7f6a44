"""Two real ``ctrlrun serve`` processes on one Postgres store: each webhook is delivered once,
validly signed, and a request left pending is escalated once (``--escalate-after PT2S``, the real
clock) and stays pending."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from ctrlrun.store import open_store_url

from ..conftest import create_pg_schema, drop_pg_schema
from ._receiver import Receiver
from ._serve import SRC, Project, serve

SECRET = "two-consoles-secret"
PROPOSE = """
import sys, ctrlrun
@ctrlrun.protect("stripe.refund", effect="refund:{payment_id}")
def refund(payment_id, amount):
    raise SystemExit("must not run without an approval")
with ctrlrun.context(agent="support-agent", user="carol"):
    try:
        refund(payment_id=sys.argv[1], amount=120000)
    except ctrlrun.ApprovalRequired as exc:
        print(exc.request_id)
"""


def _propose(project: Project, url: str, payment_id: str) -> str:
    """A real protected call in another process: it asks for an approval and prints the id."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTRLRUN_")}
    env.update({"PYTHONPATH": str(SRC), "CTRLRUN_CONFIG": str(project.policy), "CTRLRUN_STORE_URL": url})
    done = subprocess.run([sys.executable, "-c", PROPOSE, payment_id], env=env, capture_output=True, text=True,
                          timeout=120, check=True)  # fmt: skip
    return done.stdout.strip()


def _until(condition: Any, what: Any, seconds: float = 90) -> None:
    """Wait for real processes (the consoles poll the store on the real clock)."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what() if callable(what) else what}"
        time.sleep(0.1)


def _bodies(receiver: Receiver, path: str) -> list[dict[str, Any]]:
    out = []
    for received in receiver.on(path):
        expected = "sha256=" + hmac.new(SECRET.encode(), received.body, hashlib.sha256).hexdigest()
        assert received.headers.get("X-Ctrlrun-Signature") == expected
        body = json.loads(received.body)
        assert received.headers.get("X-Ctrlrun-Delivery") == body["id"]
        out.append(body)
    return out


@pytest.mark.slow
@pytest.mark.postgres
def test_two_consoles_deliver_each_webhook_once_and_escalate_once(tmp_path: Path, pg_url: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    from ..clock import Clock

    project = Project(tmp_path, Clock())
    schema = create_pg_schema(pg_url)
    url = f"{pg_url}?ctrlrun_schema={schema}"
    open_store_url(url).close()  # created and migrated once; consoles never create a store
    project.url = url
    monkeypatch.setenv("TWO_CONSOLES_SECRET", SECRET)
    try:
        with Receiver() as receiver, ExitStack() as consoles:
            base = receiver.url.rsplit("/", 1)[0]
            flags = ("--webhook", base + "/hook", "--webhook-secret-env", "TWO_CONSOLES_SECRET",
                     "--escalate-after", "PT2S", "--escalate-webhook", base + "/esc",
                     "--base-url", "https://approvals.example.com")  # fmt: skip
            for _ in range(2):
                consoles.enter_context(serve(project, *flags))
            first = _propose(project, url, "txn_1")
            _until(lambda: receiver.on("/esc"), lambda: f"the escalation (received: {[r.path for r in receiver.received]})")
            second = _propose(project, url, "txn_2")  # after it is delivered, both consoles have moved on
            _until(lambda: any(b["request_id"] == second for b in _bodies(receiver, "/hook")), "the second delivery")
            hooks = _bodies(receiver, "/hook")
            escalations = _bodies(receiver, "/esc")
        assert [b["request_id"] for b in hooks if b["request_id"] == first] == [first]
        (hook,) = [b for b in hooks if b["request_id"] == first]
        assert hook["type"] == "approval.requested" and hook["effect_key"] == "refund:txn_1"
        assert hook["url"] == f"https://approvals.example.com/requests/{first}"
        assert "amount" not in json.dumps(hook) and "120000" not in json.dumps(hook)
        assert [b["request_id"] for b in escalations] == [first]
        store = open_store_url(url)
        try:
            escalated = [e for e in store.events() if str(e.type) == "APPROVAL_ESCALATED"]
            assert [e.data["request_id"] for e in escalated] == [first]
            assert [r.approval_id for r in store.pending_approvals()].count(first) == 1
        finally:
            store.close()
    finally:
        drop_pg_schema(pg_url, schema)
