"""agent.site.postgres.apply.ahead: the runs the apply makes ready on a
thread of their own, ahead of the statements (what they hold is checked
against a real PostgreSQL by test_apply.py, whose batches all go through
them)."""

from __future__ import annotations

import threading

from codec.ops import OpKind, Run, Transaction
from agent.site.postgres.apply.ahead import AHEAD, read_ahead
from agent.site.postgres.apply.tables import Tables


def _transaction(commit: int) -> Transaction:
    run = Run("customer", OpKind.DELETE, 1, ("id",), (), ((commit, commit),))
    return Transaction._trusted(commit, "peer", (run, run))


def test_each_transaction_comes_in_its_order_with_its_runs_made_ready_on_another_thread() -> None:
    threads: set[str] = set()

    class Watched(Tables):
        def table(self, name: object) -> None:
            threads.add(threading.current_thread().name)
            return None  # not published here: the runs go one operation at a time

    transactions = [_transaction(commit) for commit in range(1, 8)]
    got = list(read_ahead(transactions, Watched(), 500))
    assert [transaction for transaction, _ready in got] == transactions
    assert [ready for _transaction, ready in got] == [(None, None)] * len(transactions)
    assert threads and threading.current_thread().name not in threads


def test_no_transaction_after_one_read_once_is_taken_before_it_is_applied() -> None:
    # A group of parts is read from the spool as it is applied: the
    # transactions after it are not read ahead of it.
    taken: list[int] = []
    applied: list[int] = []

    def once(commit: int):
        yield from _transaction(commit).ops
        applied.append(commit)

    def transactions():
        for commit in range(1, 7):
            taken.append(commit)
            if commit == 3:
                streamed = object.__new__(Transaction)
                object.__setattr__(streamed, "commit", commit)
                object.__setattr__(streamed, "origin", "peer")
                object.__setattr__(streamed, "ops", once(commit))
                yield streamed
            else:
                yield _transaction(commit)

    for transaction, ready in read_ahead(transactions(), Tables(), 500):
        if transaction.commit == 3:
            assert ready is None
            assert taken == [1, 2, 3]  # not 4 yet
            list(transaction.ops)
        else:
            assert ready == (None, None)
            assert max(taken) <= transaction.commit + AHEAD
    assert applied == [3] and taken == [1, 2, 3, 4, 5, 6]
