"""The scenario World over the folder, sftp and email transports.

Rules of this file:
* The servers are the real ones of ``tests/transports/servers.py`` and
  ``postfix.py`` (OpenSSH sshd, Dovecot, Postfix), started on 127.0.0.1 by the fixtures below and
  failing the test, never skipping it, when they cannot start.
* Faults are applied where the transport keeps its files, between agent
  runs, the way ``World`` does for folders: an sftp inbox is a directory on
  the server (the test server serves this machine's file system, so the
  test touches the same directory), an email inbox is a Dovecot user's
  Maildir, where a delivery lands and where a lost email is removed.
* A :class:`Medium` is one transport seen from the test: where each site's
  inbox is, how its agent is configured, and what is waiting in an inbox as
  message files (name and bytes, whatever carries them).
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.runner import RunOptions
from codec.errors import BadFileName
from codec.names import MessageName
from transports.email import announced_name, build_email, read_attachment
from tests.transports.postfix import PostfixServer
from tests.transports.servers import MAIL_DOMAIN, DovecotServer, ServerFailed, SshServer

from .world import World

TRANSPORTS = ("folder", "sftp", "email")


# -- servers ---------------------------------------------------------------------------


def _start(server):
    try:
        return server.start()
    except ServerFailed as error:
        server.close()
        pytest.fail(str(error), pytrace=False)


@pytest.fixture(scope="module")
def sshd():
    server = _start(SshServer())
    yield server
    server.close()


@dataclass(frozen=True, slots=True)
class MailServers:
    dovecot: DovecotServer
    postfix: PostfixServer


@pytest.fixture(scope="module")
def mail_servers():
    """Dovecot, and Postfix submitting into it (STARTTLS, SASL through Dovecot)."""
    dovecot = _start(DovecotServer())
    try:
        postfix = _start(PostfixServer(dovecot))
        try:
            yield MailServers(dovecot, postfix)
        finally:
            postfix.close()
    finally:
        dovecot.close()


# -- what an inbox holds -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Waiting:
    """One message file waiting in an inbox (``where`` is the transport's own file)."""

    name: str
    data: bytes
    where: Path

    @property
    def is_data(self) -> bool:
        return ".d." in self.name


class Medium:
    """One transport as the scenario tests see it."""

    transport = "folder"

    def __init__(self, root: Path) -> None:
        self.root = root

    def folder(self, site: str) -> Path:
        return self.root / "inbox" / site

    def make_inbox(self, site: str) -> None:
        self.folder(site).mkdir(parents=True, exist_ok=True)

    def address(self, site: str) -> str:
        """Where peers send to ``site``."""
        return str(self.folder(site))

    def inbox_address(self, site: str) -> str:
        """Where ``site`` receives."""
        return str(self.folder(site))

    def transport_options(self, site: str) -> dict:
        return {}

    def run_options(self, site: str, options: RunOptions) -> RunOptions:
        return dataclasses.replace(options, transport=self.transport, address=self.inbox_address(site),
                                   transport_options=self.transport_options(site))

    def waiting(self, site: str) -> list[Waiting]:
        """The files waiting in ``site``'s inbox, in name order (dot-names are sends in progress)."""
        return sorted((Waiting(path.name, path.read_bytes(), path) for path in self.folder(site).iterdir()
                       if path.is_file() and not path.name.startswith(".")), key=lambda item: item.name)

    def deliver(self, site: str, name: str, data: bytes) -> None:
        """``name`` arrives in ``site``'s inbox, as the transport delivers a file."""
        (self.folder(site) / name).write_bytes(data)

    def lose(self, item: Waiting) -> None:
        item.where.unlink()

    def wait_delivered(self) -> None:
        """Return once what the sites sent is in the inboxes (a mail server delivers a moment later)."""


class FolderMedium(Medium):
    transport = "folder"


class SftpMedium(Medium):
    """Each inbox is a directory on the sshd server, addressed by sftp://."""

    transport = "sftp"

    def __init__(self, root: Path, sshd: SshServer) -> None:
        super().__init__(root)
        self.sshd = sshd

    def address(self, site: str) -> str:
        return self.sshd.address(self.folder(site))

    def inbox_address(self, site: str) -> str:
        return self.address(site)

    def transport_options(self, site: str) -> dict:
        return {"key_file": str(self.sshd.client_key), "known_hosts": str(self.sshd.known_hosts)}


class EmailMedium(Medium):
    """Each site is a Dovecot user; files travel as emails through Postfix.

    Peers send to ``mailto:USER@example.test``; a site reads its
    ``imaps://USER@127.0.0.1:PORT/INBOX``.  What waits in an inbox is read
    from the user's Maildir, as Dovecot does.
    """

    transport = "email"
    _worlds = itertools.count(1)

    def __init__(self, root: Path, servers: MailServers) -> None:
        super().__init__(root)
        self.servers = servers
        self.prefix = f"w{next(self._worlds)}-"
        self.password_file = root / "mail-password"
        root.mkdir(parents=True, exist_ok=True)
        self.password_file.write_text(servers.dovecot.PASSWORD + "\n")
        self.password_file.chmod(0o600)

    def user(self, site: str) -> str:
        return self.prefix + site

    def email(self, site: str) -> str:
        return f"{self.user(site)}@{MAIL_DOMAIN}"

    def make_inbox(self, site: str) -> None:
        self.servers.dovecot.add_user(self.user(site))

    def address(self, site: str) -> str:
        return f"mailto:{self.email(site)}"

    def inbox_address(self, site: str) -> str:
        return self.servers.dovecot.url(self.user(site))

    def transport_options(self, site: str) -> dict:
        return {"smtp_host": "127.0.0.1", "smtp_port": self.servers.postfix.port, "smtp_tls": "starttls",
                "from_address": self.email(site), "password_file": str(self.password_file),
                "ca_file": str(self.servers.dovecot.certificates.ca_file)}

    def waiting(self, site: str) -> list[Waiting]:
        found = []
        maildir = self.servers.dovecot.maildir(self.user(site))
        for sub in ("new", "cur"):
            for path in (maildir / sub).iterdir():
                flags = path.name.partition(":2,")[2]
                if "T" in flags:  # marked deleted, waiting for an expunge
                    continue
                raw = path.read_bytes()
                name = announced_name(raw.split(b"\r\n\r\n", 1)[0] + b"\r\n\r\n")
                if name is not None:
                    found.append(Waiting(name, read_attachment(raw, name), path))
        return sorted(found, key=lambda item: (item.name, item.where.name))

    def wait_delivered(self) -> None:
        self.servers.postfix.wait_delivered()

    def deliver(self, site: str, name: str, data: bytes) -> None:
        try:
            sender = self.email(MessageName.parse(name).sender)
        except BadFileName:
            sender = f"someone@{MAIL_DOMAIN}"
        self.servers.dovecot.deliver(self.user(site), build_email(name, data, sender, self.email(site)))


def make_medium(transport: str, root: Path, request: pytest.FixtureRequest) -> Medium:
    """The medium for ``transport``; starts (once per module) the servers it needs."""
    if transport == "folder":
        return FolderMedium(root)
    if transport == "sftp":
        return SftpMedium(root, request.getfixturevalue("sshd"))
    if transport == "email":
        return EmailMedium(root, request.getfixturevalue("mail_servers"))
    raise ValueError(transport)


# -- the world -------------------------------------------------------------------------------


class TransportWorld(World):
    """A :class:`World` whose sites replicate through ``medium``'s transport."""

    def __init__(self, root: Path, medium: Medium, **fields: object) -> None:
        self.medium = medium
        self.transport = medium.transport
        super().__init__(root, **fields)

    def make_inbox(self, site: str) -> None:
        self.medium.make_inbox(site)

    def address(self, site: str) -> str:
        return self.medium.address(site)

    def run_options(self, site: str) -> RunOptions:
        return self.medium.run_options(site, self.options)

    async def run(self, site: str, **changes: object):
        report = await super().run(site, **changes)
        self.medium.wait_delivered()  # the next site's run (or a fault) sees what this one sent
        return report

    def waiting_names(self, site: str) -> list[str]:
        return [item.name for item in self.medium.waiting(site)]

    # -- faults, between runs ------------------------------------------------------------

    def waiting(self, site: str, kind: str | None = None) -> list[Waiting]:
        """What waits in ``site``'s inbox; ``kind="d"`` data, ``"c"`` control messages only."""
        items = self.medium.waiting(site)
        if kind is not None:
            items = [item for item in items if f".{kind}." in item.name]
        return items

    def lose(self, item: Waiting) -> None:
        self.medium.lose(item)

    def deliver(self, site: str, name: str, data: bytes) -> None:
        self.medium.deliver(site, name, data)

    def replace(self, site: str, item: Waiting, data: bytes) -> None:
        """``item`` arrives damaged: the inbox holds ``data`` under its name instead."""
        self.medium.lose(item)
        self.medium.deliver(site, item.name, data)


def quarantine_reasons(world: World, site: str) -> list[str]:
    folder = world.root / f"{site}.db.agent" / "quarantine"
    return sorted(path.read_text() for path in folder.glob("*.reason.json"))

