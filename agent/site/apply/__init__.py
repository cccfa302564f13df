"""Applying a peer's transactions (docs/site-database.md): one module per
rule (statements, keymoves, conflicts, unconfirmed, pending, followers), each an
object or function the driver (:class:`Applier`) holds and calls in turn,
over the values of batch; this package exports what the rest of the site
adapter uses.
"""

from .batch import ApplyResult, Conflict, ConflictHook, Resolution
from .conflicts import ConflictRecord, check_policy, list_conflicts, set_hook, set_policy_locked
from .driver import Applier
from .statements import ApplyErrorRecord, list_apply_errors

__all__ = ["Applier", "ApplyErrorRecord", "ApplyResult", "Conflict", "ConflictHook", "ConflictRecord", "Resolution",
           "check_policy", "list_apply_errors", "list_conflicts", "set_hook", "set_policy_locked"]
