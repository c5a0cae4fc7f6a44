"""The core kernel's promise, end to end, through the public API only."""

from __future__ import annotations

import json
import shutil

import pytest

import ctrlrun
from ctrlrun import (
    ActionDenied,
    AmbiguousEffect,
    ApprovalMismatch,
    ApprovalRequired,
    SQLiteStateStore,
)
from ctrlrun.receipt import verify_chain

from .vectors import ROOT


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A fresh directory holding the repository's starter ctrlrun.yaml, as a user would have."""
    for name in ("CTRLRUN_CONFIG", "CTRLRUN_STATE", "CTRLRUN_STORE_URL", "CTRLRUN_ENVIRONMENT"):
        monkeypatch.delenv(name, raising=False)
    shutil.copy(ROOT / "ctrlrun.yaml", tmp_path / "ctrlrun.yaml")
    monkeypatch.chdir(tmp_path)
    ctrlrun.reset()
    yield tmp_path
    ctrlrun.reset()


def test_refund_scenario(project):
    remote: list[tuple[str, int]] = []
    lose_reply = {"txn_3"}

    @ctrlrun.protect("stripe.refund", effect="refund:{payment_id}")
    def refund(payment_id: str, amount: int) -> dict:
        remote.append((payment_id, amount))
        if payment_id in lose_reply:
            raise TimeoutError("read timed out after the refund was sent")
        return {"refund": f"re_{payment_id}", "amount": amount}

    with ctrlrun.context(agent="support-agent"):
        # allowed by ./ctrlrun.yaml: runs once
        assert refund(payment_id="txn_1", amount=50_000) == {"refund": "re_txn_1", "amount": 50_000}

        # needs a human
        with pytest.raises(ApprovalRequired) as required:
            refund(payment_id="txn_2", amount=500_000)
    request_id = required.value.request_id
    assert request_id.startswith("apr_") and len(request_id) == 36
    assert required.value.action_hash.startswith("sha256:")
    assert remote == [("txn_1", 50_000)]

    # a human grants it, through the store as the CLI does
    store = SQLiteStateStore(project / ".ctrlrun" / "state.db")
    store.grant_approval(request_id, "cli:local")

    with ctrlrun.context(agent="support-agent"), ctrlrun.with_approval(request_id):
        assert refund(payment_id="txn_2", amount=500_000)["refund"] == "re_txn_2"
        assert remote.count(("txn_2", 500_000)) == 1

        # the same approval, one argument changed: refused, function not called
        with pytest.raises(ApprovalMismatch) as mutated:
            refund(payment_id="txn_2", amount=400_000)
        assert mutated.value.reason == "mismatch"

        # presented again for the exact action: single use
        with pytest.raises(ApprovalMismatch) as replayed:
            refund(payment_id="txn_2", amount=500_000)
        assert replayed.value.reason == "consumed"
    assert len(remote) == 2

    with ctrlrun.context(agent="support-agent"):
        # the remote committed, the reply was lost: AMBIGUOUS, and a retry is refused
        with pytest.raises(TimeoutError):
            refund(payment_id="txn_3", amount=1_000)
        lose_reply.clear()
        with pytest.raises(AmbiguousEffect) as blocked:
            refund(payment_id="txn_3", amount=1_000)
        assert blocked.value.effect_key == "refund:txn_3"

        # policy says no above the approve band
        with pytest.raises(ActionDenied) as denied:
            refund(payment_id="txn_4", amount=500_001)
        assert denied.value.reason == "rule[2]"
    assert remote.count(("txn_3", 1_000)) == 1 and len(remote) == 3

    receipts = store.receipts()
    pairs = [(r.decision, r.result, r.effect_key) for r in receipts]
    assert pairs == [
        ("allow", "committed", "refund:txn_1"),
        ("approve", "committed", "refund:txn_2"),
        ("approve", "blocked", "refund:txn_2"),
        ("approve", "blocked", "refund:txn_2"),
        ("allow", "ambiguous", "refund:txn_3"),
        ("allow", "blocked", "refund:txn_3"),
        ("deny", "denied", "refund:txn_4"),
    ]
    assert [r.seq for r in receipts] == list(range(1, 8))
    assert receipts[1].approval_id == request_id and receipts[1].approver == "cli:local"
    assert "mismatch" in receipts[2].error and "consumed" in receipts[3].error
    assert receipts[4].error == "TimeoutError: read timed out after the refund was sent"
    report = verify_chain(store)
    assert report.ok and report.verified == 7

    # the JSONL copy beside the database holds the same documents, byte for byte
    lines = (project / ".ctrlrun" / "receipts.jsonl").read_text(encoding="utf-8").splitlines()
    assert lines == [r.to_json() for r in receipts]
    assert all(len(json.loads(line)) == 36 for line in lines)
    store.close()
