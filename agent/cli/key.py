"""``agent key``: print a site's public key line (for its peers), where its
secret key file is, or check that file."""

from __future__ import annotations

import stat
from pathlib import Path

import click

from ..errors import UsageError
from ._common import DATABASE, open_site


@click.command()
@click.argument("database", type=DATABASE)
@click.option("--fingerprint", "fingerprint_only", is_flag=True, help="Print only the key's fingerprint.")
@click.option("--path", "show_path", is_flag=True, help="Print where the site's secret key file is.")
@click.option("--check", is_flag=True, help="Check the secret key file (mode, owner, this site's keys).")
def key(database: Path, fingerprint_only: bool, show_path: bool, check: bool) -> None:
    """Print the public key line of the site in DATABASE.

    Redirect it to a file to hand it to a peer:
    `agent key hq.db > hq.pub`, then `agent remote add ... --public-key-file hq.pub`.
    The secret key is in DATABASE.agent/keys/site.key (`--path`); `--check`
    loads it with every check `agent run` makes and says what it found.
    """
    from ..admin import site_keys
    from ..keyfiles import key_path

    if fingerprint_only + show_path + check > 1:
        raise UsageError("--fingerprint, --path and --check exclude each other")
    with open_site(database) as site:
        if show_path:
            click.echo(key_path(database))
            return
        public = site_keys(site).public
    if check:
        path = key_path(database)
        # The load checked the owner and the mode already: say what it found.
        click.echo(f"{path}: ok: the secret key of site {public.site} (fingerprint {public.fingerprint}), "
                   f"mode {stat.S_IMODE(path.stat().st_mode):o}, owned by this user")
        return
    click.echo(public.fingerprint if fingerprint_only else public.to_line())
