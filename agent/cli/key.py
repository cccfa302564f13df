"""``agent key``: print a site's public key line (for its peers)."""

from __future__ import annotations

from pathlib import Path

import click

from ._common import DATABASE, open_site


@click.command()
@click.argument("database", type=DATABASE)
@click.option("--fingerprint", "fingerprint_only", is_flag=True, help="Print only the key's fingerprint.")
def key(database: Path, fingerprint_only: bool) -> None:
    """Print the public key line of the site in DATABASE.

    Redirect it to a file to hand it to a peer:
    `agent key hq.db > hq.pub`, then `agent remote add ... --public-key-file hq.pub`.
    """
    from ..admin import site_keys

    with open_site(database) as site:
        public = site_keys(site).public
    click.echo(public.fingerprint if fingerprint_only else public.to_line())
