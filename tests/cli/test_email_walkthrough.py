"""docs/transports.md, "An email site from scratch": its commands run in
order, as a newcomer would type them, against this test's Postfix and
Dovecot; only the first block's values are this machine's."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.agent.transport_worlds import MailServers, mail_servers  # noqa: F401 (fixture)
from tests.sqlfiles import connected
from tests.transports.servers import MAIL_DOMAIN

from .conftest import Agent, agent_process
from .test_contrib_systemd import command

DOC = Path(__file__).resolve().parents[2] / "docs" / "transports.md"
HEADING = "### An email site from scratch"


def blocks() -> list[str]:
    text = DOC.read_text()
    section = text[text.index(HEADING):]
    section = section[:section.index("\n### ", len(HEADING))]
    return re.findall(r"```sh\n(.*?)```", section, re.S)


def values_block(block: str, values: dict[str, str]) -> str:
    """The first block with this machine's values (every line NAME=VALUE of it must get one)."""
    lines = []
    for line in block.splitlines():
        name = line.partition("=")[0]
        assert name in values, f"the walkthrough sets {name}, which the test does not know"
        lines.append(f"{name}={shlex.quote(values[name])}")
    return "\n".join(lines) + "\n"


def test_the_walkthrough_runs_as_written(tmp_path: Path, agent: Agent, mail_servers: MailServers) -> None:  # noqa: F811
    dovecot, postfix = mail_servers.dovecot, mail_servers.postfix
    for user in ("hq", "north"):
        dovecot.add_user(user)
    (tmp_path / "mail-ca.pem").write_bytes(dovecot.certificates.ca_file.read_bytes())
    sites = tmp_path / "srv"
    values = {"MAIL_HOST": "127.0.0.1", "IMAP_PORT": str(dovecot.imaps_port), "SMTP_PORT": str(postfix.port),
              "DOMAIN": MAIL_DOMAIN, "CA_PEM": str(tmp_path / "mail-ca.pem"), "CONF": str(tmp_path / "etc"),
              "SITES": str(sites)}
    *commands, systemd = blocks()
    assert len(commands) == 6, "the walkthrough's blocks changed: update this test"
    script = tmp_path / "walkthrough.sh"
    script.write_text("set -euo pipefail\n" + values_block(commands[0], values) + "".join(commands[1:]))
    bin_dir = Path(sys.executable).parent
    environment = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path),
                   "COLUMNS": "200"}
    result = subprocess.run(["bash", str(script)], input=f"{dovecot.PASSWORD}\n{dovecot.PASSWORD}\n", text=True,
                            capture_output=True, env=environment, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1|north|pump checked" in result.stdout and "2|south" not in result.stdout
    assert "peers send to mailto:north@" in result.stdout  # agent status shows both addresses
    for name in ("hq-mail-password", "north-mail-password"):
        assert (tmp_path / "etc" / name).stat().st_mode & 0o777 == 0o600
        assert (tmp_path / "etc" / name).read_text() == dovecot.PASSWORD + "\n"

    # The last block installs the unit; run its command as systemd would, with no AGENT_OPTIONS.
    assert "fieldsync-agent@.service" in systemd and "enable --now fieldsync-agent@north" in systemd
    with agent_process(*command("fieldsync-agent@.service", sites, "north")) as process:
        time.sleep(3)
        with connected(sites / "hq.db") as conn:
            conn.execute("UPDATE visit SET note = 'pump replaced' WHERE id = 1")
        assert agent("run", sites / "hq.db", "--once").code == 0
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with connected(sites / "north.db") as conn:
                if conn.execute("SELECT note FROM visit WHERE id = 1").fetchone() == ("pump replaced",):
                    break
            assert process.poll() is None, process.communicate()
            time.sleep(0.2)
        else:
            raise AssertionError("the service did not apply hq's change within 20 s")
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
