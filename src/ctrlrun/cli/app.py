"""The ``ctrlrun`` click group: shared settings and one place that turns every error into ``Error: …``."""

from __future__ import annotations

import logging
from typing import Any

import click

from .. import __version__
from ..errors import CTRLRunError
from .commands_approvals import approve, deny
from .commands_authority import delegate, inspect, revoke
from .commands_effects import effects, resolve
from .commands_operator import mcp_operator
from .commands_pending import pending
from .commands_policy import init, policy
from .commands_receipts import receipts
from .commands_serve import serve
from .commands_stats import stats
from .demo import demo
from .gateway import gateway
from .stores import Settings
from .text import reader_left, reset_output, safe

__all__ = ["cli"]

log = logging.getLogger("ctrlrun.cli")


class CtrlrunGroup(click.Group):
    """A group whose commands never show a traceback: refusals exit 1, usage errors exit 2, and
    a reader closing the pipe ends the command quietly."""

    def make_context(
        self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any
    ) -> click.Context:
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.ClickException as exc:
            setattr(exc, "message", safe(exc.message))  # click declares it Final
            raise
        except BrokenPipeError:  # --help or --version into a closed pipe
            reader_left()
            raise click.exceptions.Exit(0) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.exceptions.Abort):
            raise
        except BrokenPipeError:  # only click's own output (a command's --help) gets here
            reader_left()
            raise click.exceptions.Exit(0) from None
        except click.ClickException as exc:
            setattr(exc, "message", safe(exc.message))  # click declares it Final
            raise
        except CTRLRunError as exc:
            log.debug("ctrlrun refused", exc_info=True)
            raise click.ClickException(safe(str(exc) or type(exc).__name__)) from None
        except Exception as exc:
            log.debug("unexpected error in the ctrlrun command", exc_info=True)
            raise click.ClickException(safe(f"unexpected {type(exc).__name__}: {exc}")) from None


@click.group(cls=CtrlrunGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="ctrlrun", message="%(prog)s, version %(version)s")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """ctrlrun: answer approvals, settle unknown outcomes, delegate grants, read and verify receipts."""
    ctx.ensure_object(Settings)
    reset_output()


for _command in (init, demo, approve, deny, pending, resolve, effects, receipts, policy, delegate, revoke, inspect, stats,
                 gateway, mcp_operator, serve):
    cli.add_command(_command)
