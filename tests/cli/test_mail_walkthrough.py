"""docs/transports.md, "Running your own mail for a consolidated": the
section's blocks run in order, as root, with the mail in a scratch folder on
free ports of 127.0.0.1; then a change travels each way over that Postfix and
Dovecot, and what the section says about security holds.

Rules of this file:
* Blocks are found by their info string: ``sh mail-values`` (every line
  gets this test's value), ``sh mail-run`` (run in order), ``sh mail-start``
  (starts the servers) and ``sh mail-stop`` (stops them). Plain ``sh``
  blocks (packages, a system user, systemd) are not run; what they name is
  checked instead.
* The only lines the test adds to the documented configuration give each
  server a log file (this machine has no syslog), for the failure messages.
* Every server the blocks start is stopped by the stop block, which must
  work; a ``finally`` then kills whatever the pid files still name, within
  seconds. A server that does not start fails the test with its log; nothing
  here skips.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import smtplib
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.sqlfiles import connected
from tests.transports.servers import MAIL_DOMAIN, _descendants, _tail, free_port

from .conftest import Agent

DOC = Path(__file__).resolve().parents[2] / "docs" / "transports.md"
HEADING = "### Running your own mail for a consolidated (Postfix + Dovecot)"
SCRIPT_TIMEOUT = 240
STOP_TIMEOUT = 20
MAIL_PROGRAMS = ("/usr/sbin/dovecot", "/usr/lib/dovecot/", "/usr/lib/postfix/", "/usr/sbin/post")


@dataclass(frozen=True, slots=True)
class Block:
    kind: str  # "values", "run", "start", "stop", or "" (shown, not run)
    text: str


def blocks() -> list[Block]:
    text = DOC.read_text()
    assert HEADING in text, f"docs/transports.md has no section {HEADING!r}"
    section = text[text.index(HEADING):]
    section = section[:section.index("\n### ", len(HEADING))]
    found = []
    for info, body in re.findall(r"^```([^\n]*)\n(.*?)^```$", section, re.S | re.M):
        language, _, kind = info.partition(" ")
        assert language == "sh", f"a block of the section is not sh: {info!r}"
        assert kind in ("", "mail-values", "mail-run", "mail-start", "mail-stop"), f"unknown block {info!r}"
        found.append(Block(kind.removeprefix("mail-"), body))
    return found


def values_block(block: Block, values: dict[str, str]) -> str:
    """The values block with this test's values (each of its NAME=VALUE lines must get one)."""
    lines = []
    for line in block.text.splitlines():
        name = line.partition("=")[0]
        assert name in values, f"the section sets {name}, which the test does not know"
        lines.append(f"{name}={shlex.quote(values[name])}")
    assert set(values) == {line.partition("=")[0] for line in lines}, "the section's values changed"
    return "\n".join(lines) + "\n"


# -- the servers the blocks start -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MailRoot:
    path: Path

    @property
    def postfix_config(self) -> Path:
        return self.path / "etc" / "postfix"

    @property
    def logs(self) -> Path:
        return self.path / "var" / "log"

    def pid_files(self) -> list[Path]:
        return [self.path / "run" / "dovecot" / "master.pid",
                self.path / "var" / "spool" / "postfix" / "pid" / "master.pid"]

    def server_processes(self) -> set[int]:
        """The masters the pid files name, still running, and every process below them."""
        found: set[int] = set()
        for pid_file in self.pid_files():
            try:
                pid = int(pid_file.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
            if is_mail_server(pid):
                found.update(child for child in [pid, *_descendants(pid)] if is_mail_server(child))
        return found

    def queued(self) -> int:
        """Messages Postfix holds, not yet handed to Dovecot (as PostfixServer.queued counts them)."""
        count = 0
        for sub in ("maildrop", "incoming", "active", "deferred", "hold"):
            for _, _, files in os.walk(self.path / "var" / "spool" / "postfix" / sub):
                count += len(files)
        return count

    def wait_delivered(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while self.queued():
            assert time.monotonic() < deadline, f"Postfix still holds mail after {timeout} s:\n{self.log_tails()}"
            time.sleep(0.1)

    def log_tails(self) -> str:
        tails = "\n".join(f"-- {name}:\n{_tail(self.logs / name)}" for name in ("dovecot.log", "postfix.log"))
        return tails + self.postfix_check()

    def postfix_check(self) -> str:
        """Before the log file is set, Postfix's commands print their errors on a terminal only
        (otherwise to syslog, which this machine lacks): ask ``postfix check`` on one."""
        if (self.logs / "postfix.log").exists() or not (self.postfix_config / "main.cf").exists():
            return ""
        done = subprocess.run(["script", "-qec", f"postfix -c {self.postfix_config} check", "/dev/null"],
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, check=False)
        return f"\n-- postfix check, on a terminal:\n{done.stdout.strip() or '(nothing)'}"


def log_files(root: MailRoot) -> str:
    """The test's only addition to the documented configuration: a log file each."""
    return (f"mkdir -p {root.logs}\n"
            f"echo 'log_path = {root.logs}/dovecot.log' >> {root.path}/etc/dovecot/dovecot.conf\n"
            f"postconf -c {root.postfix_config} -e maillog_file={root.logs}/postfix.log "
            f"maillog_file_prefixes={root.path}\n")


def run_script(script: Path, output: Path, environment: dict[str, str]) -> int:
    """bash SCRIPT, its output in OUTPUT (a file: the daemons it starts may keep
    inherited descriptors open); its process group is killed after the timeout."""
    with open(output, "ab") as sink:
        process = subprocess.Popen(["bash", str(script)], stdin=subprocess.DEVNULL, stdout=sink, stderr=sink,
                                   env=environment, start_new_session=True)
        try:
            return process.wait(timeout=SCRIPT_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
            return -1


def is_mail_server(pid: int) -> bool:
    """Whether ``pid`` runs a Postfix or Dovecot program (not a pid the system gave to another since)."""
    try:
        program = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return False
    return program.startswith(MAIL_PROGRAMS)


def kill_all(pids: set[int]) -> None:
    for pid in pids:
        if is_mail_server(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def wait_gone(pids: set[int], timeout: float) -> set[int]:
    """The processes of ``pids`` still running after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        alive = {pid for pid in pids if is_mail_server(pid)}  # a zombie has no program
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


# -- the test --------------------------------------------------------------------------------


def test_the_mail_section_runs_as_written_and_carries_changes_both_ways(tmp_path: Path, agent: Agent) -> None:
    parts = blocks()
    kinds = [block.kind for block in parts]
    assert kinds.count("values") == 1 and kinds.count("start") == 1 and kinds.count("stop") == 1, kinds
    assert kinds.index("values") < kinds.index("start"), kinds
    shown = [block.text for block in parts if not block.kind]
    assert len(shown) == 3, "the blocks that are not run changed: update this test"
    check_shown_blocks(*shown)

    # Postfix's and Dovecot's unprivileged processes walk into it: not under pytest's 0700 folders.
    root = MailRoot(Path(tempfile.mkdtemp(prefix="fieldsync-mail-walkthrough-")))
    root.path.chmod(0o755)
    sites, conf = tmp_path / "srv", tmp_path / "etc-fieldsync"
    imap_port = smtp_port = free_port()
    while smtp_port == imap_port:
        smtp_port = free_port()
    # The certificate names localhost (127.0.0.1 would need IP:); the test adds no system
    # user (step 3 is not run), so the mail belongs to nobody.
    values = {"MAIL_ROOT": str(root.path), "MAIL_HOST": "localhost", "DOMAIN": MAIL_DOMAIN, "LISTEN": "127.0.0.1",
              "IMAP_PORT": str(imap_port), "SMTP_PORT": str(smtp_port), "MAIL_USER": "nobody",
              "CONF": str(conf), "SITES": str(sites)}
    prelude = "set -euxo pipefail\n" + values_block(parts[kinds.index("values")], values)
    start_at = kinds.index("start")
    setup = [block.text for block in parts[:start_at] if block.kind == "run"]
    after = [block.text for block in parts[start_at:] if block.kind == "run"]
    start, stop = parts[start_at].text, parts[kinds.index("stop")].text
    script, stop_script, output = tmp_path / "mail.sh", tmp_path / "stop.sh", tmp_path / "mail.out"
    script.write_text(prelude + "".join(setup) + log_files(root) + start + "".join(after))
    stop_script.write_text(prelude + stop)
    environment = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
                   "HOME": str(tmp_path), "COLUMNS": "200"}

    def failure(what: str) -> str:
        return f"{what}:\n{_tail(output, 40)}\n{root.log_tails()}"

    servers: set[int] = set()
    try:
        code = run_script(script, output, environment)
        servers = root.server_processes()
        assert code == 0, failure(f"the section's blocks failed (exit status {code})")
        out = output.read_text()
        assert "1|north|pump replaced" in out and "2|south" not in out, failure("north did not get hq's change")
        assert out.count("Verification: OK") == 2, failure("openssl s_client did not verify both servers")
        assert "Mail queue is empty" in out, failure("postqueue -p")

        check_files(root, conf)
        check_submission(values, conf)
        check_strict_tls(values, root)

        # The other way: north's change reaches hq through the same servers.
        with connected(sites / "north.db") as conn:
            conn.execute("UPDATE visit SET note = 'pump replaced, tested' WHERE id = 1")
        result = agent("run", sites / "north.db", "--once")
        assert result.code == 0, result.err
        root.wait_delivered()
        result = agent("run", sites / "hq.db", "--once")
        assert result.code == 0, result.err
        with connected(sites / "hq.db") as conn:
            assert conn.execute("SELECT note FROM visit WHERE id = 1").fetchone() == ("pump replaced, tested",), \
                failure("hq did not get north's change")

        servers |= root.server_processes()
        code = run_script(stop_script, output, environment)
        assert code == 0, failure(f"the stop block failed (exit status {code})")
        left = wait_gone(servers, STOP_TIMEOUT)
        assert not left, failure(f"processes {sorted(left)} still run {STOP_TIMEOUT} s after the stop block")
    finally:
        servers |= root.server_processes()
        if wait_gone(servers, 0):
            try:
                subprocess.run(["bash", str(stop_script)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, env=environment, timeout=60, check=False)
            except subprocess.TimeoutExpired:
                pass  # killed below
            kill_all(wait_gone(servers, 5))
            wait_gone(servers, 5)
        shutil.rmtree(root.path, ignore_errors=True)


def check_shown_blocks(packages: str, mail_user: str, systemd: str) -> None:
    """The blocks the test does not run: what they install is what the run used, and so on."""
    named = packages.split()
    assert named[:2] == ["apt-get", "install"], packages
    for package in named[2:]:
        status = subprocess.run(["dpkg-query", "-W", "-f", "${Status}", package], capture_output=True, text=True)
        assert status.stdout.endswith(" installed"), f"the section installs {package}, which this machine has not"
    for needed in ("postfix", "dovecot-imapd", "dovecot-lmtpd", "openssl"):
        assert needed in named, f"the section does not install {needed}"
    assert mail_user.split()[:4] == ["adduser", "--system", "--group", "--no-create-home"], mail_user
    assert mail_user.split()[-1] == "$MAIL_USER", mail_user
    assert "systemctl restart dovecot postfix" in systemd and "systemctl enable dovecot postfix" in systemd


def check_files(root: MailRoot, conf: Path) -> None:
    """Secrets are files only their owner reads; the users file holds hashes, not passwords."""
    key = root.path / "etc" / "ssl" / "private" / "fieldsync-mail.key"
    assert key.stat().st_mode & 0o777 == 0o600
    users = root.path / "etc" / "dovecot" / "users"
    assert users.stat().st_mode & 0o777 == 0o640 and users.group() == "dovecot"
    hashes = users.read_text()
    for site in ("hq", "north"):
        password_file = conf / f"{site}-mail-password"
        assert password_file.stat().st_mode & 0o777 == 0o600
        password = password_file.read_text().strip()
        assert len(password) >= 24 and password not in hashes
        assert re.search(rf"^{site}@{re.escape(MAIL_DOMAIN)}:\$6\$", hashes, re.M), hashes


def check_submission(values: dict[str, str], conf: Path) -> None:
    """No login without TLS; after login, the sites' domain only: nothing is relayed."""
    host, port = values["MAIL_HOST"], int(values["SMTP_PORT"])
    context = ssl.create_default_context(cafile=str(conf / "mail-ca.pem"))
    sender, other = f"hq@{MAIL_DOMAIN}", f"north@{MAIL_DOMAIN}"
    with smtplib.SMTP(host, port, timeout=15) as smtp:
        smtp.ehlo()
        assert not smtp.has_extn("auth"), "AUTH offered before STARTTLS"
        assert smtp.mail(sender)[0] == 530, "mail accepted before STARTTLS"
    with smtplib.SMTP(host, port, timeout=15) as smtp:
        smtp.starttls(context=context)
        smtp.ehlo()
        assert smtp.mail(sender)[0] == 250
        assert smtp.rcpt(other)[0] == 554, "mail accepted from a client that did not log in"
    with smtplib.SMTP(host, port, timeout=15) as smtp:
        smtp.starttls(context=context)
        smtp.login(sender, (conf / "hq-mail-password").read_text().strip())
        assert smtp.mail(sender)[0] == 250
        assert smtp.rcpt("someone@elsewhere.test")[0] == 554, "mail relayed to another domain"
        assert smtp.rcpt(other)[0] == 250
        smtp.rset()


def check_strict_tls(values: dict[str, str], root: MailRoot) -> None:
    """The self-signed certificate passes the strict checks newer Pythons make by default (3.13)."""
    context = ssl.create_default_context(cafile=str(root.path / "etc" / "ssl" / "certs" / "fieldsync-mail.pem"))
    context.verify_flags |= ssl.VERIFY_X509_STRICT
    with socket.create_connection((values["MAIL_HOST"], int(values["IMAP_PORT"])), timeout=15) as raw:
        with context.wrap_socket(raw, server_hostname=values["MAIL_HOST"]) as tls:
            assert tls.recv(100).startswith(b"* OK")
