"""An application's session on either backend, for the tests that hold a
PostgreSQL site to a SQLite site's behaviour (tests/site/both/,
tests/site/postgres/both.py): it knows nothing of fieldsync, and its
statements are written with ``%s`` placeholders."""

from __future__ import annotations

from typing import Any


class App:
    """An application's session (autocommit): ``execute`` runs one
    statement, ``run`` several in one transaction, ``query`` reads."""

    def __init__(self, conn: Any, sqlite: bool) -> None:
        self._conn = conn
        self._sqlite = sqlite

    def _text(self, text: str) -> str:
        return text.replace("%s", "?") if self._sqlite else text

    def execute(self, text: str, parameters: tuple = ()) -> None:
        self._conn.execute(self._text(text), parameters)

    def run(self, *statements: str | tuple[str, tuple]) -> None:
        pairs = [(statement, ()) if isinstance(statement, str) else statement for statement in statements]
        if self._sqlite:
            self._conn.execute("BEGIN IMMEDIATE")  # waits for the write lock (a scan, another writer)
            try:
                for text, parameters in pairs:
                    self._conn.execute(self._text(text), parameters)
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")
        else:
            with self._conn.transaction():
                for text, parameters in pairs:
                    self._conn.execute(text, parameters)

    def query(self, text: str, parameters: tuple = ()) -> list[tuple]:
        return [tuple(row) for row in self._conn.execute(self._text(text), parameters).fetchall()]

    def close(self) -> None:
        self._conn.close()
