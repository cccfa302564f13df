"""``agent site set``: change a site's own transport settings after ``agent init`` or extraction."""

from __future__ import annotations

from pathlib import Path

import click

from ._common import (ADDRESS, DATABASE, TRANSPORT, TransportOption, check_transport_settings, console, open_site,
                      sender_options, stored_options)

OPTION_HELP = ("A setting NAME=VALUE of this site's transport, stored with the site (smtp_host=..., "
               "password_file=PATH; never a password itself). Repeatable.")


@click.group()
def site() -> None:
    """A site's own settings."""


@site.command("set")
@click.argument("database", type=DATABASE)
@click.option("--address", type=ADDRESS, help="This site's inbox (email: its IMAP mailbox, imaps://user@host/INBOX).")
@click.option("--reply-address", type=ADDRESS,
              help="Where peers send to this site when that is not its inbox (email: mailto:site@example.com).")
@click.option("--transport", type=TRANSPORT, help="The transport of this site's inbox.")
@click.option("--transport-option", "-O", "options", multiple=True, type=TransportOption(), help=OPTION_HELP)
@click.option("--unset", "unset", multiple=True, metavar="NAME", help="Forget a stored transport option. Repeatable.")
def set_(database: Path, address: str | None, reply_address: str | None, transport: str | None, options: tuple,
         unset: tuple[str, ...]) -> None:
    """Change the inbox, reply address, transport or stored transport
    options of the site in DATABASE.  `agent run` uses them; `-O` on a run
    still overrides one for that run."""
    changes = stored_options(options, unset)
    with open_site(database) as opened:
        identity = opened.identity
        spec = transport or identity.transport or "folder"
        merged = {name: value for name, value in {**opened.transport_options(), **changes}.items()
                  if value is not None}
        check_transport_settings(spec, merged, inbox=address or identity.address,
                                 send=reply_address if reply_address is not None else identity.reply_address)
        if reply_address is not None:
            changes.update(sender_options(spec, reply_address, {}) if "from_address" not in changes else {})
        opened.set_transport(address=address, reply_address=reply_address, transport=transport, options=changes)
        identity = opened.identity
        stored = opened.transport_options()
    out = console()
    out.print(f"Site {identity.name}: inbox {identity.address} ({identity.transport or 'folder'}), "
              f"peers send to {identity.send_address}", soft_wrap=True, markup=False)
    for name, value in stored.items():
        out.print(f"  {name} = {value}", soft_wrap=True, markup=False)
