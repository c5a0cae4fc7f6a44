"""The ``StateStore`` protocol holds exactly what ``Control``, the approval providers and the CLI
call on a store, with the keywords they pass, and every store (memory, SQLite, Postgres) is one.

The callers are read from the source: every attribute taken of a store (a name ``store``, or an
attribute ``.store`` / ``._store``), in the modules that run a call and answer approvals, the operator library, and
``verify_chain``.
"""

from __future__ import annotations

import ast
import inspect
from collections import defaultdict
from pathlib import Path

import ctrlrun
from ctrlrun.store import StateStore
from ctrlrun.store.ops import StoreOps

SRC = Path(ctrlrun.__file__).resolve().parent
CALLERS = (
    "control",  # Control and every step of a protected call (the pipeline, its straight path)
    "protect.py",  # @protect, through control.store
    "approvals",  # the Local and Scripted providers, grant_with_edits
    "adapter.py",  # InterruptApprovalProvider
    "operator",  # the operator library (answers, resolves, pending) the front-ends share
    "store/verify.py",  # verify_chain (ctrlrun receipts --verify-chain, the demo)
    "store/snapshot.py",  # verify_chain's read of a store of another kind
    "cli",  # the operator commands
)


def _store_receiver(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id == "store"
    return isinstance(node, ast.Attribute) and node.attr in ("store", "_store")


def store_uses() -> dict[str, dict[str, set[str]]]:
    """``{member: {caller file: {keywords passed}}}`` for every store attribute the callers use."""
    uses: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    files = []
    for name in CALLERS:
        path = SRC / name
        files += sorted(path.glob("*.py")) if path.is_dir() else [path]
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _store_receiver(node.value):
                uses[node.attr].setdefault(path.name, set())
            if isinstance(node, ast.Call):
                func = node.func
                if isinstance(func, ast.Attribute) and _store_receiver(func.value):
                    uses[func.attr][path.name].update(k.arg for k in node.keywords if k.arg)
                # call(self._store.method, ..., keyword=...): the Control's blocking-step helper
                for arg in node.args[:1]:
                    if isinstance(arg, ast.Attribute) and _store_receiver(arg.value):
                        uses[arg.attr][path.name].update(k.arg for k in node.keywords if k.arg)
    return uses


def protocol_members() -> set[str]:
    """The protocol's members, its capabilities' protocols' (``EffectStore``, ``ApprovalStore``, …) with them."""
    members: set[str] = set()
    for part in StateStore.__mro__:
        if part.__module__.startswith("ctrlrun."):
            members |= {n for n, v in vars(part).items() if not n.startswith("_") and callable(v)}
            members |= set(getattr(part, "__annotations__", {}))
    return members


def test_the_protocol_holds_exactly_what_its_callers_call():
    uses = store_uses()
    members = protocol_members()
    unused = sorted(members - set(uses))
    assert not unused, f"StateStore members no caller uses (move them to StoreOps): {unused}"
    missing = sorted(set(uses) - members)
    assert not missing, f"store members callers use but StateStore lacks: {missing}"
    assert "transactions" not in members and "reserve_effect" not in members


def test_the_protocol_accepts_every_keyword_its_callers_pass():
    for member, by_file in store_uses().items():
        parameters = inspect.signature(getattr(StateStore, member)).parameters
        for caller, keywords in by_file.items():
            unknown = sorted(keywords - set(parameters))
            assert not unknown, f"{caller} passes {unknown} to {member}(), not in StateStore"


def test_every_protocol_method_is_implemented_with_the_same_parameters():
    for member in protocol_members():
        declared = inspect.signature(getattr(StateStore, member)).parameters
        implemented = inspect.signature(getattr(StoreOps, member)).parameters
        assert list(declared) == list(implemented)[: len(declared)], member
        for name, parameter in declared.items():
            assert implemented[name].kind == parameter.kind, (member, name)


def test_every_store_is_a_state_store(store):
    """Memory, SQLite and Postgres (the ``store`` fixture runs each)."""
    assert isinstance(store, StateStore) and isinstance(store, StoreOps)


def test_a_store_with_only_the_protocol_methods_is_a_state_store():
    def double(members: set[str]) -> object:
        return type("Double", (), {m: lambda self, *a, **k: None for m in members})()

    assert isinstance(double(protocol_members()), StateStore)
    assert not isinstance(double(protocol_members() - {"close"}), StateStore)
