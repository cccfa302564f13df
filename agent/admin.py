"""Making sites: ``agent init`` and ``agent extract`` in library form."""

from __future__ import annotations

import os
from pathlib import Path

from codec.keys import SiteKeys

from .errors import AgentError
from .site import SiteDatabase
from .site.extract import ExtractResult, RemoteKeys


def init_site(path: str | os.PathLike[str], *, name: str, role: str, address: str | None = None,
              transport: str | None = None) -> SiteDatabase:
    """Turn the SQLite file at ``path`` into a site with fresh keys.

    The secret key file's text is kept in the site database itself, so the
    database file is the whole identity of a site (extraction hands a remote
    its keys the same way); protect it like a key file.
    """
    keys = SiteKeys.generate(name)
    return SiteDatabase.init(path, name=name, role=role, address=address, transport=transport,
                             public_key=keys.public.to_line(), secret=keys.to_text().encode("ascii"))


def site_keys(site: SiteDatabase) -> SiteKeys:
    secret = site.identity.secret
    if secret is None:
        raise AgentError(f"site {site.identity.name} has no keys (was it made by `agent init`?)")
    return SiteKeys.from_text(secret.decode("ascii"), f"{site.path} keys")


def extract_site(consolidated: SiteDatabase, remote: str, target: str | os.PathLike[str]) -> ExtractResult:
    """Create ``remote``'s database at ``target`` with new keys; the
    consolidated learns the remote's public key in the same step."""
    if Path(target).exists():
        raise AgentError(f"{target} exists already; remove it or choose another path")
    keys = SiteKeys.generate(remote)
    return consolidated.extract(remote, target, keys=RemoteKeys(public_key=keys.public.to_line(),
                                                               secret=keys.to_text().encode("ascii")))
