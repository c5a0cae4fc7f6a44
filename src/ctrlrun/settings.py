"""Every ``CTRLRUN_*`` environment variable, read here and nowhere else, each refused in one
message when it is set but blank; and ``Settings``, what an operator front-end runs with."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

from ._time import utc_now
from .errors import InvalidArgument, PolicyError

__all__ = [
    "VARIABLES", "Settings", "Variable", "configured_policy", "console_secret", "default_inputs", "environment_name",
    "named_variable", "policy_path", "selects_store", "state_location", "without_ctrlrun",
]  # fmt: skip


class Variable(NamedTuple):
    """One setting taken from the environment: its name and what it sets (docs/cli.md's table)."""

    name: str
    meaning: str


VARIABLES: tuple[Variable, ...] = (
    Variable("CTRLRUN_CONFIG", "the policy file (default ./ctrlrun.yaml)"),
    Variable("CTRLRUN_STORE_URL", "the store: sqlite://<path> or postgresql://… (first choice)"),
    Variable("CTRLRUN_STATE", "a SQLite file for the store, when CTRLRUN_STORE_URL is unset"),
    Variable("CTRLRUN_ENVIRONMENT", "the environment actions run in (default: the policy's, else production)"),
    Variable("CTRLRUN_CONSOLE_SECRET", "the console's session-signing key (default: a file beside the users file)"),
)

_BLANK_FIX = {
    "CTRLRUN_CONFIG": "set it to a policy file path, or unset it to use ./ctrlrun.yaml",
    "CTRLRUN_ENVIRONMENT": "unset it or name the environment",
    "CTRLRUN_CONSOLE_SECRET": "unset it or give it a long random value",
}


def _read(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """``name``'s value, None when unset; a blank value is refused, naming the variable and the fix."""
    value = (os.environ if environ is None else environ).get(name)
    if value is not None and not value.strip():
        fix = _BLANK_FIX.get(name, "unset it or give it a value")
        error = PolicyError if name == "CTRLRUN_CONFIG" else InvalidArgument
        raise error(f"{name} is set but blank; {fix}")
    return value


def policy_path(path: str | os.PathLike[str] | None = None) -> Path:
    """The policy file: ``path``, else ``$CTRLRUN_CONFIG``, else ``./ctrlrun.yaml`` (absolute)."""
    if path is None:
        path = _read("CTRLRUN_CONFIG") or "ctrlrun.yaml"
    try:
        return Path(os.fspath(path)).expanduser().absolute()
    except (TypeError, ValueError) as exc:
        raise PolicyError(f"{path!r}: not a usable policy path ({exc})") from None


def state_location(policy_file: Path | None = None) -> str:
    """The store URL to use: ``$CTRLRUN_STORE_URL``, ``$CTRLRUN_STATE``, else next to the policy.

    Every variable that selects a store is checked, so a blank one is refused even when a
    higher-priority one is set."""
    url = _read("CTRLRUN_STORE_URL")
    state = _read("CTRLRUN_STATE")
    configured = _read("CTRLRUN_CONFIG") if policy_file is None else None
    if url is not None:
        return url
    if state is not None:
        if state.strip() == ":memory:" or "mode=memory" in state:
            raise InvalidArgument(
                "CTRLRUN_STATE names an in-memory database, which processes cannot share; "
                "give it a file path"
            )
        return "sqlite://" + str(Path(state).expanduser().absolute())
    policy_file = policy_file if policy_file is not None else policy_path(configured)
    return "sqlite://" + str(policy_file.parent / ".ctrlrun" / "state.db")


def configured_policy() -> str | None:
    """``$CTRLRUN_CONFIG`` as set, or None when unset."""
    return _read("CTRLRUN_CONFIG")


def selects_store() -> bool:
    """True when the environment names a store (or a policy beside which the store lives)."""
    return any(name in os.environ for name in ("CTRLRUN_STORE_URL", "CTRLRUN_STATE", "CTRLRUN_CONFIG"))


def environment_name() -> str | None:
    """``$CTRLRUN_ENVIRONMENT``, the environment actions run in, or None when unset."""
    return _read("CTRLRUN_ENVIRONMENT")


def console_secret(environ: Mapping[str, str] | None = None) -> str | None:
    """``$CTRLRUN_CONSOLE_SECRET``, the console's session-signing key, or None when unset."""
    return _read("CTRLRUN_CONSOLE_SECRET", environ)


def named_variable(name: str) -> str | None:
    """A variable the operator named on the command line (a webhook secret, an upstream header's
    value): read only from the environment, so the secret never appears in ``ps``."""
    return os.environ.get(name)


def default_inputs() -> tuple[Any, ...]:
    """What the default Control is built from; it is rebuilt when any of these change."""
    names = ("CTRLRUN_CONFIG", "CTRLRUN_STATE", "CTRLRUN_STORE_URL", "CTRLRUN_ENVIRONMENT")
    return (*(os.environ.get(name) for name in names), os.getcwd())


def without_ctrlrun(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment minus every ``CTRLRUN_*`` variable, for a child process that must not see
    the store URL, the policy path or a secret."""
    source = os.environ if environ is None else environ
    return {name: value for name, value in source.items() if not name.startswith("CTRLRUN_")}


@dataclass
class Settings:
    """What an operator front-end (the CLI, the console, the MCP operator) runs with: the clock it
    judges time by; tests pass their own (``obj=Settings(clock=...)``)."""

    clock: Callable[[], datetime] = field(default=utc_now)

    def store_location(self, option: str | None = None) -> str:
        """``--store-url`` (``option``), else the environment's store, else beside the policy."""
        if option is not None:
            if not option.strip():
                raise InvalidArgument("--store-url is blank; give a store URL such as sqlite://<path>")
            return option
        return state_location()

    def policy_path(self, option: str | os.PathLike[str] | None = None) -> Path:
        """``--policy`` (``option``), else ``$CTRLRUN_CONFIG``, else ``./ctrlrun.yaml``."""
        return policy_path(option)
