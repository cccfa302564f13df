"""Checks of a site object's life that every backend passes
(tests/site/test_database.py for SQLite, tests/site/postgres/test_site.py
for PostgreSQL)."""

from __future__ import annotations

import threading


def check_calls_from_two_threads_are_serialised(site, remote: str, rounds: int) -> None:  # type: ignore[no-untyped-def]
    """Two threads updating ``remote``'s row, scanning and listing at once
    through one site object: each call is whole, none fails."""
    errors = []

    def work(offset):  # type: ignore[no-untyped-def]
        try:
            for index in range(rounds):
                site.update_remote(remote, send_every=offset + index + 1)
                site.scan()
                site.remotes()
        except Exception as error:  # noqa: BLE001 - the test reports it
            errors.append(error)

    threads = [threading.Thread(target=work, args=(n * 100,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
