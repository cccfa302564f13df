"""The site database adapter: fieldsync inside a SQLite database.

Use :class:`SiteDatabase` (``SiteDatabase.init`` / ``SiteDatabase.open``);
everything else here is the values it takes and returns and the errors it
raises.  See ``docs/site-database.md``.
"""

from .apply import ApplyErrorRecord, ApplyResult, Conflict, ConflictHook, ConflictRecord, Resolution
from .database import SiteDatabase
from .errors import (
    AlreadyASite,
    ApplyRefused,
    ConflictHookFailed,
    ExtractionError,
    IncarnationMismatch,
    InvalidSetting,
    InvariantViolation,
    LogOffsetError,
    LogTruncated,
    NotASite,
    PublicationError,
    RemoteExists,
    SecretInDatabase,
    SiteBusy,
    SiteDatabaseError,
    SiteError,
    UnknownPublication,
    UnknownRemote,
    UnpublishableTable,
    UnsupportedSiteVersion,
    WrongRole,
)
from .extract import ExtractResult, RemoteKeys
from .publications import Article, Publication, Subscription
from .reading import LoggedOperation
from .remotes import RemoteUser
from .schema import Role, SiteIdentity

__all__ = [
    "SiteDatabase", "SiteIdentity", "Role", "Article", "Publication", "Subscription", "LoggedOperation",
    "RemoteUser", "ApplyResult", "Conflict", "ConflictHook", "ConflictRecord", "ApplyErrorRecord", "Resolution",
    "ExtractResult", "RemoteKeys",
    "SiteError", "AlreadyASite", "ApplyRefused", "ConflictHookFailed", "ExtractionError", "IncarnationMismatch",
    "InvalidSetting", "InvariantViolation", "LogOffsetError", "LogTruncated", "NotASite", "PublicationError",
    "RemoteExists", "SecretInDatabase", "SiteBusy", "SiteDatabaseError", "UnknownPublication", "UnknownRemote",
    "UnpublishableTable", "UnsupportedSiteVersion", "WrongRole",
]
