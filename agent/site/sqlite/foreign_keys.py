"""The foreign keys of a table's definition, as a remote's copy keeps them
(docs/site-database.md, "Extraction").

Rules of this file:
* A ``CREATE TABLE`` statement is read with SQLite's own lexical rules
  (quoted names, strings, comments, nested parentheses), never with a
  search for words in the text: a name or a default value may hold any
  word.  Only its foreign key clauses are looked at, each as a column
  constraint (``col ... REFERENCES p (c)``) or a table constraint
  (``FOREIGN KEY (a, b) REFERENCES p (c, d)``), with its actions.
* A clause is kept or cut out of the text whole (with its ``CONSTRAINT``
  name, and a table constraint with its comma); the rest of the text stays
  as written.  A kept clause loses its ``DEFERRABLE ...`` part: a remote
  checks each key at the statement that writes it (see the apply path).
* Pure: text in, text out; which clauses a remote keeps is its caller's
  choice (agent/site/sqlite/extract.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, NamedTuple

_TOKEN = re.compile(r"""
    (?P<space>\s+|--[^\n]*|/\*.*?(?:\*/|\Z))
  | (?P<quoted>"(?:[^"]|"")*"|`(?:[^`]|``)*`|\[[^\]]*\])
  | (?P<string>'(?:[^']|'')*')
  | (?P<word>[^\W\d][\w$]*)
  | (?P<other>.)
""", re.VERBOSE | re.DOTALL)
_ACTIONS = {"CASCADE": 1, "RESTRICT": 1, "SET": 2, "NO": 2}


class _Token(NamedTuple):
    kind: str
    text: str
    start: int
    end: int

    @property
    def upper(self) -> str:
        return self.text.upper() if self.kind == "word" else ""

    @property
    def name(self) -> str:
        """The name this token stands for (quotes taken off)."""
        if self.kind == "quoted":
            inner = self.text[1:-1]
            return inner if self.text[0] == "[" else inner.replace(self.text[0] * 2, self.text[0])
        if self.kind == "string":  # SQLite takes a string where a name is wanted
            return self.text[1:-1].replace("''", "'")
        return self.text


@dataclass(frozen=True, slots=True)
class ForeignKey:
    """One foreign key clause of a table's definition."""

    columns: tuple[str, ...]                # the child's columns, as written
    parent: str
    parent_columns: tuple[str, ...] | None  # None: the parent's primary key
    clause: str                             # REFERENCES ... with its actions, without DEFERRABLE ...
    span: tuple[int, int]                   # the text cut to drop the clause
    deferral: tuple[int, int] | None        # the text of its DEFERRABLE ... part


def foreign_keys(sql: str) -> list[ForeignKey]:
    """The foreign key clauses of the ``CREATE TABLE`` statement ``sql``, in
    the order they are written."""
    tokens = [_Token(match.lastgroup or "other", match.group(), match.start(), match.end())
              for match in _TOKEN.finditer(sql) if match.lastgroup != "space"]
    found = []
    for comma, item in _definitions(tokens):
        if not item:
            continue
        at = 2 if item[0].upper == "CONSTRAINT" else 0
        if at < len(item) and item[at].upper == "FOREIGN":
            columns, at = _names(item, at + 2)
            key = _references(sql, item, at, columns, None)
            if key is not None:
                cut = (comma.start if comma is not None else item[0].start, item[-1].end)
                found.append(ForeignKey(key.columns, key.parent, key.parent_columns, key.clause, cut, key.deferral))
            continue
        if item[0].upper in ("PRIMARY", "UNIQUE", "CHECK", "CONSTRAINT"):
            continue
        depth = 0
        for index, token in enumerate(item[1:], 1):
            depth += token.text == "("
            depth -= token.text == ")"
            if depth == 0 and token.upper == "REFERENCES":
                start = index - 2 if index >= 3 and item[index - 2].upper == "CONSTRAINT" else index
                key = _references(sql, item, index, (item[0].name,), item[start].start)
                if key is not None:
                    found.append(key)
    return found


def remote_definition(sql: str, keep: Callable[[ForeignKey], bool]) -> str:
    """``sql`` without the foreign key clauses ``keep`` refuses, and
    without the DEFERRABLE part of those it keeps."""
    cuts = []
    for key in foreign_keys(sql):
        if not keep(key):
            cuts.append(key.span)
        elif key.deferral is not None:
            cuts.append(key.deferral)
    for start, end in sorted(cuts, reverse=True):
        sql = sql[:start] + sql[end:]
    return sql


def _definitions(tokens: list[_Token]) -> list[tuple[_Token | None, list[_Token]]]:
    """The items between the statement's outer parentheses, each with the
    comma before it (None for the first)."""
    opening = next((index for index, token in enumerate(tokens) if token.text == "("), len(tokens))
    items: list[tuple[_Token | None, list[_Token]]] = [(None, [])]
    depth = 0
    for token in tokens[opening + 1:]:
        if token.text == "(":
            depth += 1
        elif token.text == ")":
            if depth == 0:
                break
            depth -= 1
        elif token.text == "," and depth == 0:
            items.append((token, []))
            continue
        items[-1][1].append(token)
    return items


def _names(item: list[_Token], at: int) -> tuple[tuple[str, ...], int]:
    """The names of the parenthesised list at ``item[at]`` (none when there
    is no list there), and the position after it."""
    if at >= len(item) or item[at].text != "(":
        return (), at
    names = []
    at += 1
    while at < len(item) and item[at].text != ")":
        if item[at].text != ",":
            names.append(item[at].name)
            # COLLATE x, ASC, DESC may follow a name in a key's list
            while at + 1 < len(item) and item[at + 1].text not in (",", ")"):
                at += 1
        at += 1
    return tuple(names), at + 1


def _references(sql: str, item: list[_Token], at: int, columns: tuple[str, ...],
                start: int | None) -> ForeignKey | None:
    """The clause whose REFERENCES is ``item[at]`` (None when it is not one)."""
    if at + 1 >= len(item) or item[at].upper != "REFERENCES":
        return None
    begin = item[at].start
    parent = item[at + 1].name
    parent_columns, at = _names(item, at + 2)
    while at < len(item):
        word = item[at].upper
        if word == "ON" and at + 2 < len(item):
            at += 2 + _ACTIONS.get(item[at + 2].upper, 1)
        elif word == "MATCH":
            at += 2
        else:
            break
    end = item[at - 1].end
    deferral = None
    if at < len(item) and (item[at].upper == "DEFERRABLE" or item[at].upper == "NOT" and at + 1 < len(item)
                           and item[at + 1].upper == "DEFERRABLE"):
        at += 2 if item[at].upper == "NOT" else 1
        if at < len(item) and item[at].upper == "INITIALLY":
            at += 2
        deferral = (end, item[min(at, len(item)) - 1].end)
    span = (begin if start is None else start, item[at - 1].end if deferral else end)
    return ForeignKey(columns, parent, parent_columns or None, sql[begin:end], span, deferral)
