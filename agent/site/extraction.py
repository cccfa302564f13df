"""Extraction (SQL Remote's dbxtract), whatever the consolidated: what a
caller asks for and is told, and the rules of switching a remote over to
its new copy.

Rules of this file:
* A remote's copy is always a SQLite file: agent.site.sqlite.extract makes
  it from a SQLite consolidated or, through the consolidated's side
  (agent.site.postgres.extract), from a PostgreSQL one.
* Pure: no database.  :class:`SwitchOver` says what the consolidated's row
  of the remote becomes, and when the switch is refused; each backend
  writes it in its own transaction.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import ExtractionError, InvalidSetting
from .remote_rules import RemoteUser

#: Rows copied into a remote's file per statement.
COPY_CHUNK = 5000
#: Up to this many SUBSCRIBE BY values, the copy asks the consolidated for
#: the rows that may match (IN); with more it reads the table and tests
#: every row.
PREFILTER_VALUES = 500


@dataclass(frozen=True, slots=True)
class RemoteKeys:
    """The new remote's public key (made by the codec), as the text stored in
    both remote-user tables and in the remote's own site row.  Its secret
    key never comes here: the agent keeps it in a file of its own."""

    public_key: str | None = None

    def __post_init__(self) -> None:
        if self.public_key is not None and type(self.public_key) is not str:
            raise InvalidSetting("a public key is stored as text")


KeySource = RemoteKeys | Callable[[str], RemoteKeys] | None


@dataclass(frozen=True, slots=True)
class SwitchOver:
    """The consolidated's row of ``remote`` moving over to its new copy:
    its stream starts at ``offset`` with new epochs, the copy's
    incarnation and public key."""

    site: str
    remote: str
    before: RemoteUser  # the row as it was at the extraction point
    offset: int
    incarnation: bytes
    public_key: str | None

    def check(self, current: RemoteUser, floor: int) -> None:
        """Refuse when the stream moved on meanwhile, or the log was
        truncated past ``offset``."""
        if (current.resend_count, current.rereceive_count) != (self.before.resend_count,
                                                                 self.before.rereceive_count):
            raise ExtractionError(
                f"{self.remote!r} asked for or was asked for a resend while it was extracted (an agent runs for "
                f"{self.site} and exchanged messages with it); nothing was changed: extract again")
        if floor > self.offset:
            raise ExtractionError(
                f"the log was truncated to {floor}, past the extraction point {self.offset}, while {self.remote!r} "
                "was extracted (its current copy confirmed that far); nothing was changed: extract again")

    @property
    def columns(self) -> dict[str, Any]:
        """The remote-user columns the row gets (its public key kept when the copy brings none)."""
        offset = self.offset
        return {"log_send": offset, "log_sent": offset, "confirm_sent": offset,
                "resend_count": self.before.resend_count + 1, "log_received": 0, "confirm_received": 0,
                "rereceive_count": self.before.rereceive_count + 1, "send_count": 0, "last_sent_at": None,
                "receive_count": 0, "last_received_at": None, "heard_at": None, "peer_incarnation": self.incarnation,
                "data_sent_at": None, "peer_confirmed": 0, "probes": 0, "confirm_owed": False, "last_error": None,
                "last_error_at": None, "peer_schema_version": None,
                **({} if self.public_key is None else {"public_key": self.public_key})}


@dataclass(frozen=True, slots=True)
class ExtractResult:
    remote: str
    path: str
    offset: int                 # the consolidated's log offset the remote holds everything up to
    incarnation: bytes          # the new remote's incarnation id
    rows: Mapping[str, int]     # rows copied per table
    # Temporary files that extractions which did not finish (killed) left in
    # the target's folder, removed before this one (codec.fsutil.claim_temporary).
    removed: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Extraction:
    """One remote to extract: its name, its new file, its keys (as
    ``extract``'s ``keys``) and its transport options."""

    remote: str
    path: str | os.PathLike[str]
    keys: RemoteKeys | None = None
    options: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        if type(self.remote) is not str or not self.remote:
            raise InvalidSetting("an extraction names its remote")
        if self.keys is not None and not isinstance(self.keys, RemoteKeys):
            raise InvalidSetting(f"remote keys must be RemoteKeys, got {type(self.keys).__name__}")
