"""The site database adapter: fieldsync inside a SQLite database.

Open and make sites with :func:`open_site` / :func:`init_site`, which give
a :class:`Site` (agent/site/interface.py): a SQLite file
(:class:`SiteDatabase`) or a PostgreSQL database named by a URI
(``agent.site.postgres``).  Everything else here is the values they take
and return and the errors they raise.  See ``docs/site-database.md``.
"""

from .apply import ApplyErrorRecord, ApplyResult, Conflict, ConflictHook, ConflictRecord, Resolution
from .changes import SchemaChangeResult
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
    SchemaConflict,
    SchemaRefused,
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
from .interface import Site
from .locate import init_site, is_uri, open_site
from .publications import Article, Publication, Subscription
from .reading import LoggedOperation
from .remotes import RemoteUser
from .schema import Role, SiteIdentity

__all__ = [
    "Site", "SiteDatabase", "open_site", "init_site", "is_uri", "SiteIdentity", "Role", "Article", "Publication", "Subscription", "LoggedOperation",
    "RemoteUser", "ApplyResult", "Conflict", "ConflictHook", "ConflictRecord", "ApplyErrorRecord", "Resolution",
    "ExtractResult", "RemoteKeys", "SchemaChangeResult",
    "SiteError", "AlreadyASite", "ApplyRefused", "ConflictHookFailed", "ExtractionError", "IncarnationMismatch",
    "InvalidSetting", "InvariantViolation", "LogOffsetError", "LogTruncated", "NotASite", "PublicationError",
    "RemoteExists", "SchemaConflict", "SchemaRefused", "SecretInDatabase", "SiteBusy", "SiteDatabaseError",
    "UnknownPublication", "UnknownRemote",
    "UnpublishableTable", "UnsupportedSiteVersion", "WrongRole",
]
