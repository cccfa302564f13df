"""A site's secret key file (docs/cli.md, "Where a site's secret key lives").

Rules of this file:
* A site's secret key lives in ``keys/site.key`` of the agent's own folder
  (``<db>.agent`` beside a SQLite file, the ``--home`` folder of a
  PostgreSQL site), never in the site database: every user an application lets
  read the database could read it there.  The file is 0600 in a 0700
  folder, written whole, and never written over another key file.
* Every load checks the file as OpenSSH checks a private key (group and
  others have no access, the user running the agent owns it) and that it
  holds the keys of the database beside it.  Each refusal is one line
  naming the file and the fix.
* A key file is deleted only by the step that made it, when making its site
  failed and no database names its public key, or by a later step making a
  site at the same SQLite file when the step that made it was killed before
  its database was there: the maker holds a claim beside the key file
  (``site.key.making``, codec.fsutil.claim) from before it writes the key
  until its site is made, and a claim no process holds, with no database
  naming the key, was left by a killed step.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
from pathlib import Path
from typing import Iterator

from codec.errors import InvalidValue, KeyFileError
from codec.fsutil import abandoned, claim
from codec.keys import PublicKeys, SiteKeys

from .errors import AgentError
from .site.interface import Site
from .site.locate import is_uri, open_site, site_home

log = logging.getLogger("fieldsync.agent")

KEY_FOLDER = "keys"
KEY_FILE = "site.key"
# Beside the key file while its site is being made (the rules above).
CLAIM_FILE = "site.key.making"


class SiteKeyError(AgentError):
    """A site's secret key file is missing, unsafe, unreadable, in the way,
    or holds another site's keys."""


def agent_directory(database: str | os.PathLike[str]) -> Path:
    """Where the agent keeps a site's key, queues, quarantine and bookkeeping:
    ``<db>.agent`` beside a SQLite file, so the two move together; the
    ``--home`` folder a PostgreSQL site records (read from its database)."""
    return site_home(database)


def key_file_in(home: str | os.PathLike[str]) -> Path:
    """The secret key file in the agent's folder ``home``."""
    return Path(home) / KEY_FOLDER / KEY_FILE


def key_path(database: str | os.PathLike[str]) -> Path:
    """Where the secret key of the site in ``database`` lives."""
    return key_file_in(agent_directory(database))


def open_site_database(database: str | os.PathLike[str]) -> Site:
    """Open a site as the agent does: an older SQLite one that still holds
    its secret key has it moved to the key file first (:func:`migrate_secret`)."""
    return open_site(database) if is_uri(database) else open_site(database, store_secret=migrate_secret)


def load_site_keys(site: Site) -> SiteKeys:
    """The keys of ``site`` from its key file, checked (see the rules above)."""
    path = key_file_in(site.home)
    name = site.identity.name
    if not os.path.lexists(path):
        raise SiteKeyError(f"{path}: no secret key file for site {name}; it is made by `agent init` or `agent "
                           f"extract` and moves with the database: bring back the folder {site.home}")
    keys = _load(path)
    if keys.site != name:
        raise SiteKeyError(f"{path} holds the keys of site {keys.site}, but {site.path} is site {name}; "
                           f"put back {name}'s key file")
    recorded = site.identity.public_key
    if recorded is not None and recorded.strip() != keys.public.to_line():
        raise SiteKeyError(f"{path} holds other keys ({keys.public.fingerprint}) than {site.path} records "
                           f"({_fingerprint(recorded)}): it belongs to another copy of site {name}; put back "
                           "the key file that came with this database")
    claim_path = path.with_name(CLAIM_FILE)
    if recorded is not None and abandoned(claim_path):
        # Its maker was killed after the site was made, before it let go of
        # the claim: the key is this site's, never one to take back.
        with contextlib.suppress(OSError):
            os.remove(claim_path)
    return keys


def save_site_keys(database: str | os.PathLike[str], keys: SiteKeys, *,
                   home: str | os.PathLike[str] | None = None) -> Path:
    """Write ``keys`` as the key file of the site in ``database`` (in
    ``home`` when given: a PostgreSQL site being made), never over an
    existing one; return its path."""
    return _write(_key_folder(database, home), keys)


def _key_file(database: str | os.PathLike[str], home: str | os.PathLike[str] | None) -> Path:
    """The key file of the site at ``database``, or in ``home`` when given."""
    return key_path(database) if home is None else key_file_in(home)


def _key_folder(database: str | os.PathLike[str], home: str | os.PathLike[str] | None) -> Path:
    """The key file's path, its folder made (0700) if need be."""
    path = _key_file(database, home)
    folder = path.parent
    try:
        if home is not None:  # the agent's own folder of a PostgreSQL site: its files only
            Path(home).mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(home, 0o700)
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise  # a file in the way: the agent's errors name it
    except OSError as error:
        existing = next(parent for parent in folder.parents if parent.exists())
        raise SiteKeyError(f"cannot write the key file of {database}: the folder {existing} takes no new file "
                           f"({error.strerror or error})") from None
    os.chmod(folder, 0o700)  # a folder made before, by hand or wider, is closed again
    return path


def _write(path: Path, keys: SiteKeys) -> Path:
    try:
        return keys.save(path, replace=False)
    except FileExistsError:
        raise _in_the_way(path) from None


def check_no_key_file(database: str | os.PathLike[str], *, home: str | os.PathLike[str] | None = None) -> list[Path]:
    """Refuse, before making a site at ``database`` (with its folder
    ``home``), a key file in its way; one that a killed step left (the
    rules above) is removed first.  Returns what was removed."""
    removed = remove_abandoned_key(database, home=home)
    path = _key_file(database, home)
    if os.path.lexists(path):
        raise _in_the_way(path)
    return removed


def remove_abandoned_key(database: str | os.PathLike[str], *, home: str | os.PathLike[str] | None = None
                         ) -> list[Path]:
    """Remove the key file (and its claim) that a step making a site at
    ``database`` left when it was killed before the site was made: its
    claim is held by no process, and no database names the key.  The key
    of a PostgreSQL site (``home``, or a URI) is kept: whether its database
    names it cannot be told from here.  Returns the files removed."""
    path = _key_file(database, home)
    claim_path = path.with_name(CLAIM_FILE)
    if not abandoned(claim_path):
        return []
    removed = []
    if os.path.lexists(path):
        if home is not None or is_uri(database) or _key_named_by(database, path):
            return []
        os.remove(path)
        removed.append(path)
    os.remove(claim_path)
    removed.append(claim_path)
    if home is None:
        _remove_empty_folders(path)
    return removed


def _key_named_by(database: str | os.PathLike[str], path: Path) -> bool:
    """Whether the file at ``database`` names the keys in ``path`` (True
    when they cannot be read: keep a key in doubt)."""
    try:
        return _named_by(database, SiteKeys.load(path).public)
    except KeyFileError:
        return True


def _remove_empty_folders(path: Path) -> None:
    for folder in (path.parent, path.parent.parent):  # made for it, unless something else is in them
        with contextlib.suppress(OSError):
            folder.rmdir()


def migrate_secret(database: str, secret: bytes) -> None:
    """Move the secret key text an older site database holds to its key file
    (the ``store_secret`` of the SQLite backend's ``open``).  A key file holding
    the same keys is taken as an earlier move that stopped before the
    database forgot them; one holding other keys is never replaced."""
    try:
        keys = SiteKeys.from_text(secret.decode("ascii"), f"{database}: the secret key kept in the database")
    except (UnicodeDecodeError, KeyFileError) as error:
        raise SiteKeyError(f"{database}: the secret key kept in the database cannot be read ({error}); restore the "
                           "database from a backup or extract the site again") from None
    path = key_path(database)
    if os.path.lexists(path):
        if _load(path).to_text() != keys.to_text():
            raise SiteKeyError(f"{path} holds other keys than the secret key kept in {database}; move the key file "
                               "aside (or put back this database's own) and open the site again")
        return
    save_site_keys(database, keys)
    log.info("%s: the site's secret key moved out of the database into %s", database, path)


@contextlib.contextmanager
def new_site_keys(database: str | os.PathLike[str], keys: SiteKeys, *,
                  home: str | os.PathLike[str] | None = None) -> Iterator[Path]:
    """The key file of a site about to be made at ``database`` (in ``home``
    when given), written before the site exists (a site without its key
    could not run), claimed until the site is made (the rules above).
    When making the site fails, the key file is deleted again, unless a
    database there names its public key after all."""
    for left in remove_abandoned_key(database, home=home):
        log.info("removed %s, left by an init or extract that did not finish", left)
    path = _key_folder(database, home)
    claim_path = path.with_name(CLAIM_FILE)
    if os.path.lexists(path):
        raise _in_the_way(path)
    try:
        held = claim(claim_path)
    except FileExistsError:
        raise SiteKeyError(f"{claim_path}: another process is making a site with this key folder; let it finish, "
                           f"or move the folder {path.parent.parent} aside") from None
    try:
        try:
            _write(path, keys)
            yield path
        except BaseException:
            if is_uri(database) or not _named_by(database, keys.public):
                with contextlib.suppress(OSError):
                    os.remove(path)
            with contextlib.suppress(OSError):
                os.remove(claim_path)
            _remove_empty_folders(path)
            raise
        os.remove(claim_path)  # the site is made: its key is its own
    finally:
        os.close(held)


def copy_site_keys(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> Path:
    """Give the database copied from ``source`` to ``target`` the same key file."""
    return save_site_keys(target, _load(key_path(source)))


def _load(path: Path) -> SiteKeys:
    try:
        return SiteKeys.load(path)
    except KeyFileError as error:
        raise SiteKeyError(str(error)) from None


def _in_the_way(path: Path) -> SiteKeyError:
    return SiteKeyError(f"{path} exists already (a site's secret key whose database is gone, or an interrupted "
                        f"init or extract); move the folder {path.parent.parent} aside or choose another path")


def _fingerprint(line: str) -> str:
    try:
        return PublicKeys.from_line(line).fingerprint
    except InvalidValue:
        return "an unreadable public key"


def _named_by(database: str | os.PathLike[str], public: PublicKeys) -> bool:
    """Whether the file at ``database`` is a site whose public key is
    ``public``; True when that cannot be told (keep a key in doubt)."""
    if not os.path.exists(database):
        return False
    try:
        with contextlib.closing(sqlite3.connect(f"{Path(database).absolute().as_uri()}?mode=ro", uri=True)) as conn:
            row = conn.execute("SELECT public_key FROM fieldsync_site WHERE id = 1").fetchone()
    except sqlite3.OperationalError as error:
        return "no such table" not in str(error)  # a busy or unreadable file may still be the site
    except sqlite3.DatabaseError:
        return False  # not SQLite at all
    return row is not None and row[0] == public.to_line()
