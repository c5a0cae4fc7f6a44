"""A call's settings as the Control checks them once, and the names they are typed with."""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Generic, Literal, NamedTuple, TypedDict, TypeVar, overload

from ..errors import InvalidArgument

if TYPE_CHECKING:
    from ..policy import Policy

__all__ = ["CallOptions", "ReadOnly", "Reconcile", "ReconcileOutcome", "check_provider"]

T = TypeVar("T")

ReconcileOutcome = Literal["committed", "not_executed", "unknown"]
Reconcile = Callable[[str], ReconcileOutcome]


class CallOptions(TypedDict, total=False):
    """The keyword options of ``Control.run``, ``arun`` and ``pipeline`` (as ``execute`` names them)."""

    lease: timedelta | None
    reconcile: Reconcile | None
    reconcile_eagerly: bool
    preconditions: Any
    task: str | None
    hop: str | None
    scope: Any


class _Options(NamedTuple):
    """One call's settings, checked (a tuple: one is made per call)."""

    effect_key: str | None
    lease: timedelta
    reconcile: Reconcile | None
    reconcile_eagerly: bool
    task: str | None
    hop: str | None
    preconditions: Callable[..., Any] | None = None  # action -> the resource's state


def _positive(value: timedelta, what: str) -> timedelta:
    if not isinstance(value, timedelta) or value <= timedelta(0):
        raise InvalidArgument(f"{what} must be a positive timedelta, got {value!r}")
    return value


def _resolve_environment(argument: str | None, policy: Policy) -> str:
    if argument is not None:
        if not isinstance(argument, str) or not argument.strip():
            raise InvalidArgument("Control(environment=...) must be a non-empty string")
        return argument
    from ..settings import environment_name

    return environment_name() or policy.environment or "production"


def check_provider(provider: Any, action_name: str) -> None:
    """Refuse a ``preconditions=`` that is given but not callable."""
    if provider is not None and not callable(provider):
        raise InvalidArgument(
            f"preconditions= for action {action_name!r} must be callable (action -> mapping of "
            f"the resource's state), got a {type(provider).__name__}"
        )


class ReadOnly(Generic[T]):
    """A typed read-only attribute backed by another: ``policy = ReadOnly[Policy]("wiring.policy")``."""

    def __init__(self, attribute: str) -> None:
        self._get = attrgetter(attribute)  # a dotted path reads through: ``"wiring.policy"``

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> ReadOnly[T]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...
    def __get__(self, obj: object | None, owner: type | None = None) -> ReadOnly[T] | T:
        if obj is None:
            return self
        value: T = self._get(obj)
        return value

    def __set__(self, obj: object, value: Any) -> None:
        raise AttributeError(f"{type(obj).__name__}.{self._name} is read-only")
