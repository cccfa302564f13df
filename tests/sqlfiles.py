"""Opening a site's SQLite file the way an application would, in tests.

On Python 3.11 a ``sqlite3.Connection`` sits in a reference cycle with its
statement cache, so one that is not closed lives on until the cycle
collector runs; a site in WAL mode then checkpoints into its file at that
moment, under some later step of the test.  ``with sqlite3.connect(p)``
only commits, it does not close: use :func:`connected`.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
from pathlib import Path
from typing import Any, Iterator


@contextlib.contextmanager
def connected(path: str | Path, **options: Any) -> Iterator[sqlite3.Connection]:
    """A connection to ``path``: committed if the block ends well, rolled
    back if not, and closed either way."""
    conn = sqlite3.connect(path, **options)
    try:
        with conn:
            yield conn
    finally:
        conn.close()


def seq_ranges(statements: list[str]) -> set[str]:
    """The ranges of seqs (``seq > A AND seq <= B``) that the capture reads
    among ``statements`` (a connection's trace) cover."""
    return {match.group(0) for statement in statements
            for match in [re.search(r"seq > \d+ AND seq <= \d+", statement)] if match}
