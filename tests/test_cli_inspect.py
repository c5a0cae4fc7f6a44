"""``ctrlrun inspect ID``: every ID kind tells the same story, by indexed lookups only."""

from __future__ import annotations

import json

import pytest

from ctrlrun.operator.inspect import inspect_story
from ctrlrun.errors import CTRLRunError

from ._cli_helpers import invoke


@pytest.fixture
def approved(project):
    """A request granted by the CLI, then spent by the retried call (a committed effect)."""
    request_id = project.request(payment_id="txn_big", amount=200_000)
    assert invoke(["approve", request_id], clock=project.clock).code == 0
    project.call(payment_id="txn_big", amount=200_000, approval=request_id)
    (receipt,) = project.store.receipts_for(approval_id=request_id)
    return project, request_id, receipt


def _documents(project, ident):
    result = invoke(["inspect", ident, "--json"], clock=project.clock)
    assert result.code == 0, result.err
    return [json.loads(line) for line in result.lines]


def test_every_id_kind_finds_the_whole_story(approved):
    project, request_id, receipt = approved
    for ident in (request_id, receipt.receipt_id, receipt.action_id, "refund:txn_big"):
        documents = _documents(project, ident)
        kinds = [d["kind"] for d in documents]
        assert "request" in kinds and "effect" in kinds and "receipt" in kinds, (ident, kinds)
        (request,) = [d for d in documents if d["kind"] == "request"]
        assert request["request_id"] == request_id and request["status"] == "consumed"
        assert [h["what"] for h in request["history"]] == ["requested", "granted", "consumed"]
        assert request["history"][1]["by"] == "cli:local"
        (effect,) = [d for d in documents if d["kind"] == "effect"]
        assert effect["state"] == "committed"
        assert effect["attempts"][0]["receipt_id"] == receipt.receipt_id
        (mine,) = [d for d in documents if d["kind"] == "receipt"]
        assert (mine["receipt_id"], mine["seq"], mine["hash"], mine["result"]) == (
            receipt.receipt_id, receipt.seq, receipt.hash, "committed")
        actions = [d for d in documents if d["kind"] == "action"]
        spent = [a for a in actions if a["action_id"] == receipt.action_id]
        assert spent and spent[0]["arguments"] == {"amount": 200_000, "payment_id": "txn_big"}
        assert spent[0]["decisions"][0]["decision"] == "approve"
        assert spent[0]["decisions"][0]["policy_hash"] == receipt.policy_hash


def test_the_action_that_asked_is_told_as_fully_as_the_key_tells_it(approved):
    """The action that raised ApprovalRequired has no receipt of its own: its name, principal,
    arguments and policy come from the request that holds it."""
    project, request_id, _ = approved
    record = project.store.get_approval(request_id)
    asked = record.request.action.action_id
    by_key = [d for d in _documents(project, "refund:txn_big") if d["kind"] == "action" and d["action_id"] == asked]
    (mine,) = [d for d in _documents(project, asked) if d["kind"] == "action" and d["action_id"] == asked]
    assert mine["action"] == "stripe.refund" and mine["principal"] == {"agent": "support-agent", "user": None}
    assert mine["arguments"] == {"amount": 200_000, "payment_id": "txn_big"}
    assert mine["action_hash"] == record.request.action_hash
    assert mine["decisions"][0]["policy_hash"] == record.request.policy_hash is not None
    assert not by_key or by_key[0] == mine
    text = invoke(["inspect", asked], clock=project.clock).out
    assert f"action {asked}  stripe.refund  support-agent  {record.request.action_hash}" in text
    assert '  arguments {"amount":200000,"payment_id":"txn_big"}' in text
    assert "policy -" not in text


def test_text_output_names_each_part(approved):
    project, request_id, receipt = approved
    result = invoke(["inspect", request_id], clock=project.clock)
    assert result.code == 0, result.err
    text = result.out
    assert f"request {request_id}  consumed" in text
    assert "granted by cli:local" in text
    assert f"receipt {receipt.receipt_id}  seq {receipt.seq}  {receipt.hash}  approve/committed" in text
    assert "effect refund:txn_big  committed  attempt 1" in text


@pytest.mark.parametrize("ident", ("act_nothing", "apr_nothing", "ctr_nothing", "refund:nothing"))
def test_an_unknown_id_exits_1_naming_it(project, ident):
    project.call(payment_id="txn_1", amount=1)
    result = invoke(["inspect", ident], clock=project.clock)
    assert result.code == 1 and result.out == ""
    assert ident in result.err and "not found" in result.err and "act_" in result.err


def test_hostile_argument_text_is_escaped(project):
    project.call(payment_id="txn_\x1b[2J\u202eevil", amount=1)
    result = invoke(["inspect", "refund:txn_\x1b[2J\u202eevil"], clock=project.clock)
    assert result.code == 0, result.err
    assert "\x1b" not in result.out and "\u202e" not in result.out
    assert "\\x1b[2J\\u202eevil" in result.out


def test_no_store_is_created_for_a_missing_path(workdir):
    missing = workdir / "nothing" / "state.db"
    result = invoke(["inspect", "act_x", "--store-url", f"sqlite://{missing}"])
    assert result.code == 1 and "no database at" in result.err
    assert not missing.parent.exists()


def test_exactly_one_of_id_and_grant(project):
    assert invoke(["inspect"], clock=project.clock).code == 2
    assert invoke(["inspect", "act_x", "--grant", "g"], clock=project.clock).code == 2


def test_the_library_function_on_every_store(store, clock):
    from .test_store_conformance import make_receipt

    placed = store.put_receipt(make_receipt(1))
    documents = inspect_story(store, placed.receipt_id)
    assert [d["kind"] for d in documents] == ["action", "receipt"]
    assert documents[-1]["seq"] == placed.seq and documents[-1]["hash"] == placed.hash
    assert inspect_story(store, placed.action_id) == documents
    with pytest.raises(CTRLRunError, match="ctr_unknown not found"):
        inspect_story(store, "ctr_unknown")
