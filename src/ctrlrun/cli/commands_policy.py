"""``init`` (write the starter policy) and ``policy check`` (validate a policy, run nothing)."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

import click

from ..settings import policy_path
from ..errors import CTRLRunError, PolicyError
from ..policy import Policy
from .commands_stats import observe_banner
from .text import say

__all__ = ["init", "policy", "starter_policy"]


def starter_policy() -> bytes:
    """The starter ``ctrlrun.yaml`` shipped inside the package."""
    return resources.files(__package__).joinpath("starter.yaml").read_bytes()


@click.command()
def init() -> None:
    """Write a starter ./ctrlrun.yaml and create ./.ctrlrun/."""
    here = Path.cwd()
    target = here / "ctrlrun.yaml"
    state_dir = here / ".ctrlrun"
    if target.exists() or target.is_symlink():
        raise CTRLRunError(f"{target} already exists; it was left untouched")
    if state_dir.exists() and not state_dir.is_dir():
        raise CTRLRunError(f"{state_dir} exists and is not a directory; move it away, then run init")
    try:
        with open(target, "xb") as handle:
            handle.write(starter_policy())
    except FileExistsError:
        raise CTRLRunError(f"{target} already exists; it was left untouched") from None
    except OSError as exc:
        raise CTRLRunError(f"cannot write {target}: {exc.strerror or exc}") from None
    existed = state_dir.is_dir()
    try:
        state_dir.mkdir(exist_ok=True)
    except OSError as exc:
        raise CTRLRunError(f"wrote {target}, but cannot create {state_dir}: {exc.strerror or exc}") from None
    say(f"wrote {target}")
    say(f"{'kept existing' if existed else 'created'} {state_dir}{os.sep}")
    say("edit the policy, then protect an action with @ctrlrun.protect(...)")


@click.group()
def policy() -> None:
    """Work with policy files."""


@policy.command("check")
@click.argument("file", required=False)
def check(file: str | None) -> None:
    """Validate a policy (FILE, else $CTRLRUN_CONFIG, else ./ctrlrun.yaml); opens no store."""
    path = policy_path(file)
    try:
        loaded = Policy.from_file(path)
    except PolicyError as exc:
        message = str(exc)
        if not message.startswith(f"{path}:"):
            message = f"{path}: {message}"
        raise PolicyError(message) from None
    observe_banner(loaded)
    missing = loaded.unenforced_features()
    if missing:
        raise PolicyError(
            f"{path}: {', '.join(missing)} is not enforced by this version of ctrlrun; the policy "
            "loads, but a Control refuses to run it: remove it from the policy"
        )
    say(f"ok {path}")
    say(f"schema {loaded.schema}  mode {loaded.mode}  actions {len(loaded.actions)}")
    say(f"policy_hash {loaded.policy_hash}")
