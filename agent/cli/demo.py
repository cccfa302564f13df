"""``agent demo``: show fieldsync's message files end to end.

Makes two sites' keys in a folder, packs a stream of transactions (one of
them larger than the message size, so it travels in parts) into signed,
compressed message files, reads every file back, verifies and decodes it,
and prints what happened.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from codec.atomic import write_file_atomically
from codec.keys import Keyring, SiteKeys
from codec.message import decode_message, reassemble
from codec.names import MessageName
from codec.ops import Operation, Transaction, values_identical
from codec.packing import DEFAULT_MAX_SIZE, MIN_MAX_SIZE, pack_messages

from ..errors import AgentError


def _sample_stream(seed: int) -> list[Transaction]:
    rng = random.Random(seed)
    cities = ["Porto", "Tromsø", "Osaka", "Quito", "Hobart", "Kraków"]
    transactions = []
    commit = 1000
    for number in range(60):
        ops = []
        for _ in range(rng.randint(5, 80)):
            row_id = rng.randint(1, 10_000)
            ops.append(Operation.insert("customer", (row_id,), {
                "id": row_id, "name": f"customer {row_id}", "city": rng.choice(cities),
                "balance": round(rng.uniform(0, 9000), 2), "visits": rng.randint(0, 90)}))
        commit += rng.randint(50, 500)
        transactions.append(Transaction(commit, "hq", tuple(ops)))
        if number == 40:  # one large transaction: scanned documents
            commit += 1000
            transactions.append(Transaction(commit, "hq", tuple(
                Operation.insert("document", (page,), {"id": page, "scan": rng.randbytes(6000)})
                for page in range(20))))
    return transactions


@click.command()
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path), default=Path("demo"))
@click.option("-l", "--max-message-size", type=click.IntRange(MIN_MAX_SIZE), default=DEFAULT_MAX_SIZE,
              show_default=True, help="Largest message file, in bytes.")
def demo(folder: Path, max_message_size: int) -> None:
    """Run the demonstration in FOLDER (default: ./demo) and print what happened."""
    console = Console()
    outbox = folder / "outbox"
    outbox.mkdir(parents=True, exist_ok=True)
    for stale in outbox.glob("*.fsm"):
        stale.unlink()
    hq = SiteKeys.generate("hq")
    field = SiteKeys.generate("field1")
    hq.save(folder / "hq.key")
    field.save(folder / "field1.key")
    incarnation = os.urandom(16)
    stream = _sample_stream(seed=7)
    operations = sum(len(t.ops) for t in stream)
    written = 0
    for message in pack_messages(stream, keys=hq, recipient="field1", incarnation=incarnation, resend_count=0,
                                 start=0, max_size=max_message_size, seal_to=field.public):
        write_file_atomically(outbox / message.name, message.data)
        written += 1

    keyring = Keyring([hq.public])
    table = Table(title=f"message files in {outbox}")
    table.add_column("header", no_wrap=True)
    table.add_column("bytes", justify="right")
    table.add_column("content")
    received: list[Transaction] = []
    parts = []
    for path in sorted(outbox.glob("*.fsm")):
        name = MessageName.parse(path.name)
        message = decode_message(path.read_bytes(), source=str(path), keyring=keyring, recipient="field1",
                                 recipient_keys=field)
        if message.is_part:
            parts.append(message)
            content = f"part {message.header.seq}" + (" (final)" if message.header.is_final_part else "")
            if message.header.is_final_part:
                received.append(reassemble(parts))
                parts = []
        else:
            received.extend(message.transactions or ())
            content = f"{len(message.transactions or ())} transactions"
        table.add_row(str(name.header), str(path.stat().st_size), content)
    console.print(table)
    if not values_identical(received, stream):
        raise AgentError("demo: the decoded stream differs from the one sent")
    console.print(f"[bold green]ok[/]: {len(stream)} transactions, {operations} operations in {written} "
                  f"signed, sealed, compressed files of at most {max_message_size} bytes; "
                  f"all verified and decoded in order.")
    console.print(f"keys: hq {hq.public.fingerprint}, field1 {field.public.fingerprint}")
