"""Applying a peer's transactions (docs/site-database.md): the rules both
backends apply by.  ``batch`` holds the values one apply works with,
``checks`` whether a batch may be applied, ``conflicts``, ``keymoves`` and
``unconfirmed`` the decisions of their rules, ``records`` what an apply
error records, ``chain`` consecutive messages in one transaction.  Each backend's driver does its own SQL around them:
agent/site/sqlite/apply (a SQLite site, consolidated or remote) and
agent/site/postgres/apply (a PostgreSQL consolidated).  This package
exports the values the site interface takes and returns.
"""

from .batch import ApplyResult, Conflict, ConflictHook, Resolution
from .chain import MessageChain
from .conflicts import ConflictRecord, check_policy, set_hook
from .records import ApplyErrorRecord

__all__ = ["ApplyErrorRecord", "ApplyResult", "Conflict", "ConflictHook", "ConflictRecord", "MessageChain",
           "Resolution", "check_policy", "set_hook"]
