"""Many remotes extracted at one point of the consolidated (``agent extract
--into FOLDER``), each published table read once for all of them.

Rules of this file:
* A :class:`StagingSource` (a PostgreSQL consolidated,
  agent.site.postgres.extract_many) fixes one extraction point E for every
  remote named and reads each table the remotes get once, in that one
  snapshot, into a staging file beside their files; each remote's rows
  are then copied from there.  A SQLite consolidated extracts one remote
  after the other instead (``SiteDatabase.extract_many``): its copy reads
  a remote's rows through the SUBSCRIBE BY column's index, in the file
  itself, and holds no server's snapshot open.
* Each remote's file is made, and the consolidated's row of it switched
  over, exactly as :func:`agent.site.sqlite.extract.extract_remote` does for one
  (``build_copy``), one remote after the other: a failure stops there,
  leaving the remotes before it extracted (each whole) and the others as
  they were.  The staging file goes when the generator ends, however it
  ends.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import ContextManager, Protocol

from ..extraction import Extraction, ExtractResult
from ..remote_rules import RemoteUser
from .extract import ExtractionSource, TablePlan, build_copy, check_target


class StagedRows(Protocol):
    """The rows of every remote of one extraction, read at one point."""

    @property
    def offset(self) -> int:
        """The extraction point E: every remote holds the log up to it."""

    @property
    def removed(self) -> tuple[str, ...]:
        """Staging files that extractions which did not finish left, removed
        before this one's was made (codec.fsutil.claim_temporary)."""

    def before(self, remote: str) -> RemoteUser:
        """``remote``'s row as it was at E."""

    def copy_into(self, copy: sqlite3.Connection, remote: str, plans: list[TablePlan]) -> dict[str, int]:
        """Copy ``remote``'s rows of each of ``plans`` into ``copy`` (its
        tables made); return the rows copied per table."""


class StagingSource(ExtractionSource, Protocol):
    def stage_rows(self, wanted: Sequence[tuple[str, list[TablePlan]]], folder: Path
                   ) -> ContextManager[StagedRows]:
        """Fix one extraction point for the remotes of ``wanted`` (name,
        plans) and read each of their tables once, into a file in
        ``folder`` that lives as long as the context."""


def extract_remotes(site: StagingSource, extractions: Sequence[Extraction], *,
                    now: datetime | None = None) -> Iterator[ExtractResult]:
    """Extract each of ``extractions`` at one point of ``site``, yielding
    each remote's result once its file has its name and the
    consolidated's row of it starts there."""
    targets = [check_target(site, extraction.path) for extraction in extractions]
    if not extractions:
        return
    planned = [site.plan(extraction.remote) for extraction in extractions]
    wanted = [(extraction.remote, plans) for extraction, (_row, plans, _sql) in zip(extractions, planned)]
    with site.stage_rows(wanted, targets[0].parent) as staged:
        left = staged.removed  # said once, with the first result
        for extraction, target, planning in zip(extractions, targets, planned):
            remote, plans = extraction.remote, planning[1]

            def copy_rows(copy: sqlite3.Connection, remote: str = remote, plans: list[TablePlan] = plans
                          ) -> tuple[int, dict[str, int], RemoteUser]:
                return staged.offset, staged.copy_into(copy, remote, plans), staged.before(remote)

            result = build_copy(site, remote, target, planning, copy_rows, keys=extraction.keys, now=now,
                                options=extraction.options)
            if left:
                result, left = replace(result, removed=left + result.removed), ()
            yield result
