"""Noticing that a site database was restored from an old copy.

Rules of this file:
* Every agent run counts a *generation*, kept both in the site database and
  in the agent's own folder beside it.  A database whose generation is
  behind the folder's was put back from an older copy: its offsets no longer
  match what its peers saw, so the site takes a new incarnation id.  Its
  peers then stop its stream with a clear error instead of mis-reading
  offsets (SQL Remote's known failure after a restore).
* A database copied elsewhere together with its agent folder cannot be told
  from the original; restore both only together with a new extraction.
"""

from __future__ import annotations

import json
from pathlib import Path

from codec.atomic import write_file_atomically

from .errors import AgentError
from .site import Site, SiteError


def check_restored(db: Site, directory: Path) -> bytes | None:
    """Count this run; return the old incarnation id if the database was
    restored (it then has a new one), else None."""
    marker_path = directory / "state" / "site.json"
    try:
        marker = json.loads(marker_path.read_text())
        marker_generation = int(marker["generation"])
        marker_incarnation = bytes.fromhex(marker["incarnation"])
    except (OSError, ValueError, KeyError, TypeError):
        marker_generation, marker_incarnation = 0, None
    try:
        generation, incarnation, renewed = db.count_run(marker_generation, marker_incarnation)
    except SiteError as error:
        raise AgentError(str(error)) from None
    write_file_atomically(marker_path, json.dumps({"incarnation": incarnation.hex(),
                                                   "generation": generation}).encode())
    return renewed
