"""``agent remote add --from FILE``: a fleet of remotes from a CSV or JSON-lines file, all or none.

The fields are the options of one ``remote add``; each line is checked as
that command checks its options, with what the checks read from the site
read once.
"""

from __future__ import annotations

import csv
import io
import json
import sys
import time as clock
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..errors import AgentError, UsageError
from ._common import (ADDRESS, Duration, SITE_NAME, TRANSPORT, TimeOfDay, console, error_console, open_site,
                      shared_inbox_warnings, show_progress)
from ._remote_values import SubscriptionTypes, public_key_line, refuse_own_inbox, split_subscription


#: The fields of a fleet file: a CSV's columns, a JSON line's keys.  The
#: same values as the options of one `remote add`; ``subscribe`` may
#: repeat (CSV: several columns of that name; JSON: a list).
FLEET_FIELDS = ("name", "address", "transport", "public_key", "subscribe", "send_every", "send_at")


@dataclass(frozen=True, slots=True)
class FleetLine:
    """One remote as a fleet file gives it, with the line it starts on."""

    number: int
    values: dict[str, Any]      # field -> text (send_every: text or a number); subscribe -> list of texts


def fleet_file_format(path: Path, text: str, given: str | None) -> str:
    """``csv`` or ``jsonl``: as given, else by the file's extension, else
    by its first character (``{`` starts a JSON line)."""
    if given is not None:
        return given
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return "csv"
    if suffix in (".jsonl", ".ndjson", ".json"):
        return "jsonl"
    return "jsonl" if text.lstrip().startswith("{") else "csv"


def read_fleet_file(path: Path, given_format: str | None = None) -> list[FleetLine]:
    """The remotes of a fleet file (``-``: stdin), each with its line
    number; a malformed file is one :class:`UsageError` naming the line."""
    try:
        if str(path) == "-":
            text = sys.stdin.read()
        else:
            text = path.read_text(encoding="utf-8-sig")  # a byte-order mark, as spreadsheets save CSV
    except (OSError, UnicodeDecodeError) as error:
        raise AgentError(f"cannot read {path}: {getattr(error, 'strerror', None) or error}") from None
    source = "stdin" if str(path) == "-" else str(path)
    if fleet_file_format(path, text, given_format) == "csv":
        lines = list(_csv_lines(source, text))
    else:
        lines = list(_json_lines(source, text))
    if not lines:
        raise UsageError(f"{source} holds no remotes; write one remote a line (see docs/cli.md, "
                         "'Many remotes at once')")
    return lines


def _csv_lines(source: str, text: str) -> Iterator[FleetLine]:
    reader = csv.reader(io.StringIO(text, newline=""))
    header: list[str] | None = None
    try:
        for row in reader:
            if not any(cell.strip() for cell in row) or row[0].lstrip().startswith("#"):
                continue
            if header is None:
                header = [cell.strip() for cell in row]
                _check_header(source, reader.line_num, header)
                continue
            if len(row) != len(header):
                raise UsageError(f"{source}, line {reader.line_num}: {len(row)} cells, but the header has "
                                 f"{len(header)} ({', '.join(header)}); quote a cell that holds a comma")
            values: dict[str, Any] = {"subscribe": []}
            for column, cell in zip(header, row):
                cell = cell.strip()
                if not cell:
                    continue
                if column == "subscribe":
                    values["subscribe"].append(cell)
                else:
                    values[column] = cell
            yield FleetLine(reader.line_num, values)
    except csv.Error as error:
        raise UsageError(f"{source}, line {reader.line_num}: not CSV: {error}") from None


def _check_header(source: str, number: int, header: list[str]) -> None:
    for column in header:
        if column not in FLEET_FIELDS:
            raise UsageError(f"{source}, line {number}: unknown column {column!r}; the columns are "
                             f"{', '.join(FLEET_FIELDS)} (name and address needed)")
        if column != "subscribe" and header.count(column) > 1:
            raise UsageError(f"{source}, line {number}: column {column!r} is given twice (only subscribe repeats)")
    for needed in ("name", "address"):
        if needed not in header:
            raise UsageError(f"{source}, line {number}: no {needed!r} column; the header names the columns, "
                             f"such as name,address,transport,subscribe,send_every")


def _json_lines(source: str, text: str) -> Iterator[FleetLine]:
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{source}, line {number}"
        try:
            record = json.loads(line)
        except ValueError as error:
            raise UsageError(f"{where}: not JSON ({error}); write one object a line") from None
        if not isinstance(record, dict):
            raise UsageError(f"{where}: a {type(record).__name__} where an object is needed, "
                             '{"name": ..., "address": ...}')
        values: dict[str, Any] = {"subscribe": []}
        for key, value in record.items():
            if key not in FLEET_FIELDS:
                raise UsageError(f"{where}: unknown key {key!r}; the keys are {', '.join(FLEET_FIELDS)}")
            if value is None:
                continue
            if key == "subscribe":
                items = [value] if isinstance(value, str) else value
                if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
                    raise UsageError(f"{where}: subscribe is a text or a list of texts such as "
                                     '["catalogue", "territory=north"]')
                values["subscribe"] = items
            elif key == "send_every" and isinstance(value, int) and not isinstance(value, bool):
                values[key] = value
            elif not isinstance(value, str):
                raise UsageError(f"{where}: {key} must be text, not {json.dumps(value)}")
            else:
                values[key] = value
        yield FleetLine(number, values)


_WHOLE_SECONDS = Duration(whole_seconds=True)
_TIME_OF_DAY = TimeOfDay()


def _field(field: str, kind: click.ParamType, value: object) -> Any:
    """``value`` read as the option of the same name would read it, a
    malformed one named by its field."""
    try:
        return kind.convert(value, None, None)
    except click.BadParameter as error:
        raise click.UsageError(f"{field}: {error.message}") from None


class _Fleet:
    """Turns fleet lines into checked :class:`NewRemote` values, reading
    what the checks need from the site once, as one `remote add` would
    check each of them."""

    def __init__(self, site: "Site", source: str) -> None:  # noqa: F821
        self.site = site
        self.source = source
        self.types = SubscriptionTypes(site)
        self.taken = {row.name for row in site.remotes()}
        self.seen: dict[str, int] = {}
        self._transports: dict[str, Any] = {}

    def remote(self, line: FleetLine) -> "NewRemote":  # noqa: F821
        from ..site.remote_rules import NewRemote

        values = line.values
        if "name" not in values:
            raise click.UsageError("no name: give the remote's name")
        name = _field("name", SITE_NAME, values["name"])
        if name in self.taken:
            raise AgentError(f"remote {name!r} exists already in {self.site.path}; leave it out of the file, or "
                             "change it with `agent remote set`")
        if name in self.seen:
            raise click.UsageError(f"{name} is on line {self.seen[name]} already")
        self.seen[name] = line.number
        if "address" not in values:
            raise click.UsageError("no address: give the remote's inbox")
        address = _field("address", ADDRESS, values["address"])
        transport = _field("transport", TRANSPORT, values.get("transport", "folder"))
        self._check_address(transport, address)
        every = values.get("send_every")
        every = None if every is None else _field("send_every", _WHOLE_SECONDS, every)
        at = values.get("send_at")
        at = None if at is None else _field("send_at", _TIME_OF_DAY, at)
        if every is not None and at is not None:
            raise click.UsageError("send_every and send_at exclude each other: a remote is sent to at an interval "
                                   "or at a time of day")
        key = public_key_line(name, values["public_key"], None) if "public_key" in values else None
        typed = tuple((publication, self.types.value(publication, value))
                      for publication, value in map(split_subscription, values["subscribe"]))
        refuse_own_inbox(self.site, name, address, transport)
        return NewRemote(name, address=address, transport=transport, public_key=key, send_every=every,
                         send_at=at, subscriptions=typed)

    def _check_address(self, spec: str, address: str) -> None:
        """What check_stored_address does, with one transport object per
        transport for the whole file instead of one per line."""
        from transports.errors import BadAddress
        from transports.registry import check_transport_spec, get_transport_class

        if spec not in self._transports:
            inner = get_transport_class(check_transport_spec(spec).inner)
            try:
                self._transports[spec] = inner()
            except (TypeError, ValueError):
                self._transports[spec] = None  # checks its addresses when a run builds it
        transport = self._transports[spec]
        if transport is not None:
            try:
                transport.check_address(address)
            except BadAddress as error:
                raise click.UsageError(str(error)) from None

    def close(self) -> None:
        import asyncio

        async def close_all() -> None:
            for transport in self._transports.values():
                if transport is not None:
                    await transport.aclose()
        asyncio.run(close_all())


def _line_error(source: str, line: FleetLine, error: BaseException) -> Exception:
    """The error of a fleet line as one line naming the file and the line:
    a malformed value is a usage error (exit 2), a refused one exit 1."""
    from . import describe

    name = line.values.get("name")
    where = f"{source}, line {line.number}" + (f" ({name})" if isinstance(name, str) and name else "")
    if isinstance(error, click.BadParameter):
        return UsageError(f"{where}: {error.message}; nothing was added")
    if isinstance(error, click.UsageError):
        return UsageError(f"{where}: {error.format_message()}; nothing was added")
    if isinstance(error, UsageError):
        return UsageError(f"{where}: {error}; nothing was added")
    return AgentError(f"{where}: {describe(error)}; nothing was added")


def add_from_file(database: Path, path: Path, file_format: str | None, *, shared_inbox: bool = False) -> None:
    from codec.errors import CodecError
    from transports.errors import TransportError

    from ..site.errors import SiteError
    from ..site.errors import RemoteRejected

    started = clock.monotonic()
    try:
        lines = read_fleet_file(path, file_format)
    except UsageError as error:
        raise UsageError(f"{error}; nothing was added") from None
    source = "stdin" if str(path) == "-" else str(path)
    out = console()
    progress = Progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=out, transient=True, disable=not show_progress(out))
    with open_site(database) as site, progress:
        fleet = _Fleet(site, source)
        remotes = []
        checking = progress.add_task(f"checking {source}", total=len(lines))
        try:
            for line in lines:
                try:
                    remotes.append(fleet.remote(line))
                except (click.UsageError, AgentError, SiteError, TransportError, CodecError) as error:
                    raise _line_error(source, line, error) from None
                progress.advance(checking)
        finally:
            fleet.close()
        shared = [] if shared_inbox else shared_inbox_warnings(
            site, [(remote.name, remote.address, remote.transport) for remote in remotes if remote.address])
        adding = progress.add_task(f"adding to {database}", total=len(remotes))
        try:
            subscribed = site.add_remotes(remotes, progress=lambda count: progress.advance(adding, count))
        except RemoteRejected as rejected:
            raise _line_error(source, lines[rejected.index], rejected.reason) from None
    for line in shared:
        error_console().print(line, soft_wrap=True)
    elapsed = clock.monotonic() - started
    out.print(f"Added {_count(len(remotes), 'remote')} to {database} from {source}, with "
              f"{_count(subscribed, 'subscription')} ({elapsed:.1f}s).", soft_wrap=True)
    keyless = sum(remote.public_key is None for remote in remotes)
    if keyless:
        out.print(f"{keyless} of them have no public key yet: `agent extract {database} --all --into FOLDER` "
                  "makes their keys and databases.", soft_wrap=True)


def _count(number: int, noun: str) -> str:
    """``1 remote``, ``2 remotes``."""
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"
