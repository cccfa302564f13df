"""Files at a site's inbox that the agent leaves where they are.

Rules of this file:
* A file is left when it is not this site's to read (a name that is no
  message name, or a message for another site) or when the transport
  refuses to read it (over the size limit, a hard link, not a regular
  file).  Left files are never read, never removed, never quarantined.
* Each is warned about once, not at every run: the names warned about, with
  their reasons, are kept in ``<db>.agent/state/left.json``.  A name is
  warned about again only when its reason changes, or, for a file the
  transport refused, when another file takes the name (the transport's
  identity of the file, e.g. inode, size and mtime, is remembered with it).
* What is remembered is bounded: after each receive it is only what that
  receive met (a file gone from the inbox is forgotten), and never more than
  ``REMEMBERED`` names.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from codec.atomic import write_file_atomically

log = logging.getLogger("fieldsync.agent")

REMEMBERED = 10_000


class LeftFiles:
    """Blocking only in :meth:`load` and :meth:`end_receive` (call those in a thread)."""

    def __init__(self, path: Path, inbox: str | None) -> None:
        self.path = path
        self.inbox = inbox
        self._warned: dict[str, str] = {}
        self._met: dict[str, str] = {}
        self._loaded = False

    def load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        try:
            record = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return
        if isinstance(record, dict) and record.get("inbox") == self.inbox and isinstance(record.get("left"), dict):
            self._warned = {str(name): str(reason) for name, reason in record["left"].items()}

    def leave(self, name: str, reason: str, identity: str = "") -> bool:
        """Note a file left this receive; True when it is new (not yet warned about).

        ``identity`` tells this file from a later one of the same name.
        """
        if name in self._met:
            return False
        remembered = f"{reason} [{identity}]" if identity else reason
        if len(self._met) < REMEMBERED:
            self._met[name] = remembered
        if self._warned.get(name) == remembered:
            return False
        log.warning("left %r in the inbox %s: %s; it is not read or removed (warned once; `agent inbox` lists it)",
                    name, self.inbox, reason)
        return True

    @property
    def met(self) -> int:
        """Files left in this receive."""
        return len(self._met)

    def end_receive(self) -> None:
        """Remember what this receive met, and only that."""
        if self._met != self._warned:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_file_atomically(self.path, json.dumps({"inbox": self.inbox, "left": self._met}).encode(),
                                  mode=0o600)
            self._warned = self._met
        self._met = {}
