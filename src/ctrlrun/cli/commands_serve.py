"""``ctrlrun serve``: the approver's console over the operator's store, and ``serve adduser``."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import click

from ..errors import CTRLRunError, MissingDependency
from ..settings import named_variable
from .stores import Settings, select_store_url, store_url_option
from .text import say

__all__ = ["serve"]

_EXTRA = (("starlette",), ("jinja2",), ("uvicorn",), ("python_multipart", "multipart"), ("itsdangerous",))
_DURATION = re.compile(r"P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)S)?)?", re.IGNORECASE)


def _require_extra() -> None:
    """Refuse (exit 1) naming the install line when the console's packages are missing: only the
    clone's ``.[console]``, since the ``ctrlrun`` on the public index is another project."""
    import importlib

    for names in _EXTRA:
        if not any(_importable(importlib, name) for name in names):
            raise MissingDependency(
                f"ctrlrun serve needs the console extra ({names[0]} is not installed): run "
                "pip install '.[console]' from the root of your ctrlrun clone (the 'ctrlrun' on "
                "PyPI is another project)",
                module=names[0],
                extra="console",
            )


def _importable(importlib: Any, name: str) -> bool:
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


def parse_duration(text: str) -> float:
    """An ISO 8601 duration such as ``PT10M`` or ``PT2S`` → seconds (more than zero)."""
    match = _DURATION.fullmatch(text.strip())
    if match is None or not any(match.groups()):
        raise click.BadParameter(f"{text!r} is not an ISO 8601 duration; write e.g. PT10M or PT30S")
    days, hours, minutes, seconds = (int(g or 0) for g in match.groups())
    total = float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)
    if total <= 0:
        raise click.BadParameter(f"{text!r} is zero; give a positive duration such as PT10M")
    return total


def _notify_settings(webhooks: tuple[str, ...], fmt: str, secret_env: str | None, escalate_after: str | None,
                     escalate_webhook: str | None, base_url: str | None) -> object | None:  # fmt: skip
    from ..console.settings import NotifySettings

    if (escalate_after is None) != (escalate_webhook is None):
        raise click.UsageError("give --escalate-after and --escalate-webhook together")
    after = parse_duration(escalate_after) if escalate_after is not None else None
    secret = None
    if secret_env is not None:
        value = named_variable(secret_env)
        if not value:
            raise CTRLRunError(f"--webhook-secret-env {secret_env}: the variable is unset or empty; "
                               "export the webhook secret in it")  # fmt: skip
        secret = value.encode("utf-8")
    if not webhooks and escalate_webhook is None:
        if secret_env is not None:
            raise click.UsageError("--webhook-secret-env needs a --webhook or --escalate-webhook")
        return None
    return NotifySettings(webhooks=webhooks, format=fmt, secret=secret, escalate_after=after,
                          escalate_webhook=escalate_webhook, base_url=base_url)  # fmt: skip


@click.group(invoke_without_command=True)
@click.option("--listen", default="127.0.0.1:8765", show_default=True, metavar="HOST:PORT",
              help="Address to listen on; port 0 picks a free one (named on stderr).")
@click.option("--allow-remote", is_flag=True, help="Allow a non-loopback --listen address.")
@store_url_option
@click.option("--users", "users", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Users file written by `ctrlrun serve adduser` (log in with a password).")
@click.option("--auth-header", default=None, metavar="NAME",
              help="Take the approver from this header, set by an authenticating reverse proxy.")
@click.option("--trusted-proxy", "trusted", multiple=True, metavar="ADDR",
              help="Peer address of that proxy (repeatable); other peers get 403.")
@click.option("--base-url", default=None, metavar="URL",
              help="The console's public URL (links in webhooks; https makes the cookie Secure).")
@click.option("--webhook", "webhooks", multiple=True, metavar="URL",
              help="Tell this URL about new requests and ambiguous effects (repeatable).")
@click.option("--webhook-format", type=click.Choice(["json", "slack"]), default="json", show_default=True)
@click.option("--webhook-secret-env", default=None, metavar="NAME",
              help="Sign webhook bodies with the secret in this environment variable.")
@click.option("--escalate-after", default=None, metavar="DURATION",
              help="Escalate a request still pending after this long (ISO 8601, e.g. PT10M).")
@click.option("--escalate-webhook", default=None, metavar="URL", help="Where escalations are sent.")
@click.pass_context
def serve(ctx: click.Context, listen: str, allow_remote: bool, store_url: str | None, users: Path | None,
          auth_header: str | None, trusted: tuple[str, ...], base_url: str | None, webhooks: tuple[str, ...],
          webhook_format: str, webhook_secret_env: str | None, escalate_after: str | None,
          escalate_webhook: str | None) -> None:  # fmt: skip
    """Serve the approver's console: the pending queue, approve/deny/edit, resolve, receipts."""
    if ctx.invoked_subcommand is not None:
        return
    if (users is None) == (auth_header is None):
        raise click.UsageError("give exactly one identity source: --users PATH, or --auth-header NAME "
                               "with --trusted-proxy ADDR")  # fmt: skip
    if auth_header is not None and (not auth_header.strip() or not trusted):
        raise click.UsageError("--auth-header needs a header name and at least one --trusted-proxy ADDR")
    if users is not None and trusted:
        raise click.UsageError("--trusted-proxy goes with --auth-header, not --users")
    from ..console.serve import is_loopback, parse_listen

    host, port = parse_listen(listen)
    if not is_loopback(host) and not allow_remote:
        raise click.UsageError(f"--listen {listen} is not a loopback address; add --allow-remote to "
                               "serve other hosts (put it behind TLS)")  # fmt: skip
    notify = _notify_settings(webhooks, webhook_format, webhook_secret_env, escalate_after, escalate_webhook, base_url)
    _require_extra()
    from ..console.auth import load_users, session_secret
    from ..console.serve import run
    from ..console.settings import ConsoleSettings, NotifySettings

    if users is not None:
        load_users(users)  # refuse a missing or malformed file before listening
    settings: Settings = ctx.find_object(Settings) or Settings()
    url = select_store_url(store_url)
    console = ConsoleSettings(users_path=users, auth_header=auth_header, trusted_proxies=frozenset(trusted),
                              base_url=base_url, secret=session_secret(users), clock=settings.clock)  # fmt: skip
    assert notify is None or isinstance(notify, NotifySettings)
    try:
        interrupted = run(url, console, host, port, notify, settings)
    except KeyboardInterrupt:  # SIGINT before the console listened (its own handler was not set yet)
        interrupted = True
    if interrupted:
        say("ctrlrun serve: stopped (interrupted)", err=True)
        raise click.exceptions.Exit(130)  # 128 + SIGINT, as a shell reports Ctrl-C; not click's "Aborted!"


def _read_password(name: str) -> str:
    """The password twice: prompted on a terminal, else the first two lines of stdin."""
    if sys.stdin.isatty():
        password: str = click.prompt(f"password for {name}", hide_input=True, confirmation_prompt=True)
        return password
    first, second = sys.stdin.readline(), sys.stdin.readline()
    if not first.endswith("\n") and not second:
        raise CTRLRunError("give the password and its confirmation as the first two lines of stdin; nothing was written")
    if first.rstrip("\r\n") != second.rstrip("\r\n"):
        raise CTRLRunError("the two passwords differ; nothing was written")
    return first.rstrip("\r\n")


@serve.command()
@click.argument("name")
@click.option("--users", "users", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="The users file to add NAME to (created with mode 0600).")
def adduser(name: str, users: Path) -> None:
    """Add a console user (or set a new password); asks the password twice, or reads two stdin lines."""
    from ..console.auth import add_user, valid_name

    if not valid_name(name):
        raise click.BadParameter("use 1-64 letters, digits and ._@- (starting with a letter or digit)",
                                 param_hint="NAME")  # fmt: skip
    password = _read_password(name)
    if not password:
        raise CTRLRunError("the password is empty; nothing was written")
    add_user(users, name, password)
    say(f"added {name} to {users}")
