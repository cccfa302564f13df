"""``agent extract`` (dbxtract): make a remote's database from the consolidated."""

from __future__ import annotations

import os
import time
from pathlib import Path

import click
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from ..errors import AgentError
from ._common import (DATABASE, SITE_NAME, check_parent_directory, console, incarnation_text, key_fingerprint,
                      open_site, require_remote, show_progress)


@click.command()
@click.argument("database", type=DATABASE)
@click.argument("remote", type=SITE_NAME)
@click.argument("target", type=DATABASE)
def extract(database: Path, remote: str, target: Path) -> None:
    """Create the database of REMOTE at TARGET from the consolidated DATABASE.

    TARGET gets the published schema of REMOTE's subscribed tables, their
    subscribed rows, REMOTE's new keys, and the remote-user rows of both
    sides, all taken at one consistent point of the log while applications
    go on writing.  Extracting again replaces the remote's stream.
    REMOTE's secret key goes to TARGET.agent/keys/site.key, not into TARGET:
    move TARGET and its folder TARGET.agent to the field site together.
    """
    from ..admin import extract_site
    from ..keyfiles import agent_directory, check_no_key_file, key_path

    if os.path.lexists(target):  # a dangling symbolic link too: the copy would not go where it points
        raise AgentError(f"{target} exists already; remove it or choose another path")
    check_parent_directory(target)
    check_no_key_file(target)  # checked again when it is written; said here before the copy starts
    out = console()
    with open_site(database) as site:
        require_remote(site, remote)
        started = time.monotonic()
        if show_progress(out):
            # The copy is one call: the bar pulses while it runs.
            with Progress(SpinnerColumn(), TextColumn("{task.description}", markup=False), BarColumn(), TimeElapsedColumn(),
                          console=out, transient=True) as progress:
                progress.add_task(f"extracting {remote} to {target}", total=None)
                result = extract_site(site, remote, target)
        else:
            result = extract_site(site, remote, target)
        elapsed = time.monotonic() - started
        remote_row = next(row for row in site.remotes() if row.name == remote)
    out.print(f"Extracted {remote} to {target}:", soft_wrap=True)
    table = Table()
    table.add_column("table")
    table.add_column("rows", justify="right")
    for name, count in result.rows.items():
        table.add_row(name, str(count))
    table.add_row(Text("total", style="bold"), Text(str(sum(result.rows.values())), style="bold"))
    out.print(table)
    out.print(f"Consistent at log offset {result.offset} of {database}; incarnation "
              f"{incarnation_text(result.incarnation)}; key {key_fingerprint(remote_row.public_key)}; "
              f"{elapsed:.1f}s.", soft_wrap=True)
    out.print(f"Move {target} and its folder {agent_directory(target)} to the field site together; "
              f"{key_path(target)} holds {remote}'s secret key.", soft_wrap=True, markup=False)
