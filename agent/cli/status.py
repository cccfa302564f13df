"""``agent status`` (SQL Remote's SYSREMOTEUSER): the remote-user table,
queue depths, quarantine, conflicts, errors and the log end.

:func:`collect_status` builds the one dictionary both outputs come from;
its layout is ``fieldsync.status/1``, documented in docs/cli.md.  Keys are
only ever added to it; a change that removes or re-types one gets a new
format number.
"""

from __future__ import annotations

import dataclasses
import json
import os
from datetime import datetime, time
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ._common import (DATABASE, console, format_moment, format_seconds, incarnation_text, iso_moment, key_fingerprint,
                      open_site,
                      schedule_text)
from ._spool import quarantined, queue_depths, spool_summary

FORMAT = "fieldsync.status/1"


def _json_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return iso_moment(value)
    if isinstance(value, time):
        return value.isoformat()
    if isinstance(value, bytes):
        return incarnation_text(value) if len(value) == 16 else value.hex()
    return value


def collect_status(database: Path) -> dict[str, Any]:
    """Everything ``agent status`` shows, as plain JSON values."""
    with open_site(database) as site:
        identity = site.identity
        remotes = site.remotes()
        log_end = site.log_end()
        conflicts = len(site.conflicts())
        apply_errors = len(site.apply_errors())
        missing = site.missing_tables()
    depths = {depth.peer: depth for depth in queue_depths(database)}
    rows = []
    for remote in remotes:
        row = {field.name: _json_value(getattr(remote, field.name)) for field in dataclasses.fields(remote)}
        depth = depths.get(remote.name)
        row["fingerprint"] = key_fingerprint(remote.public_key)
        row["sending_due"] = remote.sending_due
        row["inbound_queue"] = depth.inbound if depth else 0
        row["outbound_queue"] = depth.outbound if depth else 0
        rows.append(row)
    return {
        "format": FORMAT,
        "database": os.path.abspath(database),
        "site": {
            "name": identity.name,
            "role": identity.role.value,
            "incarnation": incarnation_text(identity.incarnation),
            "address": identity.address,
            "transport": identity.transport,
            "public_key": identity.public_key,
            "fingerprint": key_fingerprint(identity.public_key),
            "created_at": iso_moment(identity.created_at),
        },
        "log_end": log_end,
        "remotes": rows,
        "queues": [{"peer": peer, "inbound": depth.inbound, "outbound": depth.outbound}
                   for peer, depth in sorted(depths.items())],
        "spool": spool_summary(database),
        "quarantine": len(quarantined(database)),
        "conflicts": conflicts,
        "apply_errors": apply_errors,
        "missing_tables": list(missing),
    }


def _moment(text: str | None) -> str:
    return format_moment(None if text is None else datetime.fromisoformat(text))


def _schedule(row: dict[str, Any]) -> str:
    return schedule_text(row["send_every"], None if row["send_at"] is None else time.fromisoformat(row["send_at"]))


def render_status(out: Console, status: dict[str, Any]) -> None:
    """The human form: the site, then the remote-user table in three parts."""
    site = status["site"]
    out.print(f"[bold]{escape(site['name'])}[/] " + escape(f"({site['role']}) in {status['database']}"),
              soft_wrap=True, markup=True)
    out.print(f"  incarnation {site['incarnation']}, key {site['fingerprint'] or 'none'}", soft_wrap=True)
    out.print(f"  inbox {site['address'] or '-'} ({site['transport'] or 'folder'})", soft_wrap=True)
    out.print(f"  log end {status['log_end']} · quarantined files {status['quarantine']} · "
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
                  + ("" if spool["ok"] else f" · PROBLEMS: {'; '.join(spool['problems'])}"), soft_wrap=True)
    rows = status["remotes"]
    if not rows:
        out.print("  no remote users; add one with `agent remote add`")
        return
    # Three tables of at most seven columns, so each fits a 100-column terminal.
    sending = Table(title="sending (offsets in this site's log)", title_justify="left")
    for column in ("peer", "log_send", "log_sent", "confirm_sent", "resend_count", "send_count", "last_sent_at"):
        sending.add_column(column, justify="left" if column in ("peer", "last_sent_at") else "right")
    receiving = Table(title="receiving (offsets in the peer's log)", title_justify="left")
    for column in ("peer", "log_received", "confirm_received", "rereceive_count", "receive_count",
                   "last_received_at"):
        receiving.add_column(column, justify="left" if column in ("peer", "last_received_at") else "right")
    link = Table(title="link (incarnation: the peer's, first 8 digits; --json has every column in full)",
                 title_justify="left")
    for column in ("peer", "transport", "address", "schedule", "queued in/out", "key", "incarnation", "last error"):
        link.add_column(column, overflow="fold", no_wrap=column in ("key", "incarnation"))
    for row in rows:
        sending.add_row(row["name"], str(row["log_send"]), str(row["log_sent"]), str(row["confirm_sent"]),
                        str(row["resend_count"]), str(row["send_count"]), _moment(row["last_sent_at"]))
        receiving.add_row(row["name"], str(row["log_received"]), str(row["confirm_received"]),
                          str(row["rereceive_count"]), str(row["receive_count"]), _moment(row["last_received_at"]))
        error = "-" if not row["last_error"] else f"{row['last_error']} ({_moment(row['last_error_at'])})"
        link.add_row(row["name"], row["transport"] or "-", row["address"] or "-", _schedule(row),
                     f"{row['inbound_queue']}/{row['outbound_queue']}", row["fingerprint"] or "none",
                     (row["peer_incarnation"] or "-")[:8], error)
    out.print(sending)
    out.print(receiving)
    out.print(link)


@click.command()
@click.argument("database", type=DATABASE)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (format fieldsync.status/1).")
def status(database: Path, as_json: bool) -> None:
    """Show the remote-user table of DATABASE, its queues and its errors.

    Offsets: log_send, log_sent and confirm_sent are in this site's log;
    log_received and confirm_received in the peer's.  At rest,
    confirm_sent == log_sent == log end for every peer.
    """
    data = collect_status(database)
    if as_json:
        click.echo(json.dumps(data, indent=2, ensure_ascii=False))
        return
    render_status(console(), data)

