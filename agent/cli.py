"""The ``agent`` command."""

from __future__ import annotations

import click

from . import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="agent")
def main() -> None:
    """fieldsync replication agent."""
