"""An email site configured once with the commands, then run with no options,
against the test Postfix and Dovecot (tests/transports/postfix.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.agent.transport_worlds import MailServers, mail_servers  # noqa: F401 (fixture)
from tests.sqlfiles import connected
from tests.transports.servers import MAIL_DOMAIN

from .conftest import Agent


def _password_file(root: Path, servers: MailServers) -> Path:
    path = root / "mail-password"
    path.write_text(servers.dovecot.PASSWORD + "\n")
    path.chmod(0o600)
    return path


def _email_hq(root: Path, agent: Agent, servers: MailServers, prefix: str) -> tuple[Path, dict[str, str]]:
    dovecot, postfix = servers.dovecot, servers.postfix
    for user in ("hq", "north"):
        dovecot.add_user(prefix + user)
    password = _password_file(root, servers)
    hq = root / "hq.db"
    result = agent("init", hq, "--name", "hq", "--role", "consolidated", "--transport", "email",
                   "--address", dovecot.url(prefix + "hq"), "--reply-address", f"mailto:{prefix}hq@{MAIL_DOMAIN}",
                   "-O", "smtp_host=127.0.0.1", "-O", f"smtp_port={postfix.port}",
                   "-O", f"ca_file={dovecot.certificates.ca_file}", "-O", f"password_file={password}")
    assert result.code == 0, result.err
    with connected(hq) as conn:
        conn.execute("CREATE TABLE customer (id INTEGER PRIMARY KEY, region TEXT NOT NULL, name TEXT)")
        conn.executemany("INSERT INTO customer VALUES (?, ?, ?)", [(1, "north", "Ada"), (2, "south", "Bo")])
    assert agent("publication", "create", hq, "territory", "customer:id,region,name@region").code == 0
    return hq, {"password": str(password)}


def test_an_extracted_email_remote_runs_with_no_options(tmp_path: Path, agent: Agent,
                                                        mail_servers: MailServers) -> None:  # noqa: F811
    """Finding 2 and 3 of the email field trial: extraction gave the remote
    ``mailto:`` as its inbox and hq's IMAP URL as where to send, and nothing
    kept the SMTP settings, so every run needed --address and -O."""
    prefix = "xs-"
    hq, files = _email_hq(tmp_path, agent, mail_servers, prefix)
    result = agent("remote", "add", hq, "north", "--transport", "email",
                   "--address", f"mailto:{prefix}north@{MAIL_DOMAIN}", "--inbox", mail_servers.dovecot.url(prefix + "north"),
                   "--subscribe", "territory=north")
    assert result.code == 0, result.err
    north = tmp_path / "north.db"
    result = agent("extract", hq, "north", north, "-O", f"password_file={files['password']}")
    assert result.code == 0, result.err

    status = agent("status", north)
    assert f"inbox {mail_servers.dovecot.url(prefix + 'north')}" in status.out.replace("\n", " ")
    assert f"peers send to mailto:{prefix}north@{MAIL_DOMAIN}" in status.out
    assert f"mailto:{prefix}hq@{MAIL_DOMAIN}" in status.out  # where north sends to hq

    for database in (hq, north, hq, north):
        result = agent("run", database, "--once")
        assert result.code == 0, result.err
        mail_servers.postfix.wait_delivered()
    with connected(north) as conn:
        assert conn.execute("SELECT id, name FROM customer").fetchall() == [(1, "Ada")]
    with connected(north) as conn:
        conn.execute("UPDATE customer SET name = 'Ada L.' WHERE id = 1")
    for database in (north, hq):
        assert agent("run", database, "--once").code == 0
        mail_servers.postfix.wait_delivered()
    with connected(hq) as conn:
        assert conn.execute("SELECT name FROM customer WHERE id = 1").fetchone() == ("Ada L.",)


@pytest.mark.parametrize("command, complaint", [
    (("init", "{root}/a.db", "--name", "a", "--role", "remote", "--transport", "email",
      "--address", "mailto:a@example.com"), "inbox is its IMAP mailbox"),
    (("init", "{root}/a.db", "--name", "a", "--role", "remote", "--transport", "email",
      "--address", "imaps://a@mail.example.com/INBOX", "--reply-address", "imaps://a@mail.example.com/INBOX"),
     "not to its IMAP mailbox"),
    (("remote", "add", "{hq}", "south", "--transport", "email", "--address", "imaps://south@mail.example.com/"),
     "not to its IMAP mailbox"),
    (("remote", "add", "{hq}", "south", "--transport", "email", "--address", "mailto:south@example.com",
      "--inbox", "mailto:south@example.com"), "inbox is its IMAP mailbox"),
    (("remote", "add", "{hq}", "south", "--transport", "email", "--address", "mailto:south@example.com",
      "-O", "smtp_password=hunter2"), "has no option 'smtp_password'"),
    (("site", "set", "{hq}", "--address", "mailto:hq@example.com"), "inbox is its IMAP mailbox"),
    (("site", "set", "{hq}", "-O", "password=hunter2"), "no option 'password'"),
])
def test_a_confused_address_or_a_secret_is_refused_when_configured(tmp_path: Path, agent: Agent, command: tuple,
                                                                   complaint: str) -> None:
    hq = tmp_path / "hq.db"
    assert agent("init", hq, "--name", "hq", "--role", "consolidated", "--transport", "email",
                 "--address", "imaps://hq@mail.example.com/INBOX", "--reply-address", "mailto:hq@example.com").code == 0
    before = agent("status", hq, "--json").out
    result = agent(*(part.format(root=tmp_path, hq=hq) for part in command))
    assert result.code in (1, 2) and len(result.err_lines) == 1 and complaint in result.err, result.err
    assert agent("status", hq, "--json").out == before
    assert not (tmp_path / "a.db").exists()


def test_an_email_remote_without_its_own_inbox_is_not_extracted(tmp_path: Path, agent: Agent) -> None:
    hq = tmp_path / "hq.db"
    assert agent("init", hq, "--name", "hq", "--role", "consolidated", "--transport", "email",
                 "--address", "imaps://hq@mail.example.com/INBOX", "--reply-address", "mailto:hq@example.com").code == 0
    assert agent("remote", "add", hq, "north", "--transport", "email", "--address", "mailto:north@example.com").code == 0
    result = agent("extract", hq, "north", tmp_path / "north.db")
    assert result.code == 2 and len(result.err_lines) == 1 and "--inbox" in result.err, result.err
    assert not (tmp_path / "north.db").exists()
    assert agent("remote", "set", hq, "north", "--inbox", "imaps://north@mail.example.com/INBOX").code == 0
    assert agent("extract", hq, "north", tmp_path / "north.db").code == 0
