"""``agent init``: make a SQLite database, or a PostgreSQL one, a site with fresh keys."""

from __future__ import annotations

from pathlib import Path

import click

from ..errors import AgentError
from ._common import (ADDRESS, DATABASE, SITE_NAME, TRANSPORT, TransportOption, check_parent_directory,
                      check_stored_address, check_transport_settings, console, incarnation_text, sender_options, stored_options)
from .site import OPTION_HELP


@click.command()
@click.argument("database", type=DATABASE)
@click.option("--name", type=SITE_NAME, required=True, help="The site's name (letters, digits, '_' or '-').")
@click.option("--role", required=True, type=click.Choice(["consolidated", "remote"]),
              help="consolidated: the authoritative site; remote: a field site.")
@click.option("--address", type=ADDRESS, required=True, help="This site's inbox on its transport (folder: a directory).")
@click.option("--transport", type=TRANSPORT, default="folder", show_default=True, help="The transport of this site's inbox.")
@click.option("--reply-address", type=ADDRESS,
              help="Where peers send to this site when that is not its inbox (email: mailto:site@example.com).")
@click.option("--transport-option", "-O", "options", multiple=True, type=TransportOption(), help=OPTION_HELP)
@click.option("--home", type=click.Path(file_okay=False, path_type=Path),
              help="The agent's own folder (keys, spool, state) of a PostgreSQL site; made 0700 and recorded "
                   "in the database. A SQLite file's is always DATABASE.agent.")
def init(database: Path | str, name: str, role: str, address: str, transport: str, reply_address: str | None,
         options: tuple, home: Path | None) -> None:
    """Turn DATABASE into a site: a new or existing SQLite file, or a
    PostgreSQL database named by a URI (postgresql://app@host/sales; the
    password comes from ~/.pgpass, never the URI), which needs --home.

    Creates the site's tables, a new incarnation id and a new signing and
    sealing key pair, and prints the public key line the site's peers need
    (`agent remote add ... --public-key`).  The secret key goes to
    keys/site.key (mode 0600) in the agent's folder (DATABASE.agent, or
    --home), never into DATABASE, whose mode stays as it was.
    """
    from transports.registry import check_transport_spec

    from ..admin import init_site, site_keys
    from ..keyfiles import key_file_in

    check_transport_spec(transport)
    check_stored_address(transport, address)
    settings = {name: value for name, value in stored_options(options).items() if value is not None}
    check_transport_settings(transport, settings, inbox=address, send=reply_address)
    settings.update(sender_options(transport, reply_address, settings))
    if isinstance(database, Path):
        if home is not None:
            raise AgentError(f"--home is for a PostgreSQL site; the agent's folder of {database} is always "
                             f"{database}.agent")
        check_parent_directory(database)
        if database.is_dir():
            raise AgentError(f"{database} is a directory; give the path of a database file")
    elif home is None:
        raise AgentError("a PostgreSQL site needs a folder for the agent's own files (keys, spool, state): "
                         "give --home DIR")
    site = init_site(database, name=name, role=role, address=address, transport=transport,
                     home=None if home is None else home.absolute())
    try:
        if reply_address is not None or settings:
            site.set_transport(reply_address=reply_address, options=settings)
        public = site_keys(site).public
        incarnation = incarnation_text(site.identity.incarnation)
        key_file = key_file_in(site.home)
    finally:
        site.close()
    out = console()
    out.print(f"Created {role} site {name} in {database} (incarnation {incarnation}).", soft_wrap=True)
    out.print(f"Inbox: {address} ({transport})", soft_wrap=True)
    if reply_address is not None:
        out.print(f"Peers send to: {reply_address}", soft_wrap=True)
    out.print(f"Secret key: {key_file} (keep it with the database, readable by this user only)",
              soft_wrap=True, markup=False)
    if transport == "folder" and not Path(address).is_dir():
        out.print(f"Note: the folder {address} does not exist yet; create it (or mount it) before `agent run`.",
                  soft_wrap=True)
    out.print("Public key (give this line to the sites that exchange messages with this one):")
    out.print(public.to_line(), soft_wrap=True, markup=False)
    out.print(f"Fingerprint: {public.fingerprint}")
