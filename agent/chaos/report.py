"""What a seed found (:class:`ChaosResult`), and the summary of many seeds
that ``agent chaos`` prints.

Rules of this file:
* A seed is ok only without divergence, double apply, loss, disorder,
  stale-epoch apply, and stuck settle phase; apply errors from concurrent
  changes to customers are only counted.
* The summary counts every seed, and names each failing one with the
  command that replays it and its timers.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable

from .params import SETTLE_ROUNDS, ChaosParams, duration_text


@dataclass(slots=True)
class ChaosResult:
    params: ChaosParams
    faults: Counter = field(default_factory=Counter)
    crashes: int = 0
    consolidated_crashes: int = 0  # of them, crashes of the consolidated's agent
    # Application transactions at a PostgreSQL consolidated begun before
    # its agent's run and committed after it.
    stragglers: int = 0
    reextractions: int = 0
    resends: int = 0
    quarantined: int = 0
    # Operations on customers and the follow chain that found no row (or a
    # taken key, or no parent) because another site changed the row
    # meanwhile: the sites still converge.
    apply_errors: int = 0
    probes: int = 0  # probes sent (rule 3): control messages asking for a confirmation after a silence
    # The most probes any stream had sent since it last changed when the
    # faults stopped: its next probe waits the confirm timeout doubled as often.
    backoff_at_stop: int = 0
    # Clean rounds of every site until the system was at rest (0: stuck),
    # and the virtual seconds they took.
    rounds_to_quiesce: int = 0
    settle_seconds: float = 0.0
    divergences: list[str] = field(default_factory=list)
    double_applies: list[str] = field(default_factory=list)
    losses: list[str] = field(default_factory=list)
    out_of_order: list[str] = field(default_factory=list)
    stale_applies: list[str] = field(default_factory=list)
    stuck: str | None = None
    # The follow chain (seeds that draw it): clients moved to another rep,
    # orders given to another client, and the consolidated's orders and
    # lines left with no client above them at the end (a remote deleted a
    # client the consolidated had given new orders meanwhile: they go to
    # nobody, docs/site-database.md's known limits).
    chain_moves: int = 0
    chain_handovers: int = 0
    chain_rootless: int = 0
    # Schema changes the consolidated made while the faults lasted (seeds
    # that draw them, schema_changes.py).
    schema_changes: int = 0
    schema_kinds: Counter = field(default_factory=Counter)
    # Remotes' subscriptions changed while the faults lasted (seeds that
    # draw them, resubscribe.py), and the rows that entered or left a subset.
    subscription_changes: int = 0
    subscription_rows: int = 0

    @property
    def ok(self) -> bool:
        return not (self.divergences or self.double_applies or self.losses or self.out_of_order
                    or self.stale_applies or self.stuck)

    def summary(self) -> str:
        problems = (self.divergences + self.double_applies + self.losses + self.out_of_order
                    + self.stale_applies + ([self.stuck] if self.stuck else []))
        return "; ".join(problems[:3]) if problems else "ok"


def _percentile(values: list[int], share: float) -> int:
    """The nearest-rank percentile of ``values`` (sorted, not empty)."""
    return values[max(0, math.ceil(share * len(values)) - 1)]


def rest_figures(results: list[ChaosResult]) -> dict:
    """How many clean rounds the seeds needed to come to rest: the most,
    percentiles, and how many seeds needed each count (stuck seeds apart)."""
    rounds = sorted(r.rounds_to_quiesce for r in results if not r.stuck)
    figures: dict = {"bound": SETTLE_ROUNDS, "stuck": sum(1 for r in results if r.stuck)}
    if rounds:
        figures.update(max=rounds[-1], p50=_percentile(rounds, 0.5), p90=_percentile(rounds, 0.9),
                       p99=_percentile(rounds, 0.99))
    figures["histogram"] = {str(number): count for number, count in sorted(Counter(rounds).items())}
    return figures


def summarize(results: list[ChaosResult]) -> dict:
    faults: Counter = Counter()
    for result in results:
        faults.update(result.faults)
    failing = [r for r in results if not r.ok]
    return {
        "seeds": len(results),
        "faults": dict(sorted(faults.items())),
        "faults_total": sum(faults.values()),
        "crashes": sum(r.crashes for r in results),
        "consolidated_crashes": sum(r.consolidated_crashes for r in results),
        "stragglers": sum(r.stragglers for r in results),
        "reextractions": sum(r.reextractions for r in results),
        "resend_requests": sum(r.resends for r in results),
        "quarantined": sum(r.quarantined for r in results),
        "apply_errors": sum(r.apply_errors for r in results),
        "divergences": sum(len(r.divergences) for r in results),
        "double_applies": sum(len(r.double_applies) for r in results),
        "losses": sum(len(r.losses) for r in results),
        "out_of_order": sum(len(r.out_of_order) for r in results),
        "stale_applies": sum(len(r.stale_applies) for r in results),
        "stuck": sum(1 for r in results if r.stuck),
        "probes": sum(r.probes for r in results),
        "chain": {"seeds": sum(1 for r in results if r.params.chain),
                  "moves": sum(r.chain_moves for r in results),
                  "handovers": sum(r.chain_handovers for r in results),
                  "rootless_rows": sum(r.chain_rootless for r in results)},
        "schema": {"seeds": sum(1 for r in results if r.params.schema),
                   "changes": sum(r.schema_changes for r in results),
                   "kinds": dict(sum((r.schema_kinds for r in results), Counter()))},
        "resubscribe": {"seeds": sum(1 for r in results if r.params.resubscribe),
                        "changes": sum(r.subscription_changes for r in results),
                        "rows": sum(r.subscription_rows for r in results)},
        "pack_workers": {"seeds": sum(1 for r in results if r.params.pack_workers)},
        "rounds_to_rest": rest_figures(results),
        "timers": {
            "heartbeat": _counts(duration_text(r.params.heartbeat) for r in results),
            "confirm_timeout": _counts(duration_text(r.params.confirm_timeout) for r in results),
        },
        "failing_seeds": [{"seed": r.params.seed, "replay": r.params.command(), "problem": r.summary(),
                           "heartbeat": r.params.heartbeat, "confirm_timeout": r.params.confirm_timeout,
                           "rounds_to_quiesce": r.rounds_to_quiesce, "backoff_at_stop": r.backoff_at_stop}
                          for r in failing],
    }


def _counts(values: Iterable[str]) -> dict[str, int]:
    return dict(Counter(values).most_common())

