"""The site database's error tree.

Every failure the site adapter reports is one of these; any other exception
escaping :mod:`agent.site` is a bug.  Messages say what went wrong, with
what, and what to do next, on one line.
"""

from __future__ import annotations


class SiteError(Exception):
    """Base of every error raised by :mod:`agent.site`."""


class InvalidSetting(SiteError, ValueError):
    """A value handed in by local code breaks the rules (bad site name,
    unknown role, a schedule with both SEND EVERY and SEND AT, ...)."""


class NotASite(SiteError):
    """The file is not a fieldsync site database (never initialised, or not
    SQLite at all)."""


class AlreadyASite(SiteError):
    """``init`` was asked to turn a database that already is a site into one."""


class UnsupportedSiteVersion(SiteError):
    """The site database was written by a newer fieldsync with another layout."""


class SecretInDatabase(SiteError):
    """A database of an older layout still holds the site's secret key, and
    it was opened without a place to move the key to."""


class WrongRole(SiteError):
    """The operation is meant for the other role (e.g. extraction at a remote)."""


class UnpublishableTable(SiteError):
    """A table cannot be published: it does not exist, has no primary key,
    is a view or virtual table, or belongs to fieldsync or SQLite."""


class PublicationError(SiteError):
    """A publication, article or subscription request is inconsistent."""


class UnknownPublication(PublicationError):
    """No publication of that name exists."""


class UnknownRemote(SiteError):
    """No remote-user row of that name exists."""


class RemoteExists(SiteError):
    """A remote-user row of that name exists already."""


class RemoteRejected(SiteError):
    """A bulk add refused the remote at ``index`` of its list (``reason``,
    the error adding it alone would raise); nothing was added."""

    def __init__(self, index: int, reason: SiteError) -> None:
        super().__init__(str(reason))
        self.index = index
        self.reason = reason


class InvariantViolation(SiteError):
    """An update of the remote-user table would break a protocol invariant
    (``confirm_sent <= log_sent <= log end``, or a counter going backwards)."""


class LogOffsetError(SiteError):
    """An offset handed to the log reader is not a commit boundary of this log."""


class LogTruncated(LogOffsetError):
    """The log was truncated past the requested start offset; the entries
    are gone (they were confirmed by every peer)."""


class ApplyRefused(SiteError):
    """A batch from a peer cannot be applied as a whole: ``log_received``
    would go backwards, or its transactions are out of order.  Nothing of
    the batch was applied."""


class IncarnationMismatch(SiteError):
    """The peer's incarnation id differs from the one recorded for it: the
    peer database was rebuilt or restored.  Offsets from it cannot be trusted."""


class ConflictHookFailed(SiteError):
    """A conflict hook raised or returned something that is not a resolution.
    The whole batch was rolled back."""


class ExtractionError(SiteError):
    """A remote database could not be extracted."""


class SiteBusy(SiteError):
    """The database stayed locked by another connection for longer than the
    busy timeout."""


class SiteDatabaseError(SiteError):
    """SQLite reported an error the adapter does not expect (I/O error, full
    disk, corrupt file).  The original error is the ``__cause__``."""


class SchemaRefused(SiteError):
    """``agent schema apply`` refused a statement, or it failed: nothing of
    the change was made (docs/site-database.md, "Schema changes")."""


class SchemaConflict(SiteError):
    """A schema change from the consolidated does not apply to this site's
    tables as they are: nothing of its message was applied, and the stream
    waits before it until the tables are mended.  ``commit``: the change's
    offset in the peer's log; ``table``: the table concerned."""

    def __init__(self, message: str, *, commit: int = 0, table: str | None = None) -> None:
        super().__init__(message)
        self.commit = commit
        self.table = table
