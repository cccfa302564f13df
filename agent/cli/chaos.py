"""``agent chaos``: the protocol fault-injection suite, for N seeds.

Each seed builds a consolidated (a SQLite file, or the PostgreSQL database
``--consolidated`` names, emptied for the seed) and 1-3 SQLite remotes
from scratch, draws its
timers (heartbeat, confirm timeout), runs a random workload with random
faults (drop, corrupt, duplicate, reorder, delay, partition) and agent
crashes, stops the faults, runs clean rounds until the system is at rest
(at most ten, one confirm timeout of virtual time a round) and checks that
every site holds exactly what it should.  docs/testing.md explains the
summary.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import click
from rich.markup import escape
from rich.table import Table
from transports.errors import BadTransportOptions
from transports.faults import FaultRates
from transports.options import parse_int

from ..chaos import ChaosParams, duration_text, run_seed, run_seeds, shrink, summarize
from ..transport_options import TransportOptions
from ._common import DATABASE, TRANSPORT, AddressTemplate, Duration, TransportOption, Whole, console


class FaultRate(click.ParamType):
    """NAME=VALUE of one field of the faults wrapper's rates."""

    name = "NAME=VALUE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, tuple):
            return value
        name, equals, text = str(value).partition("=")
        fields = FaultRates.__dataclass_fields__
        if not equals or name not in fields:
            self.fail(f"{value!r}: expected NAME=VALUE with NAME one of {', '.join(fields)}", param, ctx)
        whole = name.endswith("_ticks")
        try:
            number: float = parse_int(text) if whole else float(text)
        except ValueError:
            self.fail(f"{value!r}: {text!r} is not a {'whole ' if whole else ''}number", param, ctx)
        return name, number


class ConsolidatedUri(click.ParamType):
    """The libpq URI of a PostgreSQL database for the consolidated (no password)."""

    name = "URI"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        location = DATABASE.convert(value, param, ctx)
        if not isinstance(location, str):
            self.fail(f"{value!r} is not a PostgreSQL URI; write postgresql://USER@HOST:PORT/DATABASE (the "
                      "consolidated is a SQLite file of each seed when --consolidated is not given)", param, ctx)
        return location


@click.command()
@click.option("--seeds", "count", type=Whole(1), default=100, show_default=True,
              help="How many seeds to run.")
@click.option("--start", type=Whole(0), default=0, show_default=True, help="First seed.")
@click.option("--seed", type=Whole(0), default=None, help="Replay this one seed (and shrink it if it fails).")
@click.option("--steps", type=Whole(1), default=None, help="Workload steps per seed (default: from the seed).")
@click.option("--transport", type=TRANSPORT, default="folder", show_default=True,
              help="Transport to run over (wrapped in the faults transport).")
@click.option("--address-template", type=AddressTemplate(), default="{root}/inbox/{site}", show_default=True,
              help="Inbox address of each site; {root} is the seed's folder, {site} the site name.")
@click.option("--send-address-template", type=AddressTemplate(), default=None,
              help="Address peers send to, when it differs from the inbox address (email: mailto:{site}@...).")
@click.option("-O", "--transport-option", "transport_options", multiple=True, type=TransportOption(),
              help="NAME=VALUE for the transport, as for `agent run`.")
@click.option("--crash-rate", type=click.FloatRange(0.0, 1.0), default=None,
              help="Chance per step of an agent crash (default: from the seed).")
@click.option("--reextract-rate", type=click.FloatRange(0.0, 1.0), default=None,
              help="Chance per step that a remote is extracted again (default: from the seed).")
@click.option("--heartbeat", type=Duration(), default=None, metavar="DURATION",
              help="Every agent's --heartbeat (default: from the seed, 24h in most seeds, else 6h or 1h).")
@click.option("--confirm-timeout", type=Duration(), default=None, metavar="DURATION",
              help="Every agent's --confirm-timeout (default: from the seed, 5m to 1h, never above the "
                   "heartbeat).")
@click.option("--follow-chain/--no-follow-chain", "chain", default=None,
              help="Publish and write the follow chain (clients, their orders, the orders' lines), or not "
                   "(default: from the seed, two seeds in three).")
@click.option("--schema-changes/--no-schema-changes", "schema", default=None,
              help="Make schema changes at the consolidated while the faults last (agent schema apply: columns "
                   "added, renamed and dropped, indexes, a new table published and renamed; with --consolidated, "
                   "columns added), and write the new shapes, or not (default: from the seed, half the seeds).")
@click.option("--resubscribe/--no-resubscribe", "resubscribe", default=None,
              help="Change remotes' subscriptions at the consolidated while the faults last (a remote gains "
                   "another region, or loses one it gained: the rows go through its stream), or not (default: "
                   "from the seed, half the seeds).")
@click.option("--pack-workers/--no-pack-workers", "pack_workers", default=None,
              help="The consolidated packs its sends on two worker processes at every send phase of two sends or "
                   "more (agent run --pack-workers), or in its own process (default: from the seed, a seed in "
                   "four).")
@click.option("--fault-rate", "fault_rates", multiple=True, type=FaultRate(),
              help="NAME=VALUE of the faults wrapper (drop, corrupt, duplicate, reorder, delay, partition, "
                   "max_hold_ticks, partition_ticks); given once or more, these replace the seed's rates "
                   "and the rest are 0 or their default.")
@click.option("--consolidated", type=ConsolidatedUri(), default=None,
              help="Run every seed's consolidated in this PostgreSQL database (a libpq URI without a password: "
                   "~/.pgpass or PGPASSFILE supplies it); the remotes stay SQLite files.  The database must be "
                   "the suite's own: each seed drops the fieldsync schema and the tables it made there "
                   "(customer, product, ledger, chaos_arrival) and makes them again, and a database holding "
                   "any other table is refused.  The role needs no superuser: the database's owner will do.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON object.")
@click.option("--keep-going/--stop-at-first", default=True, show_default=True,
              help="Go on after a failing seed, or stop at the first.")
@click.option("--unsafe-without-stale-rule", is_flag=True, hidden=True)
@click.option("--unsafe-without-duplicate-rule", is_flag=True, hidden=True)
def chaos(**arguments: Any) -> int:
    """Run the protocol fault-injection suite and print a summary."""
    # The suite injects faults on purpose: the agents' warnings about them
    # are expected, and the summary is what matters.  The levels are put
    # back after, for a program that runs the command in its own process.
    loggers = [logging.getLogger(name) for name in ("fieldsync", "transports", "agent")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        return _chaos(**arguments)
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _chaos(count: int, start: int, seed: int | None, steps: int | None, transport: str, address_template: str,
           send_address_template: str | None, transport_options: tuple, crash_rate: float | None,
           reextract_rate: float | None, heartbeat: float | None, confirm_timeout: float | None,
           chain: bool | None, schema: bool | None, resubscribe: bool | None, pack_workers: bool | None,
           fault_rates: tuple[tuple[str, float], ...], consolidated: str | None, as_json: bool,
           keep_going: bool, unsafe_without_stale_rule: bool, unsafe_without_duplicate_rule: bool) -> int:
    link = TransportOptions.from_items(transport_options)
    if link.named:
        raise click.UsageError("chaos sets the faults wrapper's options itself, and runs one transport: "
                               "give NAME=VALUE options only")
    options = link.plain
    overrides: dict = dict(transport=transport, address_template=address_template,
                           send_address_template=send_address_template,
                           transport_options=tuple(sorted(options.items())),
                           unsafe_without_stale_rule=unsafe_without_stale_rule,
                           unsafe_without_duplicate_rule=unsafe_without_duplicate_rule,
                           consolidated=consolidated)
    for name, value in (("steps", steps), ("crash_rate", crash_rate), ("reextract_rate", reextract_rate),
                        ("heartbeat", heartbeat), ("confirm_timeout", confirm_timeout), ("chain", chain),
                        ("schema", schema), ("resubscribe", resubscribe), ("pack_workers", pack_workers)):
        if value is not None:
            overrides[name] = value
    if heartbeat is not None and confirm_timeout is not None and confirm_timeout > heartbeat:
        raise click.UsageError(f"the confirm timeout ({duration_text(confirm_timeout)}) is above the heartbeat "
                               f"({duration_text(heartbeat)}): lower --confirm-timeout or raise --heartbeat")
    if fault_rates:
        try:
            overrides["rates"] = FaultRates(**dict(fault_rates))
        except BadTransportOptions as error:
            raise click.UsageError(str(error)) from None
    smallest = None
    if seed is not None:
        params = ChaosParams.random(seed, **overrides)
        result = asyncio.run(run_seed(params))
        results = [result]
        if not result.ok:
            smaller = shrink(params)
            if smaller != params:
                smallest = smaller.command()
                if not as_json:
                    console().print(f"smallest failing case: {escape(smallest)}", soft_wrap=True)
    else:
        done = [0]

        def progress(result) -> None:
            done[0] += 1
            if not as_json and (done[0] % 25 == 0 or not result.ok):
                state = "ok" if result.ok else f"FAILED: {result.summary()}"
                console().print(f"seed {result.params.seed}: {state}  ({done[0]}/{count})")

        results = asyncio.run(run_seeds(range(start, start + count), keep_going=keep_going, progress=progress,
                                        **overrides))
    summary = summarize(results)
    if smallest is not None:
        summary["smallest_failing_case"] = smallest
    if as_json:
        click.echo(json.dumps(summary))
    else:
        _print(summary)
    return 0 if not summary["failing_seeds"] else 1


def _print(summary: dict) -> None:
    table = Table(title="fault-injection summary")
    table.add_column("what")
    table.add_column("count", justify="right")
    table.add_row("seeds run", str(summary["seeds"]))
    for kind, number in summary["faults"].items():
        table.add_row(f"faults injected: {kind}", str(number))
    table.add_row("crashes injected", str(summary["crashes"]))
    table.add_row("  of them, of the consolidated's agent", str(summary.get("consolidated_crashes", 0)))
    table.add_row("transactions open across the consolidated's run", str(summary.get("stragglers", 0)))
    table.add_row("remotes extracted again mid-run", str(summary.get("reextractions", 0)))
    table.add_row("resend requests", str(summary["resend_requests"]))
    table.add_row("files quarantined", str(summary["quarantined"]))
    table.add_row("apply errors from concurrent changes", str(summary.get("apply_errors", 0)))
    table.add_row("divergences", str(summary["divergences"]))
    table.add_row("double applies", str(summary["double_applies"]))
    table.add_row("losses", str(summary["losses"]))
    table.add_row("applied out of order", str(summary["out_of_order"]))
    table.add_row("stale-epoch applies", str(summary["stale_applies"]))
    table.add_row("runs that never settled", str(summary["stuck"]))
    table.add_row("probes sent", str(summary.get("probes", 0)))
    follow = summary.get("chain")
    if follow:
        table.add_row("seeds with the follow chain", str(follow["seeds"]))
        table.add_row("follow chain: clients moved, orders handed over",
                      f"{follow['moves']}, {follow['handovers']}")
        table.add_row("follow chain: rows with no client at hq", str(follow["rootless_rows"]))
    schema = summary.get("schema")
    if schema:
        table.add_row("seeds with schema changes, changes made", f"{schema['seeds']}, {schema['changes']}")
    moved = summary.get("resubscribe")
    if moved:
        table.add_row("seeds with subscription changes, changes made, rows moved",
                      f"{moved['seeds']}, {moved['changes']}, {moved['rows']}")
    workers = summary.get("pack_workers")
    if workers:
        table.add_row("seeds packing on workers", str(workers["seeds"]))
    rest = summary.get("rounds_to_rest")
    if rest and "max" in rest:
        table.add_row(f"clean rounds to rest (bound {rest['bound']}): most, p50/p90/p99",
                      f"{rest['max']}, {rest['p50']}/{rest['p90']}/{rest['p99']}")
        table.add_row("seeds at rest after 1, 2, ... rounds",
                      " ".join(f"{rounds}:{count}" for rounds, count in rest["histogram"].items()))
    for timer, counts in summary.get("timers", {}).items():
        table.add_row(f"seeds by {timer.replace('_', ' ')}", " ".join(f"{value}:{n}" for value, n in counts.items()))
    console().print(table)
    for failing in summary["failing_seeds"]:
        timers = (f"heartbeat {duration_text(failing['heartbeat'])}, "
                  f"confirm timeout {duration_text(failing['confirm_timeout'])}")
        console().print(f"[red]seed {failing['seed']}[/] ({timers}): {escape(str(failing['problem']))}\n"
                        f"  replay: {escape(str(failing['replay']))}", markup=True)
    if not summary["failing_seeds"]:
        console().print("[green]OK[/]: no divergence, double apply, loss, disorder or stale-epoch apply, "
                        "every seed at rest within the bound", markup=True)
