"""The files the agent keeps about each pair beside the site database, in
``<db>.agent/state/`` (agent.pairs is their one user):

* ``PEER.json``: the agent's bookkeeping (the most the peer said it sent,
  gap patience), tagged with the stream it belongs to;
* ``PEER.incarnations.json``: the incarnations of the peer's copies that
  were extracted again, as this agent saw them replaced;
* ``PEER.poll``: an empty file while a receive poll may do something for
  the pair though nothing of the peer is queued (``PairState.awaits_poll``:
  a gap waited out): a batch run loads the pairs it names (agent.working_set).

Rules of this file:
* Blocking file I/O; every file is written whole (atomically), and only
  when it says something new.
* Bookkeeping, not replicated state: a file that cannot be read, or that
  belongs to another stream, counts as none.
* The folder is listed once per load of every pair (:meth:`PairFiles.list`),
  not once per peer; a load of a few pairs looks for their files instead.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from codec.atomic import write_file_atomically


class PairFiles:
    """The pair files in one agent's state folder."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._files: set[str] | None = None  # None: not listed, look for each file

    def list(self) -> None:
        """Read which files there are (before a load asks for many)."""
        try:
            self._files = set(os.listdir(self.directory))
        except FileNotFoundError:
            self._files = set()

    def unlist(self) -> None:
        """Forget the listing (before a load of a few pairs, which looks for their files)."""
        self._files = None

    def _absent(self, name: str) -> bool:
        """Known not to exist (from the listing); False: there, or not listed."""
        return self._files is not None and name not in self._files

    def polling(self) -> set[str]:
        """The peers with a ``PEER.poll`` file."""
        try:
            return {name[:-5] for name in os.listdir(self.directory) if name.endswith(".poll")}
        except FileNotFoundError:
            return set()

    def set_polling(self, peer: str, polling: bool) -> None:
        """Make or remove ``PEER.poll`` (durable: the folder is synced)."""
        path = self.directory / f"{peer}.poll"
        if polling:
            write_file_atomically(path, b"")
        else:
            path.unlink(missing_ok=True)

    def extras(self, peer: str, stream: list, fields: Iterable[str]) -> dict[str, int]:
        """The bookkeeping of ``peer``, if it belongs to the stream the
        remote-user row describes now (an extraction starts a new stream,
        and then the old bookkeeping is forgotten)."""
        if self._absent(f"{peer}.json"):
            return {}
        try:
            data = json.loads((self.directory / f"{peer}.json").read_text())
            if data.get("stream") != stream:
                return {}
            return {name: int(data.get(name, 0)) for name in fields}
        except (OSError, ValueError, AttributeError):  # FileNotFoundError too: none
            return {}

    def save_extras(self, peer: str, extras: dict[str, Any]) -> None:
        write_file_atomically(self.directory / f"{peer}.json", json.dumps(extras).encode())

    def superseded(self, peer: str, current: bytes | None, replaced: frozenset[bytes]) -> frozenset[bytes]:
        """Incarnations ``peer`` had before it was extracted again.

        Extraction records the copy it replaces in the database
        (``replaced``); the agent folder also keeps the ones it has seen
        replaced in the remote-user row (extractions made before the
        database recorded them).
        """
        name = f"{peer}.incarnations.json"
        if self._absent(name) and current is None:
            return replaced  # nothing seen, nothing to remember (most peers of a new fleet)
        path = self.directory / name
        try:
            if self._absent(name):
                raise FileNotFoundError(path)
            known = json.loads(path.read_text())
            seen = [bytes.fromhex(value) for value in known.get("seen", [])]
            last = bytes.fromhex(known["current"]) if known.get("current") else None
        except FileNotFoundError:
            known, seen, last = None, [], None
        except (OSError, ValueError, AttributeError, TypeError):
            known, seen, last = {}, [], None
        if last is not None and last != current and last not in seen:
            seen.append(last)
        record = {"current": current.hex() if current else None, "seen": [value.hex() for value in seen]}
        # Written when it says something new: a run's start costs no write per peer.
        if (current is not None or seen) and record != known:
            write_file_atomically(path, json.dumps(record).encode())
        return frozenset(value for value in (*seen, *replaced) if value != current)
