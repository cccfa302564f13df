"""What the ``agent`` subcommands share: option types, opening a site,
logging, consoles and the wording of values.

Rules of this file:
* Option types fail through ``self.fail`` so click reports a usage error
  (exit 2) that :func:`agent.cli.main` prints as one line.
* Nothing here prints on its own; commands decide what goes to stdout.
"""

from __future__ import annotations

import contextlib
import difflib
import logging
import logging.handlers
import os
import re
import string
import sys
import uuid
from datetime import datetime, time, timezone
from pathlib import Path
from typing import Any, Iterable, Iterator

import click
from rich.console import Console

from codec.errors import InvalidValue
from codec.names import check_site_name
from transports.options import has_control_character, parse_byte_count, parse_int, parse_seconds

from ..errors import AgentError
from ..transport_options import TransportOptions

# -- option types ----------------------------------------------------------------------

def parse_duration(text: str) -> float:
    """Seconds in ``90``, ``90s``, ``5m``, ``1h``, ``1h30m`` or ``0.5s``: the
    same forms as a transport's ``Seconds`` option (transports.options)."""
    try:
        return parse_seconds(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a duration; write seconds or use a unit: 90, 90s, 5m, 1h, 1h30m") from None


#: The longest duration an option takes (a schedule, a delay, a timeout).
MAX_DURATION = 366 * 86400.0


class Duration(click.ParamType):
    """A length of time in seconds, written ``90``, ``90s``, ``5m`` or ``1h``."""

    name = "duration"

    def __init__(self, *, positive: bool = True, whole_seconds: bool = False) -> None:
        self.positive = positive
        self.whole_seconds = whole_seconds

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> float | int:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            seconds = float(value)
        else:
            try:
                seconds = parse_duration(str(value))
            except ValueError as error:
                self.fail(str(error), param, ctx)
        if self.positive and seconds <= 0:
            self.fail(f"{value!r} must be longer than zero", param, ctx)
        if seconds > MAX_DURATION:
            self.fail(f"{value!r} is longer than the most this takes, {format_seconds(MAX_DURATION)}", param, ctx)
        if self.whole_seconds:
            if seconds != int(seconds):
                self.fail(f"{value!r} is not a whole number of seconds", param, ctx)
            return int(seconds)
        return seconds


class ByteSize(click.ParamType):
    """A byte count: ``50000``, ``48k``, ``1m`` or ``1g`` (powers of 1024), the
    same forms as a transport's ``ByteCount`` option (transports.options)."""

    name = "bytes"

    def __init__(self, minimum: int = 0, maximum: int | None = None) -> None:
        self.minimum = minimum
        self.maximum = maximum

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            size = value
        else:
            try:
                size = parse_byte_count(str(value))
            except ValueError:
                self.fail(f"{value!r} is not a size; write bytes such as 50000, or 48k or 1m", param, ctx)
        if size < self.minimum:
            self.fail(f"{value} is below the minimum of {self.minimum} bytes", param, ctx)
        if self.maximum is not None and size > self.maximum:
            self.fail(f"{value} is above the maximum of {self.maximum} bytes", param, ctx)
        return size


_TIME_OF_DAY = re.compile(r"([0-9]{1,2}:[0-9]{2}(?::[0-9]{2})?)(Z|[+-][0-9]{2}:?[0-9]{2})?")


class TimeOfDay(click.ParamType):
    """A local time of day, ``18:30`` or ``18:30:00``."""

    name = "time"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> time:
        if isinstance(value, time):
            return value
        text = str(value).strip()
        match = _TIME_OF_DAY.fullmatch(text)
        if match is None:
            self.fail(f"{value!r} is not a time of day; write it like 18:30", param, ctx)
        if match.group(2):
            self.fail(f"{value!r}: give a local time of day without a time zone", param, ctx)
        try:
            moment = time.fromisoformat(match.group(1).zfill(5 if len(match.group(1)) < 6 else 8))
        except ValueError:
            self.fail(f"{value!r} is not a time of day; write it like 18:30", param, ctx)
        return moment


class Whole(click.IntRange):
    """A whole number in ASCII digits, within a range: click's own INT takes
    any script's digits (``int("٣")`` is 3) and ``1_000``, which no other
    number the agent reads does."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str):
            try:
                value = parse_int(value)
            except ValueError:
                self.fail(f"{value!r} is not a whole number", param, ctx)
        return super().convert(value, param, ctx)


class DatabasePath(click.Path):
    """A site database file: not a folder, and not an empty string (which
    would otherwise stand for the working directory)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value:
            self.fail("the path is empty", param, ctx)
        return super().convert(value, param, ctx)


class SiteLocation(click.ParamType):
    """A site: a SQLite file (as :class:`DatabasePath` takes it, a ``Path``)
    or a libpq URI of a PostgreSQL database (``postgresql://...``, kept as
    its text), refused in one line when it carries a password."""

    name = "database"
    _file = DatabasePath(dir_okay=False, path_type=Path)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from ..site.locate import is_uri

        if isinstance(value, str) and is_uri(value):
            from ..site import SiteError
            from ..site.postgres.uri import parse_uri

            try:
                parse_uri(value)
            except SiteError as error:
                self.fail(str(error), param, ctx)
            return value
        return self._file.convert(value, param, ctx)


DATABASE = SiteLocation()


class Address(click.ParamType):
    """An inbox address on some transport: not empty, no control characters
    (the transport checks the rest when it is used)."""

    name = "address"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value)
        if not text.strip():
            self.fail("an address cannot be empty: give the inbox, a folder such as inbox/north or "
                      "sftp://user@host/path", param, ctx)
        if has_control_character(text):
            self.fail(f"{text!r} has a control character", param, ctx)
        return text


ADDRESS = Address()


class TransportName(click.ParamType):
    """A transport spec as written: ``folder``, ``sftp``, ``faults+folder``.
    Malformed (empty, a bad character, an empty part) is a usage error; a
    well-formed name that is not installed is found when it is looked up."""

    name = "name"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from transports.errors import RegistryError
        from transports.registry import parse_transport_spec

        try:
            return str(parse_transport_spec(str(value)))
        except RegistryError as error:
            self.fail(str(error), param, ctx)


TRANSPORT = TransportName()


class SiteName(click.ParamType):
    """A site's name, the one rule for every site (codec.names): 1-48
    letters, digits, '_' or '-', starting with a letter or digit."""

    name = "name"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> str:
        try:
            return check_site_name(str(value))
        except InvalidValue as error:
            self.fail(str(error), param, ctx)


SITE_NAME = SiteName()


class AddressTemplate(Address):
    """An address with ``{root}`` and ``{site}`` in it (agent chaos)."""

    name = "template"
    fields = ("root", "site")

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = super().convert(value, param, ctx)
        try:
            named = [field for _, field, _, _ in string.Formatter().parse(text) if field is not None]
        except ValueError as error:
            self.fail(f"{text!r}: {error}; write a brace as {{{{ or }}}}", param, ctx)
        unknown = [field for field in named if field not in self.fields]
        if unknown:
            self.fail(f"{text!r}: unknown field {{{unknown[0]}}}; use {{root}} (the seed's folder) and "
                      f"{{site}} (the site name)", param, ctx)
        return text


class TransportOption(click.ParamType):
    """``NAME=VALUE`` for the site's own transport
    (``known_hosts=~/.ssh/known_hosts``), or ``PREFIX.NAME=VALUE`` for one
    transport or wrapper (``sftp.key_file=…``, ``faults.seed=7``); see
    agent.transport_options.  Values stay text: the transport reads each by
    the type of its option (transports.options)."""

    name = "NAME=VALUE"

    def convert(self, value: object, param: click.Parameter | None,
                ctx: click.Context | None) -> tuple[str | None, str, object]:
        if isinstance(value, tuple):
            return value  # type: ignore[return-value]
        key, equals, text = str(value).partition("=")
        prefix, dot, name = key.rpartition(".")
        if not equals or not name.isidentifier() or (dot and not prefix):
            self.fail(f"{value!r}: write NAME=VALUE, or TRANSPORT.NAME=VALUE for one transport or wrapper "
                      "(sftp.key_file=..., faults.seed=7)", param, ctx)
        return (prefix or None), name, text


def check_transports(specs: Iterable[str], options: TransportOptions, *, own: str) -> None:
    """Build (and close) each transport a run will use, with the options
    that are its, so that a bad name or option is one clear line before any
    work starts."""
    import asyncio

    options.check_names()
    for spec in dict.fromkeys(specs):
        transport = options.create(spec, own=own)  # BadTransportOptions names the transport and value
        asyncio.run(transport.aclose())


def check_stored_address(spec: str, address: str, *, hint: str = "") -> None:
    """Refuse, as a usage error on ``--address``, an address that the
    transport ``spec`` will refuse when it uses it (a malformed URL, a
    password in an SFTP or IMAP URL, ...), before it is stored: the
    transport's own ``check_address``, without connecting.  A transport
    that cannot be built without the options a run gives it is left to
    check the address then."""
    import asyncio

    from transports.errors import BadAddress
    from transports.registry import check_transport_spec, get_transport_class

    inner = get_transport_class(check_transport_spec(spec).inner)
    try:
        transport = inner()
    except (TypeError, ValueError):
        return
    try:
        transport.check_address(address)
    except BadAddress as error:
        raise click.BadParameter(f"{error}{hint}", param_hint="'--address'") from None
    finally:
        asyncio.run(transport.aclose())


def stored_options(items: Iterable[tuple[str | None, str, object]], unset: Iterable[str] = ()) -> dict[str, str | None]:
    """``-O`` values of a configuration command as the site stores them
    (``NAME`` or ``PREFIX.NAME`` to text); each ``--unset NAME`` as None."""
    changes: dict[str, str | None] = {name: None for name in unset}
    for prefix, name, value in items:
        changes[f"{prefix}.{name}" if prefix else name] = str(value)
    return changes


def check_transport_settings(spec: str, options: dict[str, str], *, inbox: str | None = None,
                             send: str | None = None, hint: str = "", inbox_option: str = "--address",
                             send_option: str = "--reply-address") -> None:
    """Refuse, at configuration time, options the transport ``spec`` does
    not take and addresses it would refuse: ``inbox`` as a site's own inbox,
    ``send`` as where it sends to a peer (email: an IMAP URL, and a mailto:
    address).  One line naming what was wrong."""
    import asyncio

    from transports.errors import BadAddress
    from transports.registry import check_transport_spec

    from ..transport_options import TransportOptions

    check_transport_spec(spec)
    plugin = check_transport_spec(spec).inner
    try:
        transport = TransportOptions.from_stored(options).create(plugin, own=plugin)
    except (TypeError, ValueError):
        if options:
            raise  # BadTransportOptions: one line naming the transport and the option
        return  # a transport that cannot be built without the options a run gives checks its address then
    try:
        for value, check, option in ((inbox, transport.check_inbox_address, inbox_option),
                                     (send, transport.check_send_address, send_option)):
            if value is not None:
                try:
                    check(value)
                except BadAddress as error:
                    raise click.BadParameter(f"{error}{hint}", param_hint=f"'{option}'") from None
    finally:
        asyncio.run(transport.aclose())


def sender_options(spec: str, reply_address: str | None, options: dict[str, str]) -> dict[str, str]:
    """An email site sends From: its reply address unless told otherwise:
    ``from_address`` filled in from ``mailto:`` ``reply_address``."""
    from transports.registry import parse_transport_spec

    if parse_transport_spec(spec).inner != "email" or not reply_address or "from_address" in options:
        return {}
    from transports.email import Recipient

    return {"from_address": Recipient.parse(reply_address).email}


# -- sites -----------------------------------------------------------------------------


def check_parent_directory(path: Path) -> None:
    """One clear line when the folder that is to hold the new file ``path``
    is missing or is no folder."""
    parent = path.parent
    if parent.is_dir():
        return
    if os.path.lexists(parent):
        raise AgentError(f"{parent} is not a directory, so {path} cannot be made there")
    raise AgentError(f"directory {parent} does not exist; create it first")


def check_site_path(path: Path | str) -> None:
    """One clear line when ``path`` cannot be a site database at all (a URI
    is checked by connecting to it)."""
    if isinstance(path, str):
        return
    if not str(path) or not path.exists():
        raise AgentError(f"{path}: no such site database; check the path, or create the site with `agent init`")
    if path.is_dir():
        raise AgentError(f"{path} is a directory, not a site database")


@contextlib.contextmanager
def open_site(path: Path | str) -> Iterator["Site"]:  # noqa: F821 - imported lazily
    """Open an existing site, with a clear line when it is missing (an older
    SQLite one that still holds its secret key has it moved out first)."""
    from ..keyfiles import open_site_database

    check_site_path(path)
    site = open_site_database(path)
    try:
        yield site
    finally:
        site.close()


def remote_names(site: "Site") -> list[str]:  # noqa: F821
    return list(site.remote_names())


def require_remote(site: "Site", name: str) -> None:  # noqa: F821
    names = remote_names(site)
    if name not in names:
        known = _known_remotes(names, name)
        if name == site.identity.name:
            raise AgentError(f"{name!r} is the name of the site in {site.path} itself, not one of its remotes "
                             f"({known})")
        raise AgentError(f"{site.path} has no remote named {name!r} ({known}); "
                         f"add it with `agent remote add {site.path} {name} --address ...`")


def _known_remotes(names: list[str], name: str) -> str:
    """What to say of a site's remotes when ``name`` is none of them: one
    line however large the fleet (the closest names at most)."""
    if not names:
        return "it has no remotes yet"
    if len(names) <= 3:
        return f"its remotes are {', '.join(names)}"
    closest = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    count = f"it has {len(names)} remotes"
    return f"{count}; the closest: {', '.join(closest)}" if closest else f"{count}, none named like it"


SHARED_INBOX_HELP = ("The remote's inbox is shared with other remotes on purpose (each agent takes only the "
                     "files named for it): no warning about it.")
SHARED_INBOX_SHOWN = 20  # warning lines at most; more shared addresses are counted on one line


def shared_inbox_warnings(site: "Site", new: Iterable[tuple[str, str, str | None]]  # noqa: F821
                          ) -> list[str]:
    """One warning line per address of ``new`` (name, address, transport)
    that another remote (one of the site's, or another of ``new``) is sent
    to as well: a shared folder or mailbox works (docs/transports.md), but
    is more often a slip that lands one remote's messages in another's
    inbox, where they are left unread."""
    def place(address: str, transport: str | None) -> tuple[str, str]:
        kind = (transport or "folder").split("+")[-1]
        return kind, os.path.abspath(os.path.expanduser(address)) if kind == "folder" else address

    new = list(new)
    adding = {name for name, _, _ in new}
    holders: dict[tuple[str, str], list[str]] = {}
    for remote in site.remotes():
        if remote.address and remote.name not in adding:
            holders.setdefault(place(remote.address, remote.transport), []).append(remote.name)
    for name, address, transport in new:
        holders.setdefault(place(address, transport), []).append(name)
    lines, warned = [], set()
    for name, address, transport in new:
        key = place(address, transport)
        others = [other for other in holders[key] if other != name]
        if not others or key in warned:
            continue
        warned.add(key)
        lines.append(f"warning: {address} is the inbox of {', '.join(sorted({name, *others}))}: each agent takes "
                     "only its own files there; if that was not meant, give each remote its own address "
                     "(--shared-inbox silences this)")
    if len(lines) > SHARED_INBOX_SHOWN:
        lines[SHARED_INBOX_SHOWN:] = [f"warning: and {len(lines) - SHARED_INBOX_SHOWN} more shared inboxes"]
    return lines


# -- wording ---------------------------------------------------------------------------


def format_moment(moment: datetime | None) -> str:
    """A stored UTC time for people: ``2024-05-01 18:30:02Z``; ``-`` when never."""
    if moment is None:
        return "-"
    if moment.tzinfo is not None:
        moment = moment.astimezone(timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M:%SZ")


def iso_moment(moment: datetime | None) -> str | None:
    """A stored time for JSON: ISO 8601 in UTC, or null."""
    if moment is None:
        return None
    if moment.tzinfo is not None:
        moment = moment.astimezone(timezone.utc)
    return moment.isoformat()


def format_seconds(seconds: float | int) -> str:
    """``90`` -> ``1m30s``; the inverse of :func:`parse_duration`."""
    whole = int(seconds)
    if whole != seconds:
        return f"{seconds:g}s"
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    text = (f"{hours}h" if hours else "") + (f"{minutes}m" if minutes else "") + (f"{secs}s" if secs else "")
    return text or "0s"


def incarnation_text(value: bytes | None) -> str | None:
    return None if value is None else str(uuid.UUID(bytes=value))


def key_fingerprint(line: str | None) -> str | None:
    """The fingerprint of a stored public key line; None when there is none."""
    if not line:
        return None
    from codec.errors import CodecError
    from codec.keys import line_fingerprint

    try:
        return line_fingerprint(line)
    except CodecError:
        return "(unreadable key)"


def schedule_text(send_every: int | None, send_at: time | None) -> str:
    if send_every is not None:
        return f"every {format_seconds(send_every)}"
    if send_at is not None:
        return f"at {send_at.strftime('%H:%M') if not send_at.second else send_at.isoformat()}"
    return "on each run"


# -- output ----------------------------------------------------------------------------


def console() -> Console:
    """A console on stdout.  When stdout is not a terminal (a pipe, a file,
    a test) the text is plain and tables get room for whole lines instead
    of the 80 columns rich assumes.

    Markup is off: what is printed holds names, addresses and paths users
    chose, and ``[/x]`` in one must print as itself.  A command that wants
    a style passes ``markup=True`` and escapes what it did not write
    (:func:`rich.markup.escape`)."""
    out = Console(highlight=False, markup=False)
    if not out.is_terminal and "COLUMNS" not in os.environ:
        out = Console(highlight=False, markup=False, width=200)
    return out


def error_console() -> Console:
    return Console(stderr=True, highlight=False, markup=False)


def show_progress(out: Console) -> bool:
    """Progress bars only on a terminal; tests patch this to exercise them."""
    return out.is_terminal


_OUR_LOGGERS = ("fieldsync", "agent", "transports", "codec")


@contextlib.contextmanager
def logging_to(*, verbose: bool, log_file: Path | None, summarized: bool = False) -> Iterator[None]:
    """Log to stderr (and ``log_file``) while a command runs: INFO from
    fieldsync's own loggers, DEBUG with ``-v``; other libraries WARNING.
    ``summarized``: records the command's summary repeats (``in_summary``,
    a batch run's transport errors) go to ``log_file`` only, so the
    terminal shows each problem once."""
    level = logging.DEBUG if verbose else logging.INFO
    formatter = logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%Y-%m-%d %H:%M:%S")
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if summarized:
        handlers[0].addFilter(lambda record: not getattr(record, "in_summary", False))
    if log_file is not None:
        try:
            # Reopened when moved or deleted, so that logrotate's default
            # (rename, then a new file) works with a long-running agent.
            handlers.append(logging.handlers.WatchedFileHandler(log_file, encoding="utf-8"))
        except OSError as error:
            raise AgentError(f"cannot open the log file {log_file}: {error.strerror}") from None
    root = logging.getLogger()
    saved_root_level = root.level
    saved_levels = {name: logging.getLogger(name).level for name in _OUR_LOGGERS}
    for handler in handlers:
        handler.setFormatter(formatter)
        handler.setLevel(level)
        root.addHandler(handler)
    root.setLevel(logging.WARNING)  # other libraries (paramiko, ...) stay quiet
    for name in _OUR_LOGGERS:
        logging.getLogger(name).setLevel(level)
    try:
        yield
    finally:
        for handler in handlers:
            root.removeHandler(handler)
            handler.close()
        root.setLevel(saved_root_level)
        for name, saved in saved_levels.items():
            logging.getLogger(name).setLevel(saved)
