"""A real Postfix for the email tests, started on 127.0.0.1 next to the test Dovecot.

Rules of this file:
* The server is Debian's ``postfix``, run as ``postfix -c DIR start-fg``
  with its own config_directory, queue_directory and data_directory in a
  fresh temporary folder made from ``fixtures/servers/postfix-*.template``;
  the machine's Postfix configuration and service are never read or used.
* Submission is on a free port with STARTTLS required and SASL through the
  test Dovecot's auth socket; every address at the mail domain is delivered
  into that Dovecot's Maildirs over LMTP.  Nothing leaves for other domains.
* A server that does not come up raises ``ServerFailed`` with the tail of its
  log, so a test fails with the reason; nothing here skips.
"""

from __future__ import annotations

import os
import re
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from .servers import (MAIL_DOMAIN, START_TIMEOUT, DovecotServer, ServerFailed, _render, _start_in_foreground,
                      _stop_process_tree, _tail, free_port)

POSTFIX = "/usr/sbin/postfix"


class PostfixServer:
    """Postfix on 127.0.0.1:``port``: STARTTLS + AUTH (Dovecot's), delivering into ``dovecot``'s Maildirs.

    ``tls`` is ``"starttls"`` like the fixture SMTP servers; ``certificates``
    are the Dovecot's (one CA for both servers).
    """

    tls = "starttls"

    def __init__(self, dovecot: DovecotServer, base: Path | None = None, port: int | None = None) -> None:
        self.dovecot = dovecot
        self.certificates = dovecot.certificates
        self.base = Path(base or tempfile.mkdtemp(prefix="fieldsync-postfix-"))
        self.base.chmod(0o755)  # Postfix's unprivileged processes walk into it
        self.port = port or free_port()
        self.config = self.base / "conf"
        self.log = self.base / "postfix.log"
        self._process: subprocess.Popen | None = None
        self.config.mkdir(exist_ok=True)
        for directory in ("queue", "data"):
            (self.base / directory).mkdir(exist_ok=True)
        owner = pwd.getpwnam("postfix")
        os.chown(self.base / "data", owner.pw_uid, owner.pw_gid)
        values = dict(base=self.base, port=self.port, mail_domain=MAIL_DOMAIN,
                      lmtp_socket=dovecot.base / "run" / "lmtp", auth_socket=dovecot.base / "run" / "auth-postfix",
                      cert_file=self.certificates.cert_file, key_file=self.certificates.key_file)
        _render("postfix-main.cf.template", self.config / "main.cf", **values)
        _render("postfix-master.cf.template", self.config / "master.cf", **values)

    def start(self) -> "PostfixServer":
        if self._process is not None and self._process.poll() is None:
            return self
        _start_in_foreground(self, [POSTFIX, "-c", str(self.config), "start-fg"], self.base / "postfix.stderr",
                             "postfix", self.port, b"220 ", "postfix")
        return self

    def stop(self) -> None:
        """Stop the master and every Postfix process: all connections drop; queued mail stays queued."""
        if self._process is None:
            return
        subprocess.run([POSTFIX, "-c", str(self.config), "stop"], stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30, check=False)
        try:
            self._process.wait(timeout=START_TIMEOUT)
        except subprocess.TimeoutExpired:
            pass
        _stop_process_tree(self._process)
        self._process = None

    def restart(self) -> "PostfixServer":
        self.stop()
        return self.start()

    @property
    def logins(self) -> list[str]:
        """The SASL logins Postfix accepted, in order (from its log)."""
        try:
            text = self.log.read_text(errors="replace")
        except FileNotFoundError:
            return []
        return re.findall(r"sasl_username=(\S+)", text)

    def queued(self) -> int:
        """Messages in the queue (not yet delivered to Dovecot)."""
        count = 0
        for sub in ("incoming", "active", "deferred", "maildrop", "hold"):
            for _, _, files in os.walk(self.base / "queue" / sub):
                count += len(files)
        return count

    def wait_delivered(self, timeout: float = 30.0) -> None:
        """Wait until the queue is empty (everything handed to Dovecot); ServerFailed if not."""
        deadline = time.monotonic() + timeout
        while self.queued():
            if time.monotonic() > deadline:
                raise ServerFailed(f"postfix still holds {self.queued()} messages after {timeout:.0f} s:\n"
                                   f"{_tail(self.log)}")
            time.sleep(0.1)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.base, ignore_errors=True)
