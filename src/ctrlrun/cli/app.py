"""The ``ctrlrun`` click group: shared settings and one place that turns every error into ``Error: …``."""

from __future__ import annotations

import logging
from importlib import import_module
from typing import Any

import click

from ..errors import CTRLRunError
from .stores import Settings
from .text import reader_left, reset_output, safe

__all__ = ["COMMANDS", "cli"]

# Command name -> (module in ctrlrun.cli, attribute, its one-line help). ``ctrlrun --help`` lists
# these without importing a module; a module loads when its command runs (or shows its --help).
COMMANDS: dict[str, tuple[str, str, str]] = {
    "anchor": ("commands_anchor", "anchor", "Record the chain heads with an anchor provider, or --verify the store against its anchors."),
    "approve": ("commands_approvals", "approve", "Grant a pending approval request (recorded as cli:local), as asked or with edits."),
    "delegate": ("commands_authority", "delegate", "Record a delegation of part of PARENT's grant; it can never be wider than its parent."),
    "demo": ("demo", "demo", "Run five failure scenarios in process, offline, in ./.ctrlrun/demo/."),
    "deny": ("commands_approvals", "deny", "Refuse a pending approval request (recorded as cli:local)."),
    "effects": ("commands_effects", "effects", "List effect records in creation order, a page of 100 unless --limit or --all."),
    "gateway": ("gateway", "gateway", "Run every tools/call of one MCP server through ctrlrun."),
    "hold": ("commands_retention", "hold", "Keep receipt ranges from every prune until a person releases them."),
    "init": ("commands_policy", "init", "Write a starter ./ctrlrun.yaml and create ./.ctrlrun/."),
    "inspect": ("commands_authority", "inspect", "One action's story by ID (an act_, apr_ or ctr_ id, or an effect key), or with --grant what a grant's budgets have consumed and which effects hold it."),
    "mcp-operator": ("commands_operator", "mcp_operator", "Serve approvals and ambiguous effects over MCP on stdio, for your own assistant's host."),
    "pending": ("commands_pending", "pending", "List approval requests waiting for a human, oldest first, with each one's effect state."),
    "prune": ("commands_retention", "prune", "Delete the receipts through SEQ in batches behind a checkpoint; the chain verifies across the gap."),
    "policy": ("commands_policy", "policy", "Work with policy files."),
    "receipts": ("commands_receipts", "receipts", "Show receipts in chain order, or check the chain with --verify-chain."),
    "resolve": ("commands_effects", "resolve", "Settle an AMBIGUOUS effect as --committed or --failed (recorded as cli:local)."),
    "revoke": ("commands_authority", "revoke", "Revoke a delegation (or every one a selector matches): all beneath it is denied from the next evaluation."),
    "serve": ("commands_serve", "serve", "Serve the approver's console: the pending queue, approve/deny/edit, resolve, receipts."),
    "stats": ("commands_stats", "stats", "Count what the policy did (enforce) or would have done (observe) in the local store's receipts."),
}  # fmt: skip

log = logging.getLogger("ctrlrun.cli")


class CtrlrunGroup(click.Group):
    """A group whose commands never show a traceback: refusals exit 1, usage errors exit 2, and
    a reader closing the pipe ends the command quietly. Its commands load from ``COMMANDS`` on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = self.commands.get(cmd_name)
        if command is None and cmd_name in COMMANDS:
            module, attribute, _ = COMMANDS[cmd_name]
            command = getattr(import_module(f".{module}", __package__), attribute)
            self.add_command(command, cmd_name)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list from the table's one-line help, shortened as click shortens it."""
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(len(name) for name in names)
        rows = []
        for name in names:  # a stand-in shortens the table's help exactly as the command would
            command = self.commands.get(name) or click.Command(name, help=COMMANDS[name][2])
            if not command.hidden:
                rows.append((name, command.get_short_help_str(limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        try:
            return super().resolve_command(ctx, args)
        except click.exceptions.NoSuchCommand as exc:  # suggest from every command, loaded or not
            raise click.exceptions.NoSuchCommand(
                exc.command_name, possibilities=self.list_commands(ctx), ctx=ctx
            ) from None

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
        except KeyboardInterrupt:  # Ctrl-C: a clean stop, as a shell reports it (never "Aborted!")
            click.echo(f"ctrlrun {ctx.invoked_subcommand or ''}: stopped (interrupted)".replace(" :", ":"), err=True)
            raise click.exceptions.Exit(130) from None
        except click.ClickException as exc:
            setattr(exc, "message", safe(exc.message))  # click declares it Final
            raise
        except CTRLRunError as exc:
            log.debug("ctrlrun refused", exc_info=True)
            raise click.ClickException(safe(str(exc) or type(exc).__name__)) from None
        except Exception as exc:
            log.debug("unexpected error in the ctrlrun command", exc_info=True)
            raise click.ClickException(safe(f"unexpected {type(exc).__name__}: {exc}")) from None


def _show_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """``--version``: reads the installed version only when asked (``importlib.metadata`` is slow)."""
    if not value or ctx.resilient_parsing:
        return
    from .._version import __version__

    click.echo(f"ctrlrun, version {__version__}")
    ctx.exit()


@click.group(cls=CtrlrunGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_show_version,
              help="Show the version and exit.")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """ctrlrun: answer approvals, settle unknown outcomes, delegate grants, read and verify receipts."""
    ctx.ensure_object(Settings)
    reset_output()

