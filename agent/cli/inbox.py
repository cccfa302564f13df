"""``agent inbox`` (dbremote -a): what is waiting to be applied, and what
was refused, without applying, acknowledging or deleting anything."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from ..transport_options import TransportOptions
from ._common import ADDRESS, DATABASE, TRANSPORT, TransportOption, console, format_moment, iso_moment, open_site
from ._spool import QuarantinedFile, quarantined, queue_reports


@dataclass(frozen=True, slots=True)
class Pending:
    name: str
    sender: str | None
    kind: str | None        # "data" or "control"; None when the name is not a message name
    header: str | None      # (resend_count-prev-last-seq)
    size: int
    check: str              # "ok", or why the agent will quarantine it (or leave it, not being for this site)


def _describe_name(name: str) -> tuple[str | None, str | None, str | None, str | None]:
    from codec.errors import BadFileName
    from codec.names import Kind, MessageName

    try:
        parsed = MessageName.parse(name)
    except BadFileName as error:
        return None, None, None, str(error)
    kind = "data" if parsed.kind is Kind.DATA else "control"
    return parsed.sender, kind, str(parsed.header), None


def _check(name: str, data: bytes, site_name: str, peers: frozenset[str], keyring: Any) -> str:
    """What the agent will think of the file (the runner's checks on
    arrival, in its order): verified, or why it will be quarantined, or
    why it will be left where it is (a file that is not for this site)."""
    from codec.errors import BadFileName, MessageError
    from codec.message import check_message
    from codec.names import MessageName

    try:
        parsed = MessageName.parse(name)
    except BadFileName as error:
        return f"{error}: left where it is"
    if parsed.recipient != site_name:
        return f"addressed to {parsed.recipient}, not {site_name}: left where it is"
    if parsed.sender not in peers:
        return f"from {parsed.sender}, which is not a peer of {site_name}"
    try:
        message = check_message(data, source=name, keyring=keyring, recipient=site_name)
    except MessageError as error:
        return str(error)
    if message.header != parsed.header or message.sender != parsed.sender or message.kind is not parsed.kind:
        return "file name does not match the message inside it"
    return "ok, signed by " + message.sender + (", sealed" if message.sealed else "")


async def _waiting(transport_name: str, options: TransportOptions, address: str, site_name: str,
                   peers: frozenset[str], keyring: Any) -> list[Pending]:
    found = []
    # Options for other transports (the same -O list as for `agent run`) are not this one's.
    async with options.create(transport_name, own=transport_name) as transport:
        async for incoming in transport.receive(address):  # nothing is acknowledged: the files stay
            sender, kind, header, _ = _describe_name(incoming.name)
            found.append(Pending(incoming.name, sender, kind, header, len(incoming.data),
                                 _check(incoming.name, incoming.data, site_name, peers, keyring)))
    return found


def _queued(database: Path) -> dict[str, list[Pending]]:
    """Inbound messages queued in the spool, read without taking it (the
    spool reports each queue's total bytes, so a message's size is that
    total shared out)."""
    result: dict[str, list[Pending]] = {}
    for report in queue_reports(database):
        if report.direction != "in" or not report.names:
            continue
        share = report.content_bytes // len(report.names)
        entries = []
        for name in report.names:
            sender, kind, header, _ = _describe_name(name)
            entries.append(Pending(name, sender, kind, header, share, "verified on arrival"))
        result[report.peer] = entries
    return result


def _pending_json(item: Pending) -> dict[str, Any]:
    return {"file": item.name, "sender": item.sender, "kind": item.kind, "header": item.header,
            "size": item.size, "check": item.check}


def _quarantine_json(item: QuarantinedFile) -> dict[str, Any]:
    return {"file": item.file, "name": item.name, "peer": item.peer, "reason": item.reason,
            "at": iso_moment(item.at), "size": item.size, "content_kept": item.kept}


@click.command()
@click.argument("database", type=DATABASE)
@click.option("--transport", type=TRANSPORT, metavar="NAME", help="Transport to look at (default: the site's own).")
@click.option("--address", type=ADDRESS, metavar="ADDRESS", help="Inbox address to look at (default: the site's own).")
@click.option("--transport-option", "-O", "transport_options", multiple=True, type=TransportOption(),
              help="A transport setting NAME=VALUE (as for `agent run`). Repeatable.")
@click.option("--queued-only", is_flag=True,
              help="Do not look at the inbox address; show only what the agent holds already.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def inbox(database: Path, transport: str | None, address: str | None, transport_options: tuple, queued_only: bool,
          as_json: bool) -> int:
    """List the messages waiting for the site in DATABASE, and the quarantine.

    Three parts: files waiting at the site's inbox address (not yet taken
    in; each checked as the agent would check it), messages the agent has
    taken in but not applied yet (waiting for an earlier one, per peer),
    and quarantined files with the reason each was refused.  Nothing is
    applied, acknowledged or deleted.
    """
    from codec.errors import CodecError
    from codec.keys import Keyring, PublicKeys
    from transports.errors import TransportError

    TransportOptions.from_items(transport_options).check_names()
    with open_site(database) as site:
        identity = site.identity
        # The site's stored options, with this command's -O over them (as for `agent run`).
        link = TransportOptions.from_items(transport_options).over(
            TransportOptions.from_stored(site.transport_options()))
        keyring = Keyring()
        remotes = site.remotes()
        peers = frozenset(remote.name for remote in remotes)
        for remote in remotes:
            if remote.public_key:
                try:
                    keyring.add(PublicKeys.from_line(remote.public_key))
                except CodecError:
                    pass  # `agent status` shows the unreadable key; the files then fail their check
    address = address or identity.address
    transport_name = transport or identity.transport or "folder"
    waiting: list[Pending] | None = None
    problem = None
    if not queued_only:
        if not address:
            problem = f"site {identity.name} has no inbox address; give one with --address"
        else:
            try:
                waiting = asyncio.run(_waiting(transport_name, link, address, identity.name, peers, keyring))
            except (TransportError, TypeError, ValueError) as error:
                problem = f"cannot list {address} ({transport_name}): {error}"
    queued = _queued(database)
    refused = quarantined(database)
    if as_json:
        click.echo(json.dumps({
            "site": identity.name,
            "address": address,
            "transport": transport_name,
            "waiting": None if waiting is None else [_pending_json(item) for item in waiting],
            "queued": {peer: [_pending_json(item) for item in items] for peer, items in queued.items()},
            "quarantine": [_quarantine_json(item) for item in refused],
            "error": problem,
        }, indent=2, ensure_ascii=False))
    else:
        out = console()
        if waiting is not None:
            if waiting:
                table = Table(title=f"waiting at {address} ({transport_name}): {len(waiting)} file(s)",
                              title_justify="left")
                for column in ("file", "from", "kind", "header", "bytes", "check"):
                    table.add_column(column, overflow="fold", justify="right" if column == "bytes" else "left")
                for item in waiting:
                    table.add_row(item.name, item.sender or "?", item.kind or "?", item.header or "-",
                                  str(item.size), item.check)
                out.print(table)
            else:
                out.print(f"Nothing waiting at {address} ({transport_name}).", soft_wrap=True)
        if queued:
            table = Table(title="taken in, waiting to be applied", title_justify="left")
            for column in ("peer", "file", "header", "bytes"):
                table.add_column(column, overflow="fold", justify="right" if column == "bytes" else "left")
            for peer, items in queued.items():
                for item in items:
                    table.add_row(peer, item.name, item.header or "-", str(item.size))
            out.print(table)
        else:
            out.print("No messages taken in and waiting to be applied.")
        if refused:
            table = Table(title=f"quarantine: {len(refused)} file(s)", title_justify="left")
            for column in ("file", "peer", "reason", "at"):
                table.add_column(column, overflow="fold")
            for item in refused:
                table.add_row(item.file, item.peer or "-", item.reason, format_moment(item.at))
            out.print(table)
        else:
            out.print("Quarantine is empty.")
    if problem is not None:
        click.echo(f"agent: {problem}", err=True)
        return 1
    return 0
