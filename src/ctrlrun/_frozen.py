"""Frozen dataclasses built at the cost of mutable ones, for the few made on every call.

A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``, four times
the cost of a plain assignment. ``builder(cls)`` makes a mutable twin with the same slots,
fills it with the twin's plain ``__init__`` and turns it into a ``cls`` (``__class__``
assignment, allowed because the two layouts are the same): the same object ``cls(...)`` gives,
frozen from then on, at about a third of the cost.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, field, fields, make_dataclass
from typing import Any, TypeVar

__all__ = ["builder"]

T = TypeVar("T")


def builder(cls: type[T]) -> Callable[..., T]:
    """A function taking ``cls``'s fields as ``cls`` does (defaults included) and returning the
    ``cls`` it would, except that ``__post_init__`` is not called: call it yourself when it
    checks or derives anything for the values you pass."""
    spec: list[Any] = []
    for f in fields(cls):  # type: ignore[arg-type]
        if f.default is not MISSING:
            spec.append((f.name, Any, field(default=f.default, init=f.init)))
        elif f.default_factory is not MISSING:
            spec.append((f.name, Any, field(default_factory=f.default_factory, init=f.init)))
        else:
            spec.append((f.name, Any, field(init=f.init)))

    def become(self: Any) -> None:  # the twin's __post_init__: filled, it becomes a ``cls``
        self.__class__ = cls

    twin = make_dataclass(
        f"_{cls.__name__}Twin", spec, slots=True, eq=False, repr=False,
        namespace={"__post_init__": become},
    )  # fmt: skip
    if getattr(cls, "__slots__", None) != getattr(twin, "__slots__", ()):
        raise TypeError(f"{cls.__name__} must be a slots dataclass for builder()")
    return twin
