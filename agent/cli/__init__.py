"""The ``agent`` command: a table of subcommands, one module each.

Every subcommand returns its exit code (None meaning 0) or raises;
:func:`main` maps exceptions to one-line messages and exit codes: 1 for
errors, 2 for usage errors.  ``--debug`` shows the traceback instead.
docs/cli.md describes every command.
"""

from __future__ import annotations

import importlib
import sys

import click

from .. import __version__

# name -> (module, function, one-line help); modules are imported lazily so
# that `agent --help` stays fast and a broken optional command cannot break
# the others.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "init": ("agent.cli.init", "init", "Make a SQLite database a site with fresh keys."),
    "key": ("agent.cli.key", "key", "Print a site's public key line; find or check its secret key file."),
    "publication": ("agent.cli.publication", "publication", "Create, extend and list publications."),
    "schema": ("agent.cli.schema", "schema", "Change the schema at the consolidated and, through the streams, "
                                             "at the remotes."),
    "site": ("agent.cli.site", "site", "Change a site's own inbox, reply address and transport settings."),
    "remote": ("agent.cli.remote", "remote", "Add, change, subscribe, list and remove remote users; ack their errors."),
    "extract": ("agent.cli.extract", "extract", "Make a remote's database from the consolidated (dbxtract)."),
    "run": ("agent.cli.run", "run", "Receive, apply, send and confirm messages (dbremote)."),
    "inbox": ("agent.cli.inbox", "inbox", "List pending and quarantined messages without applying them."),
    "status": ("agent.cli.status", "status", "Show the remote-user table, queues and errors."),
    "demo": ("agent.cli.demo", "demo", "Replicate a consolidated and three field sites in a folder."),
    "spool": ("agent.cli.spool", "spool", "Check the agent's message spool offline."),
    "chaos": ("agent.cli.chaos", "chaos", "Run the protocol fault-injection suite for N seeds."),
}


class _Interrupted(Exception):
    """Ctrl-C or a stopping signal while a command ran.  Click would print a
    bare newline before turning KeyboardInterrupt into Abort: right after a
    ^C on a terminal, a blank line on stderr anywhere else."""


class _LazyGroup(click.Group):
    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            raise _Interrupted() from None

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)  # in the order of a first session, not alphabetical

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # From the table, so that `agent --help` imports no command module.
        with formatter.section("Commands"):
            formatter.write_dl([(name, help_text) for name, (_, _, help_text) in COMMANDS.items()])

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        entry = COMMANDS.get(name)
        if entry is None:
            return None
        module_name, attribute, _ = entry
        return getattr(importlib.import_module(module_name), attribute)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="agent")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """fieldsync replication agent."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


def describe(error: BaseException) -> str:
    """One line for any error: the agent's, the site database's and the
    transports' errors are worded for users already."""
    from transports.errors import TransportError

    from ..errors import describe_error
    from ..site.errors import SiteError

    if isinstance(error, (SiteError, TransportError)):
        return str(error)
    return describe_error(error)


def _usage_line(usage: click.UsageError) -> str:
    where = usage.ctx.command_path if usage.ctx is not None else "agent"
    message = usage.format_message().rstrip(".")
    if message and message[0].isupper() and not message[:2].isupper():
        message = message[0].lower() + message[1:]
    hint = f"see '{where} --help'"
    return f"{message} ({hint})"


def escape_controls(text: str) -> str:
    """``text`` with control characters written as escapes: a path or name
    holding a newline or a terminal escape must not break the one line or
    reach the terminal raw."""
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() or char == " " else repr(char)[1:-1] for char in text)


def main(argv: list[str] | None = None) -> int:
    """Console entry point; returns (and exits with) 0, 1 or 2.

    A command returns its exit code (None means 0) or raises: usage errors
    (bad options, values or combinations) give 2, everything else 1, each
    printed as one line ``agent: ...`` on stderr.  ``--debug`` shows the
    traceback of errors that are not usage errors.
    """
    from ..errors import UsageError

    arguments = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in arguments
    try:
        result = cli.main(args=arguments, prog_name="agent", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("agent: interrupted", err=True)
        code = 1
    except click.exceptions.Exit as done:
        code = done.exit_code
    except click.exceptions.NoArgsIsHelpError as no_arguments:
        click.echo(no_arguments.format_message(), err=True)  # the help text
        code = 2
    except click.UsageError as usage:
        click.echo(f"agent: {escape_controls(_usage_line(usage))}", err=True)
        code = 2
    except click.ClickException as failure:
        click.echo(f"agent: {escape_controls(failure.format_message())}", err=True)
        code = failure.exit_code
    except (KeyboardInterrupt, _Interrupted):
        if sys.stderr.isatty():
            click.echo(err=True)  # after the terminal's ^C
        click.echo("agent: interrupted", err=True)
        code = 1
    except UsageError as usage:
        click.echo(f"agent: {escape_controls(str(usage))}", err=True)
        code = 2
    except Exception as error:  # the one place that turns any error into a line
        if debug:
            raise
        click.echo(f"agent: {escape_controls(describe(error))}", err=True)
        code = 1
    else:
        code = result if isinstance(result, int) and not isinstance(result, bool) else 0
    if argv is None:
        sys.exit(code)
    return code
