"""Transport throughput on loopback: folder, sftp and email in the same run.

Workload: message files of 50,000 random bytes (the default maximum message
size; compressed, signed files do not compress further), each with its own
name.  For each transport one figure, messages per second through the whole
path the agent uses:

* ``send`` every file to the inbox, one after the other;
* ``receive`` them all and ``ack`` each one as it arrives.

The servers are the real ones the integration tests use
(``tests/transports/servers.py``): OpenSSH's sshd with internal-sftp, and
aiosmtpd delivering into Maildirs that Dovecot serves over IMAPS, all on
127.0.0.1 with TLS and authentication as in production.  ``folder`` is the
baseline every ratio is taken against.  The transports take turns for
``--rounds`` rounds (3) and each one's best round is reported, so all see
the same machine noise.  Every received file is checked against what was
sent.  Run: ``python -m benchmarks.transports --json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

from codec.header import Header
from codec.names import Kind, MessageName
from transports.base import Transport
from transports.email import EmailTransport
from transports.folder import FolderTransport
from transports.sftp import SftpTransport

MESSAGE_BYTES = 50_000
PASSWORD_VARIABLE = "FIELDSYNC_BENCHMARK_MAIL_PASSWORD"


def names(count: int) -> list[str]:
    return [str(MessageName("hq", "field1", Kind.DATA, Header(0, last - 1, last, 0))) for last in range(1, count + 1)]


async def through(transport: Transport, send_address: str, inbox: str, files: dict[str, bytes]) -> dict:
    """Send every file, then receive and ack them all; return timings, checking every byte."""
    async with transport:
        started = time.perf_counter()
        for name, data in files.items():
            await transport.send(send_address, name, data)
        sent = time.perf_counter()
        seen: dict[str, bytes] = {}
        async for incoming in transport.receive(inbox):
            seen[incoming.name] = incoming.data
            await transport.ack(incoming)
        done = time.perf_counter()
        if seen != files:
            raise RuntimeError(f"{type(transport).__name__}: received {len(seen)} files, expected {len(files)}"
                               " (or their bytes differ)")
        leftover = [incoming async for incoming in transport.receive(inbox)]
        if leftover:
            raise RuntimeError(f"{type(transport).__name__}: {len(leftover)} files left after ack")
    return {"send_s": sent - started, "receive_ack_s": done - sent, "total_s": done - started}


async def run_all(counts: dict[str, int], rounds: int = 3) -> dict:
    from tests.transports.servers import MAIL_DOMAIN, DovecotServer, SmtpServer, SshServer

    rng = random.Random(50_000)
    result: dict[str, object] = {"message_bytes": MESSAGE_BYTES}
    base = Path(tempfile.mkdtemp(prefix="fieldsync-bench-"))
    ssh = dovecot = smtp = None
    try:
        ssh = SshServer().start()
        dovecot = DovecotServer().start()
        for user in ("hq", "field1"):
            dovecot.add_user(user)
        smtp = SmtpServer(dovecot, tls="starttls").start()
        os.environ[PASSWORD_VARIABLE] = dovecot.PASSWORD

        folder_inbox = base / "field1-inbox"
        folder_inbox.mkdir()
        sftp_inbox, _ = ssh.new_inbox("field1")
        runs = {
            "folder": (lambda: FolderTransport(), str(folder_inbox), str(folder_inbox)),
            "sftp": (lambda: SftpTransport(key_file=str(ssh.client_key), known_hosts=str(ssh.known_hosts)),
                     sftp_inbox, sftp_inbox),
            "email": (lambda: EmailTransport(smtp_host="127.0.0.1", smtp_port=smtp.port, smtp_tls="starttls",
                                             from_address=f"hq@{MAIL_DOMAIN}", password_env=PASSWORD_VARIABLE,
                                             ca_file=str(dovecot.certificates.ca_file)),
                      f"mailto:field1@{MAIL_DOMAIN}", dovecot.url("field1")),
        }
        best: dict[str, dict] = {}
        # Alternate the transports round by round so each sees the same machine noise; keep each one's best.
        for _round in range(rounds):
            for label, (make, send_address, inbox) in runs.items():
                files = {name: rng.randbytes(MESSAGE_BYTES) for name in names(counts[label])}
                timing = await through(make(), send_address, inbox, files)
                if label not in best or timing["total_s"] < best[label]["total_s"]:
                    best[label] = timing
        result["rounds"] = rounds
        for label, timing in best.items():
            count = counts[label]
            result[f"{label}_messages"] = count
            result[f"{label}_msgs_per_s"] = round(count / timing["total_s"], 1)
            result[f"{label}_send_msgs_per_s"] = round(count / timing["send_s"], 1)
            result[f"{label}_receive_ack_msgs_per_s"] = round(count / timing["receive_ack_s"], 1)
            result[f"{label}_mb_per_s"] = round(count * MESSAGE_BYTES / timing["total_s"] / 1e6, 2)
    finally:
        os.environ.pop(PASSWORD_VARIABLE, None)
        for server in (smtp, dovecot, ssh):
            if server is not None:
                server.close()
        shutil.rmtree(base, ignore_errors=True)
    folder_rate = result["folder_msgs_per_s"]
    for label in ("sftp", "email"):
        result[f"{label}_ratio_to_folder"] = round(result[f"{label}_msgs_per_s"] / folder_rate, 4)
    result["baseline"] = "folder"
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.transports", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--folder-messages", type=int, default=200)
    parser.add_argument("--sftp-messages", type=int, default=200)
    parser.add_argument("--email-messages", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3, help="rounds; each transport's best is reported")
    args = parser.parse_args(argv)
    counts = {"folder": args.folder_messages, "sftp": args.sftp_messages, "email": args.email_messages}
    if min(counts.values()) < 1 or args.rounds < 1:
        parser.error("message counts and rounds must be at least 1")
    try:
        result = asyncio.run(run_all(counts, args.rounds))
    except Exception as error:  # a server that cannot start, or a transport that lost a file
        print(f"benchmarks.transports: {error}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>30}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
