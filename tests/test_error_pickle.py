"""Every ``CTRLRunError`` survives ``pickle`` with its type, message and attributes: a refusal
raised in a worker process, or stored by a durable engine, reaches the caller as itself."""

from __future__ import annotations

import importlib
import inspect
import pickle
import pkgutil
from concurrent.futures import ProcessPoolExecutor

import pytest

import ctrlrun
from ctrlrun.errors import CTRLRunError, DuplicateEffect



def _all_classes() -> list[type[CTRLRunError]]:
    for info in pkgutil.walk_packages(ctrlrun.__path__, "ctrlrun."):
        if info.name.endswith("__main__"):
            continue
        try:
            importlib.import_module(info.name)
        except Exception:  # an extra that is not installed: its classes are not reachable either
            continue
    found, todo = set(), [CTRLRunError]
    while todo:
        cls = todo.pop()
        if cls not in found:
            found.add(cls)
            todo.extend(cls.__subclasses__())
    return sorted(found, key=lambda c: f"{c.__module__}.{c.__qualname__}")


def _instance(cls: type[CTRLRunError]) -> CTRLRunError:
    values = {}
    for name, p in inspect.signature(cls.__init__).parameters.items():
        if name == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.default is p.empty or name == "message":
            values[name] = f"the {name}" if name != "message" else f"{cls.__name__}: a message"
    try:
        return cls(**values)
    except Exception:  # a constructor that checks its values: the message alone
        return cls.__new__(cls)


CLASSES = _all_classes()


def test_every_class_is_found():
    names = {c.__name__ for c in CLASSES}
    assert {"ActionDenied", "ApprovalMismatch", "DuplicateEffect", "AmbiguousEffect", "PruneRefused",
            "AnchorUnavailable", "MissingDependency"} <= names  # fmt: skip


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__qualname__)
def test_round_trip(cls):
    error = _instance(cls)
    error.extra_attribute = ("kept", 1)
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is cls
    assert str(back) == str(error) and back.args == error.args
    assert vars(back) == vars(error)


def _refuse(key: str) -> None:
    raise DuplicateEffect(effect_key=key, state="committed")


def test_a_refusal_raised_in_a_worker_process_reaches_the_caller_as_itself():
    with ProcessPoolExecutor(max_workers=1) as pool:
        with pytest.raises(DuplicateEffect) as refused:
            pool.submit(_refuse, "refund:txn_1").result()
    assert (refused.value.effect_key, refused.value.state) == ("refund:txn_1", "committed")
