"""``agent extract`` (dbxtract): make a remote's database from the
consolidated, or the databases of many remotes into one folder."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from .. import crashpoints  # noqa: F401  (FIELDSYNC_CRASH arms the extraction's points, as the agent's)
from ..errors import AgentError
from ._common import (DATABASE, SITE_NAME, TransportOption, check_parent_directory, check_transport_settings, console,
                      incarnation_text, key_fingerprint, open_site, remote_names, require_remote, sender_options,
                      show_progress, stored_options)


@click.command()
@click.argument("database", type=DATABASE)
@click.argument("names", nargs=-1, metavar="[REMOTE TARGET | REMOTE... --into FOLDER]")
@click.option("--into", type=click.Path(file_okay=False, path_type=Path), metavar="FOLDER",
              help="Extract each remote named (or --all, or --from FILE) to FOLDER/REMOTE.db.")
@click.option("--all", "every", is_flag=True, help="Every remote of DATABASE (with --into).")
@click.option("--from", "from_file", type=click.Path(dir_okay=False, allow_dash=True, path_type=Path),
              metavar="FILE", help="The remotes named in FILE (a `remote add --from` file, or one name a line).")
@click.option("--format", "file_format", type=click.Choice(["csv", "jsonl", "names"]),
              help="The format of --from FILE (default: .csv, .jsonl, else one name a line).")
@click.option("--skip-existing", is_flag=True,
              help="With --into: leave out the remotes whose FOLDER/REMOTE.db exists (to finish an interrupted run).")
@click.option("--transport-option", "-O", "options", multiple=True, type=TransportOption(),
              help="A setting NAME=VALUE of the remote's own transport, stored in its database (password_file=PATH "
                   "as on the field site; never a password itself). The consolidated's own servers, ports and "
                   "ca_file are stored too. Repeatable.")
def extract(database: Path, names: tuple[str, ...], into: Path | None, every: bool, from_file: Path | None,
            file_format: str | None, skip_existing: bool, options: tuple) -> None:
    """Create the database of REMOTE at TARGET from the consolidated DATABASE,
    or with --into FOLDER the databases of many remotes, FOLDER/REMOTE.db each.

    TARGET gets the published schema of REMOTE's subscribed tables, their
    subscribed rows, REMOTE's new keys, and the remote-user rows of both
    sides, all taken at one consistent point of the log while applications
    go on writing.  Extracting again replaces the remote's stream.
    REMOTE's secret key goes to TARGET.agent/keys/site.key, not into TARGET:
    move TARGET and its folder TARGET.agent to the field site together.

    Example: agent extract hq.db north north.db

    Example: agent extract hq.db --all --into fleet
    """
    if into is None:
        if every or from_file is not None or skip_existing or file_format is not None:
            raise click.UsageError("--all, --from, --format and --skip-existing extract into a folder: give --into "
                                   "FOLDER")
        if len(names) != 2:
            raise click.UsageError("give REMOTE and TARGET (one remote), or remotes with --into FOLDER")
        remote = _remote_name(names[0])
        try:
            target = DATABASE.convert(names[1], None, None)
        except click.BadParameter as error:
            raise click.BadParameter(error.message, param_hint="'TARGET'") from None
        return _extract_one(database, remote, target, stored_options(options))
    if sum((bool(names), every, from_file is not None)) != 1:
        raise click.UsageError("with --into, name the remotes one way: REMOTE..., --all or --from FILE")
    if file_format is not None and from_file is None:
        raise click.UsageError("--format is the format of --from FILE; give --from as well")
    wanted = [_remote_name(name) for name in names]
    if from_file is not None:
        wanted = _names_from_file(from_file, file_format)
    return _extract_many(database, wanted, every, into, skip_existing, stored_options(options))


def _remote_name(text: str) -> str:
    try:
        return SITE_NAME.convert(text, None, None)
    except click.BadParameter as error:
        raise click.BadParameter(error.message, param_hint="'REMOTE'") from None


def _names_from_file(path: Path, file_format: str | None) -> list[str]:
    """The remote names of a fleet file (its ``name`` field: .csv, .jsonl),
    or of a file of names, one a line (blank lines and lines starting with
    # left out)."""
    from ._fleet import read_fleet_file

    if file_format is None and path.suffix.lower() in (".csv", ".jsonl", ".ndjson", ".json"):
        file_format = "csv" if path.suffix.lower() == ".csv" else "jsonl"
    if file_format in ("csv", "jsonl"):
        lines = [(line.number, line.values.get("name", "")) for line in read_fleet_file(path, file_format)]
    else:
        try:
            text = sys.stdin.read() if str(path) == "-" else path.read_text(encoding="utf-8-sig")
        except (OSError, UnicodeDecodeError) as error:
            raise AgentError(f"cannot read {path}: {getattr(error, 'strerror', None) or error}") from None
        lines = [(number, line.strip()) for number, line in enumerate(text.splitlines(), start=1)
                 if line.strip() and not line.lstrip().startswith("#")]
    wanted = []
    for number, name in lines:
        try:
            wanted.append(SITE_NAME.convert(name, None, None))
        except click.BadParameter as error:
            raise click.UsageError(f"{path}, line {number}: {error.message}") from None
    if not wanted:
        raise click.UsageError(f"{path} names no remote; write one name a line")
    return wanted


def _check_target(target: Path, out: Console) -> None:
    """Refuse a target in the way, before the copy starts; the key file an
    extraction that was killed left for it is removed, and said."""
    from ..keyfiles import check_no_key_file

    if os.path.lexists(target):  # a dangling symbolic link too: the copy would not go where it points
        raise AgentError(f"{target} exists already; remove it or choose another path")
    check_parent_directory(target)
    # Checked again when it is written; said here before the copy starts.
    for left in check_no_key_file(target):
        out.print(f"Removed {left}, left by an extraction that did not finish.", soft_wrap=True, markup=False,
                  highlight=False)


def remote_settings(site: "Site", remote: str, given: dict[str, str | None]) -> dict[str, str]:  # noqa: F821
    """The transport options ``remote``'s copy gets, checked with its inbox
    and reply address: the consolidated's that hold for it, its From:
    address (email), then ``given``.  One line when they would not work."""
    from ..admin import inherited_options

    row = site.remote(remote)
    spec = row.transport or "folder"
    settings = inherited_options(site)
    settings.update({name: value for name, value in given.items() if value is not None})
    reply = row.address if row.inbox else None
    if spec == "folder" and not settings:
        return settings  # nothing to check that `remote add` did not (a fleet of folders stays fast)
    check_transport_settings(spec, settings, inbox=row.inbox or row.address, send=reply,
                             hint=f"; give {remote} its own inbox with `agent remote set {site.path} {remote} "
                                  "--inbox URL`", inbox_option="the remote's inbox", send_option="--address")
    settings.update(sender_options(spec, reply, settings))
    return settings


def _extract_one(database: Path, remote: str, target: Path, given: dict[str, str | None]) -> None:
    from ..admin import extract_site
    from ..keyfiles import agent_directory, key_path

    out = console()
    _check_target(target, out)
    with open_site(database) as site:
        require_remote(site, remote)
        settings = remote_settings(site, remote, given)
        started = time.monotonic()
        if show_progress(out):
            # The copy is one call: the bar pulses while it runs.
            with Progress(SpinnerColumn(), TextColumn("{task.description}", markup=False), BarColumn(), TimeElapsedColumn(),
                          console=out, transient=True) as progress:
                progress.add_task(f"extracting {remote} to {target}", total=None)
                result = extract_site(site, remote, target, options=settings)
        else:
            result = extract_site(site, remote, target, options=settings)
        elapsed = time.monotonic() - started
        remote_row = site.remote(remote)
    _say_removed(out, result.removed, target.parent)
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


def _extract_many(database: Path, wanted: list[str], every: bool, into: Path, skip_existing: bool,
                  given: dict[str, str | None]) -> None:
    """Extract each remote to ``into/NAME.db``, one after the other, with the
    consolidated opened once (a PostgreSQL one read once per table, at one
    point, for all of them: Site.extract_many).  Every name and target is
    checked before the first copy; a failure stops the run, leaving the
    remotes done so far extracted (each one whole) and the rest as they
    were."""
    from ..admin import extract_sites

    if not into.is_dir():
        raise AgentError(f"{into} is not a folder; create it first (the remotes go to {into}/REMOTE.db)")
    out = console()
    with open_site(database) as site:
        known = remote_names(site)
        if every:
            wanted = [name for name in known if name != site.identity.name]
            if not wanted:
                raise AgentError(f"{database} has no remotes to extract; add them with `agent remote add`")
        known_set = set(known)
        seen: set[str] = set()
        for name in wanted:
            if name not in known_set:
                raise AgentError(f"{database} has no remote named {name!r}; add it with `agent remote add`, or "
                                 "leave it out")
            if name in seen:
                raise click.UsageError(f"{name} is named twice")
            seen.add(name)
        targets = [(name, into / f"{name}.db") for name in wanted]
        if skip_existing:
            skipped = [name for name, target in targets if os.path.lexists(target)]
            targets = [(name, target) for name, target in targets if not os.path.lexists(target)]
        else:
            skipped = []
        for _name, target in targets:
            try:
                _check_target(target, out)
            except AgentError as error:
                hint = "; --skip-existing leaves out the remotes extracted already" if os.path.lexists(target) else ""
                raise AgentError(f"{error}{hint}") from None
        started = time.monotonic()
        done = 0
        rows = 0
        settings = [(name, target, remote_settings(site, name, given)) for name, target in targets]
        with _progress(out) as progress:
            task = progress.add_task(f"extracting into {into}", total=len(targets))
            results = extract_sites(site, settings)
            while done < len(targets):
                name, target = targets[done]
                try:
                    result = next(results)
                except Exception as error:
                    from . import describe

                    raise AgentError(f"extracting {name} to {target} failed: {describe(error)}; {done} of "
                                     f"{len(targets)} remotes were extracted before it (each whole); extract the "
                                     "rest with the same command and --skip-existing") from error
                done += 1
                _say_removed(progress.console, result.removed, into)
                total = sum(result.rows.values())
                rows += total
                progress.console.print(f"{name}: {target}, {total} rows, consistent at log offset {result.offset}",
                                       soft_wrap=True, markup=False, highlight=False)
                progress.advance(task)
            for _result in results:  # none is left: ends the extraction (its staging file goes)
                pass
        elapsed = time.monotonic() - started
    if skipped:
        out.print(f"Left out {len(skipped)} remotes whose database exists already in {into}.", soft_wrap=True)
    out.print(f"Extracted {done} remotes into {into} ({rows} rows) in {elapsed:.1f}s. Move each REMOTE.db with its "
              "folder REMOTE.db.agent (its secret key) to its field site.", soft_wrap=True, markup=False)


def _say_removed(out: Console, removed: tuple[str, ...], folder: Path) -> None:
    """One line for each file an extraction that did not finish (killed) had
    left in ``folder``, which this one removed."""
    for name in removed:
        out.print(f"Removed {folder / name}, left by an extraction that did not finish.", soft_wrap=True,
                  markup=False, highlight=False)


def _progress(out: Console) -> Progress:
    return Progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=out, transient=True, disable=not show_progress(out))
