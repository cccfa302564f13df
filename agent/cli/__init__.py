"""The ``agent`` command: a table of subcommands, one module each.

Every subcommand returns normally (exit 0) or raises; :func:`main` maps
exceptions to one-line messages and exit codes: 1 for errors, 2 for usage
errors.  ``--debug`` shows the traceback instead.
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
    "demo": ("agent.cli.demo", "demo", "Run the demonstration in a folder and print what happened."),
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

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


def main(argv: list[str] | None = None) -> int:
    """Console entry point; returns (and exits with) 0, 1 or 2."""
    from ..errors import describe_error

    arguments = sys.argv[1:] if argv is None else argv
    debug = "--debug" in arguments
    try:
        cli.main(args=arguments, prog_name="agent", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("agent: interrupted", err=True)
        code = 1
    except click.exceptions.Exit as done:
        code = done.exit_code
    except click.ClickException as usage:
        usage.show()
        code = 2 if isinstance(usage, click.UsageError) else 1
    except Exception as error:  # the one place that turns any error into a line
        if debug:
            raise
        click.echo(f"agent: {describe_error(error)}", err=True)
        code = 1
    else:
        code = 0
    if argv is None:
        sys.exit(code)
    return code
