"""Consecutive messages from one peer applied in one database transaction
(docs/protocol.md, rule 2): each as an apply of its own would be, one
after the other, in the same transaction.

Rules of this file:
* A message's transactions are applied as they are in an apply of that
  message alone: its batch starts from the peer's row as the message
  before left it (its ``log_received`` recorded, inside the transaction),
  and what the rules decide for a batch is decided for each message.
  Only the commit is shared.
* The messages are taken one at a time: one decoded at a time when the
  caller reads them lazily.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from codec.ops import Transaction

from .batch import ApplyResult


@dataclass(frozen=True, slots=True)
class MessageChain:
    """The transactions of consecutive messages, each with the
    ``log_received`` its apply sets (its ``last``); the last message's is
    the chain's.  Site.apply takes it where it takes transactions."""

    messages: Iterable[tuple[Iterable[Transaction], int]]


def apply_chain(apply_one: Callable[..., ApplyResult], chain: MessageChain, *, skip_through: int | None,
                **options: object) -> ApplyResult:
    """Apply each message of ``chain`` with ``apply_one(transactions,
    log_received, messages=1, skip_through=..., **options)`` (an apply of one
    message, inside the caller's transaction); return the results joined.
    ``skip_through`` is the first message's: the others skip what the
    ``log_received`` recorded before them covers (None)."""
    results = []
    for transactions, log_received in chain.messages:
        results.append(apply_one(transactions, log_received, messages=1, skip_through=skip_through, **options))
        skip_through = None
    if not results:
        raise ValueError("a chain of no messages")
    return ApplyResult(results[-1].peer, results[-1].log_received,
                       sum(result.transactions_applied for result in results),
                       sum(result.transactions_skipped for result in results),
                       sum(result.operations_applied for result in results),
                       sum(result.conflicts for result in results), sum(result.errors for result in results),
                       tuple(commit for result in results for commit in result.log_commits))
