"""The package is typed for its users: ``py.typed`` ships, properties are typed and read-only,
and ``Control.run``/``arun``/``pipeline`` take the same typed options as ``execute``."""

from __future__ import annotations

import inspect
from importlib.resources import files

import pytest

from ctrlrun import Control, InMemoryStateStore, Policy
from ctrlrun.control.options import CallOptions


def test_py_typed_ships_with_the_package():
    assert (files("ctrlrun") / "py.typed").is_file()


def test_control_properties_are_read_only():
    control = Control(Policy.from_yaml("schema: ctrlrun.policy/v2\nactions: {}\n"), InMemoryStateStore())
    assert control.authority is None and control.require_approved_policy is False
    assert isinstance(control.store, InMemoryStateStore)
    with pytest.raises(AttributeError, match="read-only"):
        control.store = InMemoryStateStore()  # type: ignore[misc]


def test_run_takes_the_options_execute_names():
    named = set(inspect.signature(Control.execute).parameters) - {"self", "action", "executor", "effect_key"}
    assert named == set(CallOptions.__annotations__)
    for method in (Control.run, Control.arun, Control.pipeline):
        settings = inspect.signature(method).parameters["settings"]
        assert "CallOptions" in str(settings.annotation)


def test_receipt_result_and_decision_are_their_enums_and_the_json_is_unchanged():
    import json

    from ctrlrun import context, protect
    from ctrlrun.policy import Decision
    from ctrlrun.evidence.receipt import Receipt, ReceiptResult

    policy = Policy.from_yaml(
        "schema: ctrlrun.policy/v2\nactions:\n  a.b:\n    effect: \"k:{x}\"\n    decision: allow\n"
    )
    store = InMemoryStateStore()
    run = protect("a.b", control=Control(policy, store))(lambda x: x)
    with context(agent="agent-1"):
        run(x="1")
    (receipt,) = store.receipts()
    assert type(receipt.result) is ReceiptResult and receipt.result is ReceiptResult.COMMITTED
    assert type(receipt.decision) is Decision and receipt.decision == "allow"
    document = json.loads(receipt.to_json())
    assert document["result"] == "committed" and type(document["result"]) is str
    again = Receipt.from_json(receipt.to_json(), hash=receipt.hash)
    assert again.chain_hash() == receipt.hash
    odd = Receipt.from_dict({**document, "result": "edited-by-hand"})
    assert odd.result == "edited-by-hand"  # kept as read: the chain check reports it
    from ctrlrun import Principal

    assert receipt.principal == Principal("agent-1") and again.principal.agent == "agent-1"
    foreign = Receipt.from_dict({**document, "principal": {"agent": "x", "role": "admin"}})
    assert foreign.principal == {"agent": "x", "role": "admin"}  # not a Principal: as read
    assert foreign.to_dict()["principal"] == {"agent": "x", "role": "admin"}


def test_the_errors_form_one_tree_a_caller_can_act_on():
    import ctrlrun.errors as errors

    refusals = ["ActionDenied", "AuthorityDenied", "ApprovalRequired", "ApprovalTimeout",
                "ApprovalMismatch", "DuplicateEffect", "AmbiguousEffect", "AuthorityEscalation",
                "IdentityError"]  # fmt: skip
    usage = ["InvalidArgument", "PolicyError", "EffectKeyError", "MissingDependency"]
    store = ["StoreUnavailable", "AmbiguousWrite", "SchemaMismatch"]
    for names, kind in ((refusals, errors.Refusal), (usage, errors.UsageError), (store, errors.StoreError)):
        for name in names:
            assert issubclass(getattr(errors, name), kind), name
    assert not issubclass(errors.AmbiguousWrite, errors.AmbiguousEffect)
    assert issubclass(errors.InvalidArgument, ValueError) and issubclass(errors.MissingDependency, ImportError)
    kinds = (errors.Refusal, errors.UsageError, errors.StoreError, errors.NotExecuted, errors.Suspended)
    for name in errors.__all__:
        error = getattr(errors, name)
        assert error is errors.CTRLRunError or issubclass(error, errors.CTRLRunError)
        if error not in (errors.CTRLRunError, *kinds):
            assert issubclass(error, kinds), f"{name} belongs to no kind"


def test_a_busy_sqlite_store_is_store_unavailable(tmp_path):
    import sqlite3

    from ctrlrun.errors import StoreUnavailable
    from ctrlrun.store import SQLiteStateStore

    store = SQLiteStateStore(tmp_path / "state.db")
    error = store._driver_error(sqlite3.OperationalError("database is locked"), "writing")
    assert type(error) is StoreUnavailable and "busy" in str(error)
    store.close()
