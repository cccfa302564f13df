"""A soak over real mail servers: a consolidated and two remotes running
continuously over Postfix and Dovecot under a workload, with Dovecot and
Postfix each restarted once mid-way; at the end every site holds exactly
the rows it should (nothing lost, nothing doubled) and the figures (CPU,
IMAP commands, time to converge) are printed as one JSON line.

``FIELDSYNC_SOAK_SECONDS`` sets the length of the workload (default 120 s,
for CI); a longer soak is ``FIELDSYNC_SOAK_SECONDS=3600 scripts/test
tests/cli/test_email_soak.py -s``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import time
from pathlib import Path

import pytest

from agent.site.sqlite.log import HORIZON_SQL
from tests.agent.transport_worlds import MailServers, mail_servers  # noqa: F401 (fixture)
from tests.sqlfiles import connected
from tests.transports.servers import MAIL_DOMAIN

from .conftest import Agent, agent_process
from .test_email_site import _cpu_seconds, _imap_commands, report

pytestmark = pytest.mark.timeout(1800)

SITES = ("hq", "north", "south")
PREFIX = "soak-"


def _setup(root: Path, agent: Agent, servers: MailServers) -> dict[str, Path]:
    dovecot, postfix = servers.dovecot, servers.postfix
    password = root / "mail-password"
    password.write_text(dovecot.PASSWORD + "\n")
    password.chmod(0o600)
    for site in SITES:
        dovecot.add_user(PREFIX + site)
        rawlog = dovecot.base / "rawlog" / (PREFIX + site)
        rawlog.mkdir(parents=True)
        os.chown(rawlog, dovecot.mail_uid, dovecot.mail_gid)
    hq = root / "hq.db"
    assert agent("init", hq, "--name", "hq", "--role", "consolidated", "--transport", "email",
                 "--address", dovecot.url(PREFIX + "hq"), "--reply-address", f"mailto:{PREFIX}hq@{MAIL_DOMAIN}",
                 "-O", "smtp_host=127.0.0.1", "-O", f"smtp_port={postfix.port}",
                 "-O", f"ca_file={dovecot.certificates.ca_file}", "-O", f"password_file={password}").code == 0
    with connected(hq) as conn:
        conn.execute("CREATE TABLE visit (id TEXT PRIMARY KEY, region TEXT NOT NULL, note TEXT)")
    assert agent("publication", "create", hq, "territory", "visit@region").code == 0
    databases = {"hq": hq}
    for site in SITES[1:]:
        assert agent("remote", "add", hq, site, "--transport", "email",
                     "--address", f"mailto:{PREFIX}{site}@{MAIL_DOMAIN}", "--inbox", dovecot.url(PREFIX + site),
                     "--subscribe", f"territory={site}").code == 0
        databases[site] = root / f"{site}.db"
        result = agent("extract", hq, site, databases[site], "-O", f"password_file={password}")
        assert result.code == 0, result.err
    return databases


def _rows(database: Path, region: str | None = None) -> list[tuple]:
    with connected(database) as conn:
        if region is None:
            return conn.execute("SELECT id, region, note FROM visit ORDER BY id").fetchall()
        return conn.execute("SELECT id, region, note FROM visit WHERE region = ? ORDER BY id", (region,)).fetchall()


def _converged(databases: dict[str, Path], expected: dict[str, tuple]) -> bool:
    want = sorted(expected.values())
    if _rows(databases["hq"]) != want:
        return False
    return all(_rows(databases[site]) == [row for row in want if row[1] == site] for site in SITES[1:])


def _stale_log_entries(path: Path) -> int:
    """Log entries at or below the smallest horizon of the site's peers."""
    with connected(path) as conn:
        return conn.execute(f"SELECT count(*) FROM fieldsync_log WHERE commit_offset <= "
                            f"(SELECT min({HORIZON_SQL}) FROM fieldsync_remote)").fetchone()[0]


@pytest.mark.slow
def test_three_sites_run_continuously_over_postfix_and_dovecot_through_restarts(
        tmp_path: Path, agent: Agent, mail_servers: MailServers) -> None:  # noqa: F811
    seconds = float(os.environ.get("FIELDSYNC_SOAK_SECONDS", "120"))
    databases = _setup(tmp_path, agent, mail_servers)
    rng = random.Random(23)
    expected: dict[str, tuple] = {}
    writes = 0
    with contextlib.ExitStack() as stack:
        processes = {site: stack.enter_context(agent_process(
            "run", databases[site], "--receive-delay", "1m", "--send-delay", "5s")) for site in SITES}
        time.sleep(3)
        cpu = {site: _cpu_seconds(process.pid) for site, process in processes.items()}
        commands = {site: _imap_commands(mail_servers, PREFIX + site) for site in SITES}
        started = time.monotonic()
        restarted = {"dovecot": False, "postfix": False}
        while (elapsed := time.monotonic() - started) < seconds:
            if not restarted["dovecot"] and elapsed > seconds / 3:
                mail_servers.dovecot.stop()  # every IMAP session drops; mail waits in Postfix's queue
                time.sleep(2)
                mail_servers.dovecot.start()
                restarted["dovecot"] = True
            if not restarted["postfix"] and elapsed > 2 * seconds / 3:
                mail_servers.postfix.stop()  # submissions fail until it is back; queued mail stays
                time.sleep(2)
                mail_servers.postfix.start()
                restarted["postfix"] = True
            site = rng.choice(SITES)
            region = rng.choice(SITES[1:]) if site == "hq" else site
            # A site changes only rows it made: no two sites change one row at once, so the
            # end state is known exactly (crossing updates are the conflict tests' business).
            existing = [key for key, row in expected.items() if row[1] == region and key.startswith(f"{site}-")]
            with connected(databases[site]) as conn:
                if existing and rng.random() < 0.3:
                    key = rng.choice(existing)
                    note = f"changed at {site} #{writes}"
                    conn.execute("UPDATE visit SET note = ? WHERE id = ?", (note, key))
                    expected[key] = (key, region, note)
                else:
                    key = f"{site}-{writes}"
                    conn.execute("INSERT INTO visit VALUES (?, ?, ?)", (key, region, "new"))
                    expected[key] = (key, region, "new")
            writes += 1
            for name, process in processes.items():
                assert process.poll() is None, (name, process.communicate())
            time.sleep(rng.uniform(0.5, 2.5))
        workload_seconds = time.monotonic() - started
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not _converged(databases, expected):
            time.sleep(0.5)
        converge_seconds = time.monotonic() - started - workload_seconds
        # Rule 8 in continuous mode: once the last confirmations are in, every
        # log is cut at its horizon, at most 2 entries kept at or below it.
        while time.monotonic() < deadline + 120 and any(_stale_log_entries(path) > 2 for path in databases.values()):
            time.sleep(0.5)
        stale = {site: _stale_log_entries(path) for site, path in databases.items()}
        used = {site: round(_cpu_seconds(process.pid) - cpu[site], 2) for site, process in processes.items()}
        total = time.monotonic() - started
        sent = {site: _imap_commands(mail_servers, PREFIX + site) - commands[site] for site in SITES}
        errors = {}
        for site, process in processes.items():
            process.send_signal(signal.SIGTERM)
            _, errors[site] = process.communicate(timeout=60)
    figures = {
        "workload_seconds": round(workload_seconds, 1), "writes": writes, "rows": len(expected),
        "converged_after_workload_seconds": round(converge_seconds, 1),
        "cpu_seconds": used, "cpu_share": {site: round(value / total, 4) for site, value in used.items()},
        "imap_commands": sent, "imap_commands_per_minute": {site: round(count / total * 60, 1)
                                                             for site, count in sent.items()},
        "restarted": restarted, "stale_log_entries": stale,
    }
    report(json.dumps(figures))
    assert all(restarted.values())
    assert _converged(databases, expected), {site: len(_rows(path)) for site, path in databases.items()}
    assert all(count <= 2 for count in stale.values()), stale
    for site, path in databases.items():
        with connected(path) as conn:
            assert conn.execute("SELECT count(*) FROM fieldsync_apply_error").fetchone() == (0,), site
        assert "Task exception was never retrieved" not in errors[site] and "Traceback" not in errors[site], \
            errors[site]
