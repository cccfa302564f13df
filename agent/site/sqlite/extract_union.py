"""Extracting a table a remote gets through several articles (the table is
in several of its publications): docs/site-database.md, "A table in
several publications".

Rules of this file:
* The remote's copy of the table has every column any of the articles
  publishes; a column some of them leave out loses its NOT NULL there (a
  row none of the articles that publish it keeps holds NULL in it).
* A row is copied once when any article keeps it (the test each article's
  reader applies: agent.site.union), with the columns of the articles
  that keep it; it holds NULL in the others, as the stream writes it.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from typing import Any

from ..capture import ROUTE
from ..extraction import COPY_CHUNK
from ._db import quote_ident


def union_plan(parts: list[Any]) -> Any:
    """The plan (agent/site/sqlite/extract.py's TablePlan) of a table the
    remote gets through the articles of ``parts``."""
    first = parts[0]
    wanted = {column for part in parts for column in part.columns}
    columns = tuple(column for column in first.info.columns if column in wanted)
    follow = next((part.follow for part in parts if part.follow is not None), None)
    return dataclasses.replace(first, columns=columns, subscribe_by=None, values=None,
                               subset=columns != first.info.columns, follow=follow, parts=tuple(parts))


def optional_columns(plan: Any) -> frozenset[str]:
    """The columns of ``plan`` some of the remote's rows are not published with."""
    if not plan.parts:
        return frozenset()
    everywhere = set(plan.columns).intersection(*(part.columns for part in plan.parts))
    if any(part.values is None and set(part.columns) == set(plan.columns) for part in plan.parts):
        return frozenset()  # one article keeps every row with every column
    return frozenset(plan.columns) - everywhere


def copy_union_rows(copy: sqlite3.Connection, plan: Any) -> int:
    """Copy the rows of ``plan``'s table any of its articles keeps, from
    the consolidated attached as ``source``; return how many."""
    table = quote_ident(plan.info.name)
    selected = [quote_ident(column) for column in plan.columns]
    index = {column: position for position, column in enumerate(plan.columns)}
    tests = []  # per article: (positions of its columns, where its filter value sits or None, its values)
    for part in plan.parts:
        at = None
        if part.values is not None:
            if part.subscribe_by == ROUTE:  # the rows follow their parent: each one's route alongside
                follow = part.follow
                assert follow is not None
                selected.append(follow.route([f"source.{table}.{quote_ident(c)}" for c in follow.columns],
                                             schema="source."))
            else:
                selected.append(quote_ident(part.subscribe_by))
            at = len(selected) - 1
        tests.append((tuple(index[column] for column in part.columns), at, part.values))
    source = copy.execute(f"SELECT {', '.join(selected)} FROM source.{table}")
    width = len(plan.columns)
    insert = (f"INSERT INTO main.{table} ({', '.join(selected[:width])}) VALUES ({', '.join('?' * width)})")
    writer = copy.cursor()
    total = 0
    while rows := source.fetchmany(COPY_CHUNK):
        copied = []
        for row in rows:
            # The same test the log reader applies (Python equality).
            kept = set().union(*(positions for positions, at, values in tests if at is None or row[at] in values))
            if kept:
                copied.append(tuple(row[i] if i in kept else None for i in range(width)))
        writer.executemany(insert, copied)
        total += len(copied)
    return total
