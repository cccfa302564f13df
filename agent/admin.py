"""Making sites: ``agent init`` and ``agent extract`` in library form.

Rules of this file:
* A site's secret key goes to its key file (agent/keyfiles.py) before the
  site's database exists, so no site is ever without its key; the database
  gets the public key line only.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from codec.keys import SiteKeys

from .errors import AgentError
from .keyfiles import load_site_keys as site_keys, new_site_keys
from .site import Site, init_site as init_site_database
from .site.extraction import ExtractResult, Extraction, RemoteKeys


def init_site(location: str | os.PathLike[str], *, name: str, role: str, address: str | None = None,
              transport: str | None = None, home: str | os.PathLike[str] | None = None) -> Site:
    """Make the site at ``location`` (a SQLite file, or a PostgreSQL URI
    with its agent folder ``home``) with fresh keys; the secret key goes to
    ``keys/site.key`` in the agent's folder (``<file>.agent`` for a file)."""
    keys = SiteKeys.generate(name)
    with new_site_keys(location, keys, home=home):
        return init_site_database(location, name=name, role=role, home=home, address=address, transport=transport,
                                  public_key=keys.public.to_line())


def extract_sites(consolidated: Site, targets: Sequence[tuple[str, str | os.PathLike[str], dict[str, str]]]
                  ) -> Iterator[ExtractResult]:
    """:func:`extract_site` for each ``(remote, target, options)``, with new
    keys each, through ``Site.extract_many`` (a PostgreSQL consolidated
    reads each table once for all of them).  Every key file is written
    first; those of the remotes not extracted when it stops are removed."""
    for _remote, target, _options in targets:
        if Path(target).exists():
            raise AgentError(f"{target} exists already; remove it or choose another path")
    with contextlib.ExitStack() as pending:
        extractions, key_files = [], []
        for remote, target, options in targets:
            keys = SiteKeys.generate(remote)
            key_file = pending.enter_context(contextlib.ExitStack())
            key_file.enter_context(new_site_keys(target, keys))
            key_files.append(key_file)
            extractions.append(Extraction(remote, target, RemoteKeys(public_key=keys.public.to_line()), options))
        for key_file, result in zip(key_files, consolidated.extract_many(extractions)):
            key_file.close()  # its copy is in place: the key file stays
            yield result


# Options that say who a site is or where its own secrets are: a remote
# does not inherit the consolidated's.
_OWN_OPTION_WORDS = ("from_address", "username", "password", "passphrase", "key_file")


def inherited_options(consolidated: Site) -> dict[str, str]:
    """The consolidated's stored transport options that hold for its remotes
    too (the servers, ports, TLS trust, timeouts): all but who it is and
    where its secrets are."""
    return {name: value for name, value in consolidated.transport_options().items()
            if not any(word in name for word in _OWN_OPTION_WORDS)}


def extract_site(consolidated: Site, remote: str, target: str | os.PathLike[str], *,
                 keys: SiteKeys | None = None, options: dict[str, str] | None = None) -> ExtractResult:
    """Create ``remote``'s database at ``target`` and its key file at
    ``<target>.agent/keys/site.key``; the consolidated learns the remote's
    public key in the same step.  ``keys`` keeps the remote's keys (a new
    copy for the same device); by default it gets new ones.  The copy's
    transport options are ``options`` (default: :func:`inherited_options`)."""
    if Path(target).exists():
        raise AgentError(f"{target} exists already; remove it or choose another path")
    if keys is None:
        keys = SiteKeys.generate(remote)
    elif keys.site != remote:
        raise AgentError(f"the keys given for {remote} are the keys of site {keys.site}")
    with new_site_keys(target, keys):
        return consolidated.extract(remote, target, keys=RemoteKeys(public_key=keys.public.to_line()),
                                    options=inherited_options(consolidated) if options is None else options)
