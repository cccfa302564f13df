"""``agent spool check``: verify a site's message spool offline."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import click

from ..runner import agent_directory
from ..spool import check_spool
from ._common import DATABASE, check_site_path


@click.group()
def spool() -> None:
    """Inspect the agent's message spool."""


@spool.command("check")
@click.argument("database", type=DATABASE)
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
def check(database: Path, as_json: bool) -> int:
    """Verify the spool of DATABASE's agent without changing it (works while
    the agent runs): segments, records, torn tail, corruption with its byte
    position, queue contents, in-doubt dequeues.  Exit 1 when it finds a
    problem."""
    check_site_path(database)
    folder = agent_directory(database) / "spool"
    if folder.exists() and not folder.is_dir():
        raise click.ClickException(f"{folder} is in the way: it exists and is not the spool folder; move it aside")
    if not folder.is_dir():
        raise click.ClickException(f"{database} has no spool yet ({folder}); the agent makes it on its first run")
    report = check_spool(folder)
    if as_json:
        click.echo(json.dumps({
            "ok": report.ok, "records": report.records, "segments": len(report.segments),
            "messages": report.messages, "restart_span_bytes": report.restart_span_bytes,
            "in_doubt": len(report.in_doubt),
            "queues": [{"queue": queue.queue, "messages": len(queue.names), "bytes": queue.content_bytes}
                       for queue in report.queues],
            "torn_tail": dataclasses.asdict(report.torn_tail) if report.torn_tail is not None else None,
            "corruption": [dataclasses.asdict(bad) for bad in report.corruption],
            "problems": list(report.problems),
        }))
    else:
        for line in report.lines():
            click.echo(line)
    return 0 if report.ok else 1
