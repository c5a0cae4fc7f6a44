"""A call's settings as the Control checks them once, and the names they are typed with."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from .errors import InvalidArgument
from .policy import Policy

__all__ = ["Reconcile", "ReconcileOutcome"]

ReconcileOutcome = Literal["committed", "not_executed", "unknown"]
Reconcile = Callable[[str], ReconcileOutcome]


@dataclass(frozen=True)
class _Options:
    effect_key: str | None
    lease: timedelta
    reconcile: Reconcile | None
    reconcile_eagerly: bool
    task: str | None
    hop: str | None


def _positive(value: timedelta, what: str) -> timedelta:
    if not isinstance(value, timedelta) or value <= timedelta(0):
        raise InvalidArgument(f"{what} must be a positive timedelta, got {value!r}")
    return value


def _resolve_environment(argument: str | None, policy: Policy) -> str:
    if argument is not None:
        if not isinstance(argument, str) or not argument.strip():
            raise InvalidArgument("Control(environment=...) must be a non-empty string")
        return argument
    if "CTRLRUN_ENVIRONMENT" in os.environ:
        value = os.environ["CTRLRUN_ENVIRONMENT"]
        if not value.strip():
            raise InvalidArgument(
                "CTRLRUN_ENVIRONMENT is set but blank; unset it or name the environment"
            )
        return value
    return policy.environment or "production"
