"""The site database adapter: fieldsync inside a SQLite or a PostgreSQL
database.

Open and make sites with :func:`open_site` / :func:`init_site`, which give
a :class:`Site` (agent/site/interface.py): a SQLite file
(:class:`SiteDatabase`, ``agent.site.sqlite``) or a PostgreSQL database
named by a URI (``agent.site.postgres``).  Everything else here is the
values they take and return and the errors they raise; the rules both
backends keep are this package's own modules.  See
``docs/site-database.md``, "Code layout".
"""

from .apply import ApplyErrorRecord, ApplyResult, Conflict, ConflictHook, ConflictRecord, MessageChain, Resolution
from .change_rows import SchemaChangeResult
from .errors import (AlreadyASite, ApplyRefused, ConflictHookFailed, ExtractionError, IncarnationMismatch,
                     InvalidSetting, InvariantViolation, LogOffsetError, LogTruncated, NotASite, PublicationError,
                     RemoteExists, SchemaConflict, SchemaRefused, SecretInDatabase, SiteBusy, SiteDatabaseError,
                     SiteError, UnknownPublication, UnknownRemote, UnpublishableTable, UnsupportedSiteVersion,
                     WrongRole)
from .extraction import ExtractResult, RemoteKeys
from .identity import Role, SiteIdentity
from .interface import Site
from .locate import init_site, is_uri, open_site
from .publication_rules import Article, Publication, Subscription
from .reading import LoggedOperation
from .remote_rules import RemoteUser
from .sqlite.database import SiteDatabase

__all__ = [
    "Site", "SiteDatabase", "open_site", "init_site", "is_uri", "SiteIdentity", "Role", "Article", "Publication", "Subscription", "LoggedOperation",
    "RemoteUser", "ApplyResult", "Conflict", "ConflictHook", "ConflictRecord", "ApplyErrorRecord", "MessageChain",
    "Resolution",
    "ExtractResult", "RemoteKeys", "SchemaChangeResult",
    "SiteError", "AlreadyASite", "ApplyRefused", "ConflictHookFailed", "ExtractionError", "IncarnationMismatch",
    "InvalidSetting", "InvariantViolation", "LogOffsetError", "LogTruncated", "NotASite", "PublicationError",
    "RemoteExists", "SchemaConflict", "SchemaRefused", "SecretInDatabase", "SiteBusy", "SiteDatabaseError",
    "UnknownPublication", "UnknownRemote",
    "UnpublishableTable", "UnsupportedSiteVersion", "WrongRole",
]
