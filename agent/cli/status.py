"""``agent status`` (SQL Remote's SYSREMOTEUSER): the remote-user table,
queue depths, quarantine, conflicts, errors and the log end.

:func:`collect_status` builds the one dictionary both outputs come from;
its layout is ``fieldsync.status/1``, documented in docs/cli.md.  Keys are
only ever added to it; a change that removes or re-types one gets a new
format number.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import re
import sys
from collections import Counter
from datetime import datetime, time, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..site.remote_rules import COLUMNS, RemoteFilter, horizon, schema_current, sending_due
from ._common import (DATABASE, MAX_DURATION, console, error_console, format_moment, format_seconds, incarnation_text,
                      iso_moment, key_fingerprint, open_site, parse_duration, schedule_text)
from ._spool import quarantined, spool_figures

FORMAT = "fieldsync.status/1"
LINES_FORMAT = "fieldsync.status-lines/1"


# Moments of a remote-user row on the agent's clock (Unix seconds).
CLOCK_KEYS = ("control_sent_at", "heard_at", "data_sent_at")
#: A ``remotes`` item's keys, in order: every column of the remote-user row,
#: then what status adds to it.
REMOTE_KEYS = (*COLUMNS, "fingerprint", "sending_due", "inbound_queue", "outbound_queue", "lag",
               *(f"{key}_iso" for key in CLOCK_KEYS), "apply_errors_open", "in_error", "schema_current")
# Where rows() finds the columns it reads.
(_NAME, _LOG_SEND, _LOG_SENT, _CONFIRM_SENT, _LOG_READ, _PUBLIC_KEY, _LAST_ERROR, _STREAM_STOPPED,
 _CONFIRM_OWED, _PEER_SCHEMA) = map(COLUMNS.index, ("name", "log_send", "log_sent", "confirm_sent", "log_read",
                                                    "public_key", "last_error", "stream_stopped", "confirm_owed",
                                                    "peer_schema_version"))
_CLOCK_AT = tuple(map(COLUMNS.index, CLOCK_KEYS))


@dataclasses.dataclass(frozen=True)
class StatusParts:
    """``agent status`` in three parts, so that the remotes (a hundred
    thousand of them at a large consolidated) are written as they are read:
    ``head`` (the keys before ``remotes`` in fieldsync.status/1), the
    ``remotes`` as an iterator of their values (lists, in the order of
    ``keys``), ``tail`` (the keys after it), and ``total``, the number of
    remotes before any filter."""

    head: dict[str, Any]
    remotes: Iterator[list[Any]]
    tail: dict[str, Any]
    total: int
    keys: tuple[str, ...] = REMOTE_KEYS

    def remote_items(self) -> Iterator[dict[str, Any]]:
        """The ``remotes`` items, each a dictionary."""
        keys = self.keys
        return (dict(zip(keys, values)) for values in self.remotes)


@contextlib.contextmanager
def status_parts(database: Path, which: RemoteFilter | None = None) -> Iterator[StatusParts]:
    """Everything ``agent status`` shows, as plain JSON values; the site
    stays open (and its rows' snapshot) while ``remotes`` is read."""
    with open_site(database) as site:
        identity = site.identity
        log_end = site.log_end()
        counts = site.counts()
        missing = site.missing_tables()
        # The summary the spool keeps; a full read of its span when that is stale or unreadable.
        spool = spool_figures(database)
        if spool is not None and spool.unreadable:
            error_console().print(f"agent: {spool.reason}; read the spool's log instead (the agent's next "
                                  "write replaces the summary; `agent spool check` checks the spool)", soft_wrap=True)
        depths = {depth.peer: depth for depth in spool.depths} if spool is not None else {}

        open_errors = site.open_apply_errors()  # few rows: only peers with apply errors not acknowledged
        version = site.schema_version()
        consolidated = identity.role.value == "consolidated"
        # Each row's values straight from the database (no RemoteUser made):
        # its columns' JSON values, but confirm_owed (0 or 1).
        remotes = site.iter_remote_values(which or RemoteFilter())

        def rows() -> Iterator[list[Any]]:
            depth_of, open_of, utc, moment = depths.get, open_errors.get, timezone.utc, datetime.fromtimestamp
            clock_texts: dict[float, str] = {}  # a run stamps many peers with one moment (control_sent_at)

            def clock_iso(seconds: float | None) -> str | None:
                # The agent's clock keeps these as Unix seconds; every other
                # *_at is ISO 8601, so each comes in that form too (the
                # number stays: fieldsync.status/1 never changes a key's type).
                if seconds is None:
                    return None
                text = clock_texts.get(seconds)
                if text is None:
                    if len(clock_texts) >= 4096:
                        clock_texts.clear()
                    text = clock_texts[seconds] = moment(seconds, utc).isoformat()  # UTC: iso_moment's form
                return text

            control, heard, data = _CLOCK_AT
            for values in remotes:
                name, log_read, log_sent = values[_NAME], values[_LOG_READ], values[_LOG_SENT]
                depth = depth_of(name)
                errors = open_of(name, 0)
                peer_horizon = horizon(log_read, log_sent, values[_CONFIRM_SENT])
                row = [*values, key_fingerprint(values[_PUBLIC_KEY]),
                       sending_due(values[_LOG_SEND], log_read, log_sent),
                       depth.inbound if depth else 0, depth.outbound if depth else 0,
                       max(log_end - peer_horizon, 0),
                       clock_iso(values[control]), clock_iso(values[heard]), clock_iso(values[data]), errors,
                       # What --errors selects (RemoteFilter.with_errors): an error in force now.
                       values[_LAST_ERROR] is not None or values[_STREAM_STOPPED] is not None or errors > 0,
                       schema_current(version, peer_horizon, values[_PEER_SCHEMA]) if consolidated else None]
                row[_CONFIRM_OWED] = bool(row[_CONFIRM_OWED])
                yield row

        head = {
            "format": FORMAT,
            "database": os.path.abspath(database),
            "site": {
                "name": identity.name,
                "role": identity.role.value,
                "incarnation": incarnation_text(identity.incarnation),
                "address": identity.address,
                "reply_address": identity.send_address,
                "transport": identity.transport,
                "public_key": identity.public_key,
                "fingerprint": key_fingerprint(identity.public_key),
                "created_at": iso_moment(identity.created_at),
                # docs/protocol.md, "Schema versions": the offset of the last
                # schema change made or applied here; None: none.
                "schema_version": version,
            },
            "log_end": log_end,
        }
        tail = {
            "queues": [{"peer": peer, "inbound": depth.inbound, "outbound": depth.outbound}
                       for peer, depth in sorted(depths.items())],
            "spool": spool.summary if spool is not None else None,
            "quarantine": len(quarantined(database)),
            "conflicts": counts["conflicts"],
            "apply_errors": counts["apply_errors"],
            "missing_tables": list(missing),
            "apply_errors_open": sum(open_errors.values()),
        }
        try:
            yield StatusParts(head, rows(), tail, counts["remotes"])
        finally:
            remotes.close()  # ends its read transaction while the site is still open


def collect_status(database: Path) -> dict[str, Any]:
    """Everything ``agent status`` shows, as one dictionary (all remotes)."""
    with status_parts(database) as parts:
        return {**parts.head, "remotes": list(parts.remote_items()), **parts.tail}


# A flat object (a remote: a hundred thousand of them) is written by filling
# a template of its keys with its values' JSON texts, all made by one call of
# the C encoder: a scalar's JSON text never holds a line break (json escapes
# it), so the values encoded as one list with a line break between them split
# back into each one's text.  Encoding each key again for every row cost more
# than the values.
_VALUES = json.JSONEncoder(ensure_ascii=False, separators=("\n", ": "))
# The C encoder _VALUES.encode makes at each call, made once (None without
# the C accelerator): the same arguments, but no check for cycles, which a
# list of scalars cannot hold.
_C_VALUES = json.encoder.c_make_encoder and json.encoder.c_make_encoder(
    None, _VALUES.default, json.encoder.encode_basestring, None, ": ", "\n", False, False, True)


def _value_texts(values: list[Any]) -> list[str] | None:
    """The JSON text of each of ``values``, or None when one is a list or an
    object (or there are none): json.dumps(indent=2) writes those over
    several lines."""
    text = _VALUES.encode(values) if _C_VALUES is None else "".join(_C_VALUES(values, 0))
    if not values or text[1] in "[{" or "\n[" in text or "\n{" in text:
        return None
    return text[1:-1].split("\n")


@functools.lru_cache(maxsize=16)
def _template(keys: tuple[str, ...], indented: bool) -> str:
    """A flat object of ``keys`` for ``%`` to fill with its values' JSON
    texts: as json.dumps(indent=2) writes it at the depth of a ``remotes``
    item, or (not ``indented``) with the separators ``,`` and ``:``."""
    names = [json.dumps(key, ensure_ascii=False).replace("%", "%%") for key in keys]
    if indented:
        return "    {\n" + ",\n".join(f"      {name}: %s" for name in names) + "\n    }"
    return "{" + ",".join(f"{name}:%s" for name in names) + "}"


def _object_writer(keys: tuple[str, ...], indented: bool) -> Callable[[list[Any]], str]:
    """A function writing the object of ``keys`` and its values as
    :func:`_template` lays it out; one with a list or an object among its
    values as json.dumps writes it."""
    template = _template(keys, indented)

    def text(values: list[Any]) -> str:
        texts = _value_texts(values)
        if texts is not None:
            return template % tuple(texts)
        if indented:
            return "    " + json.dumps(dict(zip(keys, values)), indent=2, ensure_ascii=False).replace("\n", "\n    ")
        return json.dumps(dict(zip(keys, values)), ensure_ascii=False, separators=(",", ":"))

    return text


def _indented_row(row: dict[str, Any]) -> str:
    """``row`` as the ``remotes`` item of an ``indent=2`` document writes it."""
    return _object_writer(tuple(row), True)(list(row.values()))


def _indented_tail(tail: dict[str, Any]) -> str:
    """The keys after ``remotes``, as json.dumps(indent=2) of the whole
    document writes them (without the closing brace); a list of flat
    objects (``queues``: a line per peer) is written as the remotes are."""
    items = []
    for key, value in tail.items():
        name = json.dumps(key, ensure_ascii=False)
        if isinstance(value, list) and value and all(type(item) is dict for item in value):
            items.append(f"  {name}: [\n" + ",\n".join(map(_indented_row, value)) + "\n  ]")
        else:
            items.append(f"  {name}: " + json.dumps(value, indent=2, ensure_ascii=False).replace("\n", "\n  "))
    return ",\n".join(items)


def write_document(write: Callable[[str], object], parts: StatusParts) -> int:
    """fieldsync.status/1, indented as ``json.dumps(..., indent=2)`` writes
    it, with each remote written as it is read; returns how many."""
    def dump(value: Any) -> str:
        return json.dumps(value, indent=2, ensure_ascii=False)

    write(dump(parts.head)[:-2] + ',\n  "remotes": [')
    item = _object_writer(parts.keys, True)
    count = 0
    for values in parts.remotes:
        write(("," if count else "") + "\n" + item(values))
        count += 1
    if parts.tail:
        write(("\n  ],\n" if count else "],\n") + _indented_tail(parts.tail) + "\n}\n")
    else:
        write(("\n  ]" if count else "]") + "\n}\n")
    return count


def write_lines(write: Callable[[str], object], parts: StatusParts) -> int:
    """fieldsync.status-lines/1: one JSON object a line, each written when
    it is ready: the site (``kind`` "site": the keys of fieldsync.status/1
    but ``remotes`` and ``queues``), one ``kind`` "remote" line per remote
    (the keys of a ``remotes`` item), and an ``kind`` "end" line counting
    them, so that a reader can tell a whole answer from a cut one."""
    def dump(value: Any) -> str:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")) + "\n"

    tail = {key: value for key, value in parts.tail.items() if key != "queues"}
    write(dump({"kind": "site", **parts.head, "format": LINES_FORMAT, **tail}))
    line = _object_writer(("kind", *parts.keys), False)
    count = 0
    for values in parts.remotes:
        write(line(["remote", *values]) + "\n")
        count += 1
    write(dump({"kind": "end", "remotes": count, "of": parts.total}))
    return count


def _moment(text: str | None) -> str:
    return format_moment(None if text is None else datetime.fromisoformat(text))


def _schedule(row: dict[str, Any]) -> str:
    return schedule_text(row["send_every"], None if row["send_at"] is None else time.fromisoformat(row["send_at"]))


# A fleet larger than this shows, without --all, only the peers that need attention.
WHOLE_TABLE_UP_TO = 20
DEFAULT_HEARTBEAT = 86400.0  # agent run's --heartbeat, for a peer with none of its own


def peer_state(row: dict[str, Any], now: float) -> str:
    """What a peer needs, most urgent first: ``in error`` (as --errors),
    ``lagging`` (as --lagging), ``silent`` (nothing heard from it for longer
    than its heartbeat, 24 h by default: a running peer sends one at least
    that often), else ``at rest``."""
    if row["in_error"]:
        return "in error"
    if row["lag"] > 0:
        return "lagging"
    heard = row["heard_at"]
    if heard is None:
        heard = datetime.fromisoformat(row["created_at"]).timestamp()
    if now - heard > (row["heartbeat"] or DEFAULT_HEARTBEAT):
        return "silent"
    return "at rest"


STATES = ("at rest", "lagging", "silent", "in error")


def render_status(out: Console, status: dict[str, Any], *, total: int | None = None,
                  filters: list[str] | None = None, show_all: bool = False, now: float | None = None) -> None:
    """The human form: the site, a summary of its peers' states, then the
    remote-user table in three parts: every peer of a small site, or with
    ``show_all``; else the peers that need attention (with ``filters``, the
    rows they kept of ``total``)."""
    site = status["site"]
    out.print(f"[bold]{escape(site['name'])}[/] " + escape(f"({site['role']}) in {status['database']}"),
              soft_wrap=True, markup=True)
    out.print(f"  incarnation {site['incarnation']}, key {site['fingerprint'] or 'none'}", soft_wrap=True)
    out.print(f"  inbox {site['address'] or '-'} ({site['transport'] or 'folder'}) · peers send to "
              f"{site['reply_address'] or '-'}", soft_wrap=True)
    version = site.get("schema_version")
    out.print(f"  schema version {'none' if version is None else version} · log end {status['log_end']} · "
              f"quarantined files {status['quarantine']} · "
              f"conflicts {status['conflicts']} · apply errors {status['apply_errors']}", soft_wrap=True)
    for table in status["missing_tables"]:
        out.print(escape(f"  published table {table!r} is no longer in the database (renamed or dropped?): give it "
                         f"back its name, or stop publishing it with `agent publication remove DB {table}`"),
                  soft_wrap=True)
    spool = status.get("spool")
    if spool is not None:
        age = spool["oldest_message_age_s"]
        out.print(f"  spool: {spool['messages']} queued messages, oldest "
                  f"{'-' if age is None else format_seconds(age)}, restart span {spool['restart_span_bytes']} bytes "
                  f"of {spool['log_bytes']}, {spool['in_doubt']} in doubt"
                  + ("" if spool["ok"] else f" · PROBLEMS: {'; '.join(spool['problems'])}")
                  # Where the figures came from: the spool's summary, or (stale, missing) its log read in full.
                  + ("" if spool.get("source") != "check" else f" · read from the log: {spool['summary_problem']}"),
                  soft_wrap=True)
    rows = status["remotes"]
    if filters:
        out.print(f"  {len(rows)} of {total} remotes: {' '.join(filters)}", soft_wrap=True)
        if not rows:
            return
    if not rows:
        out.print("  no remote users; add one with `agent remote add`")
        return
    moment = datetime.now(timezone.utc).timestamp() if now is None else now
    states = {row["name"]: peer_state(row, moment) for row in rows}
    counted = Counter(states.values())
    out.print(f"  {len(rows)} peers: " + " · ".join(f"{counted[state]} {state}" for state in STATES),
              soft_wrap=True)
    if not (filters or show_all) and len(rows) > WHOLE_TABLE_UP_TO:
        rows = [row for row in rows if states[row["name"]] != "at rest"]
        out.print(f"  the {len(rows)} that need attention below (`--all` shows every peer)", soft_wrap=True)
        if not rows:
            return
    # Three tables of at most seven columns, so each fits a 100-column terminal.
    sending = Table(title="sending (offsets in this site's log)", title_justify="left")
    for column in ("peer", "log_send", "log_sent", "confirm_sent", "resend_count", "send_count", "last_sent_at"):
        sending.add_column(column, justify="left" if column in ("peer", "last_sent_at") else "right")
    receiving = Table(title="receiving (offsets in the peer's log)", title_justify="left")
    for column in ("peer", "log_received", "confirm_received", "rereceive_count", "receive_count",
                   "last_received_at", "schema"):
        receiving.add_column(column, justify="left" if column in ("peer", "last_received_at") else "right")
    link = Table(title="link (incarnation: the peer's, first 8 digits; --json has every column in full)",
                 title_justify="left")
    for column in ("peer", "transport", "address", "schedule", "queued in/out", "key", "incarnation", "errors now"):
        link.add_column(column, overflow="fold", no_wrap=column in ("key", "incarnation"))
    for row in rows:
        sending.add_row(row["name"], str(row["log_send"]), str(row["log_sent"]), str(row["confirm_sent"]),
                        str(row["resend_count"]), str(row["send_count"]), _moment(row["last_sent_at"]))
        receiving.add_row(row["name"], str(row["log_received"]), str(row["confirm_received"]),
                          str(row["rereceive_count"]), str(row["receive_count"]), _moment(row["last_received_at"]),
                          ("-" if row.get("peer_schema_version") is None else str(row["peer_schema_version"]))
                          + (" behind" if row.get("schema_current") is False else ""))
        error = _errors_text(row)
        link.add_row(row["name"], row["transport"] or "-", row["address"] or "-", _schedule(row),
                     f"{row['inbound_queue']}/{row['outbound_queue']}", row["fingerprint"] or "none",
                     (row["peer_incarnation"] or "-")[:8], error)
    out.print(sending)
    out.print(receiving)
    out.print(link)


def _errors_text(row: dict[str, Any]) -> str:
    """The errors in force on the peer (what --errors selects), then the
    history: how many were recorded, the last when."""
    now = []
    if row["stream_stopped"]:
        now.append(f"stream stopped: {row['stream_stopped']} ({_moment(row['stream_stopped_at'])})")
    if row["last_error"]:
        now.append(f"{row['last_error']} ({_moment(row['last_error_at'])})")
    if row["apply_errors_open"]:
        count = row["apply_errors_open"]
        now.append(f"{count} apply error{'' if count == 1 else 's'} not acknowledged")
    text = "; ".join(now) or "-"
    if row["error_count"]:
        text += f" · {row['error_count']} recorded, the last {_moment(row['error_seen_at'])}"
    return text


class SilentFor(click.ParamType):
    """A duration as everywhere (``90s``, ``5m``, ``12h``), and also in
    days, the unit of a field site that has gone quiet: ``3d``, ``1d12h``."""

    name = "duration"
    _DAYS = re.compile(r"\s*([0-9]+)d(.*)", re.S)

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        text = str(value)
        match = self._DAYS.fullmatch(text.lower())
        try:
            seconds = int(match.group(1)) * 86400.0 if match else 0.0
            rest = match.group(2) if match else text
            if rest.strip() or not match:
                seconds += parse_duration(rest)
        except ValueError:
            self.fail(f"{text!r} is not a duration; write it like 3d, 1d12h, 12h, 90m", param, ctx)
        if seconds <= 0 or seconds > MAX_DURATION:
            self.fail(f"{text!r}: give a duration above 0 and at most 366 days", param, ctx)
        return seconds


@click.command()
@click.argument("database", type=DATABASE)
@click.option("--lagging", is_flag=True,
              help="Only peers that hold the log back: not everything up to the log end is confirmed, or known "
                   "to hold nothing for them (their horizon, docs/protocol.md rule 8, is before the log end).")
@click.option("--silent-for", type=SilentFor(), metavar="DURATION",
              help="Only peers nothing was heard from for DURATION (3d, 12h, 90m): no message of theirs, data or "
                   "control, arrived (heard_at).")
@click.option("--errors", "with_errors", is_flag=True,
              help="Only peers in error now: a transport error not yet followed by a successful send or "
                   "receive, a stopped stream, or apply errors not acknowledged (`agent remote ack-errors`).")
@click.option("--all", "show_all", is_flag=True,
              help=f"Show every peer's rows; without it a site of more than {WHOLE_TABLE_UP_TO} peers shows those "
                   "that need attention (lagging, silent, in error) after the summary.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (format fieldsync.status/1).")
@click.option("--json-lines", "as_lines", is_flag=True,
              help="Print one JSON object a line, each remote as it is read (format fieldsync.status-lines/1).")
def status(database: Path, lagging: bool, silent_for: float | None, with_errors: bool, show_all: bool,
           as_json: bool, as_lines: bool) -> None:
    """Show the remote-user table of DATABASE, its queues and its errors.

    Offsets: log_send, log_sent and confirm_sent are in this site's log;
    log_received and confirm_received in the peer's.  At rest, every peer
    has confirmed all that was sent to it (confirm_sent == log_sent) and
    the log was read for it to its end (read_through == log end; a peer
    gets no message without news, so log_sent stays where its last data
    went).  The filters
    (--lagging, --silent-for, --errors) keep the peers that meet all of
    those given.

    Example: agent status hq.db --lagging --silent-for 3d --json-lines
    """
    if as_json and as_lines:
        raise click.UsageError("--json and --json-lines exclude each other: one document, or one object a line")
    silent_since = None
    if silent_for is not None:
        silent_since = datetime.now(timezone.utc) - timedelta(seconds=silent_for)
    which = RemoteFilter(lagging=lagging, silent_since=silent_since, with_errors=with_errors)
    with status_parts(database, which) as parts:
        if as_json or as_lines:
            try:
                (write_document if as_json else write_lines)(sys.stdout.write, parts)
                sys.stdout.flush()
            except BrokenPipeError:
                # The reader stopped reading (`| head`): what it read is what it wanted.
                _quiet_stdout()
            return
        data = {**parts.head, "remotes": list(parts.remote_items()), **parts.tail}
    filters = [text for text, given in (("--lagging", lagging), (f"--silent-for {_silent_text(silent_for)}",
                                                                   silent_for is not None),
                                        ("--errors", with_errors)) if given]
    render_status(console(), data, total=parts.total if filters else None, filters=filters, show_all=show_all)


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush of a
    closed pipe says nothing."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def _silent_text(seconds: float | None) -> str:
    if seconds is None:
        return ""
    days, rest = divmod(int(seconds), 86400)
    if days and rest == 0 and seconds == int(seconds):
        return f"{days}d"
    return format_seconds(seconds)
