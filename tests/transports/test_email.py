"""The email transport against real servers: conformance through Postfix into Dovecot, then what only
email has (against aiosmtpd where a test needs an SMTP server that misbehaves on purpose)."""

from __future__ import annotations

import asyncio
import dataclasses
import email
import email.policy
import imaplib
import itertools
import logging
import random
import re
import ssl
import time
from email.message import EmailMessage
from urllib.parse import urlsplit

import pytest

import transports.registry
from transports import BadAddress, BadTransportOptions, TransportRefused, TransportUnavailable, create_transport
from transports._imap import ImapSession
from transports.email import EmailTransport, build_email, oversize

from .postfix import PostfixServer
from .conformance import TransportConformance, message_name, receive_all, receive_wanted, received, record_reads
from .servers import (
    MAIL_DOMAIN,
    DovecotServer,
    ServerFailed,
    SmtpServer,
    TcpProxy,
    abandon_smtp_transaction,
)

PASSWORD_VARIABLE = "FIELDSYNC_TEST_MAIL_PASSWORD"
_users = itertools.count(1)


def new_user(dovecot, label: str = "site") -> str:
    user = f"{label}{next(_users)}"
    dovecot.add_user(user)
    return user


def user_of(address: str) -> str:
    return urlsplit(address).username


class DeliveredEmailTransport(EmailTransport):
    """The email transport whose ``send`` returns once Postfix has handed the mail to Dovecot.

    A real MTA accepts a message (250) and delivers it a moment later; the
    conformance suite reads right after sending, so it waits for that moment.
    """

    def __init__(self, postfix: PostfixServer, **options) -> None:
        super().__init__(**options)
        self._postfix = postfix

    async def _send(self, address: str, name: str, data: bytes) -> None:
        await super()._send(address, name, data)
        await asyncio.to_thread(self._postfix.wait_delivered)


class TestEmailConformance(TransportConformance):
    @pytest.fixture(autouse=True)
    def _servers(self, dovecot, postfix, monkeypatch) -> None:
        self.dovecot, self.smtpd = dovecot, postfix
        monkeypatch.setenv(PASSWORD_VARIABLE, dovecot.PASSWORD)

    @pytest.fixture
    def make_transport(self, dovecot, postfix):
        return lambda: DeliveredEmailTransport(
            postfix, smtp_host="127.0.0.1", smtp_port=postfix.port, smtp_tls="starttls",
            from_address=f"hq@{MAIL_DOMAIN}", password_env=PASSWORD_VARIABLE,
            ca_file=str(dovecot.certificates.ca_file))

    @pytest.fixture
    def inbox(self, dovecot) -> str:
        return dovecot.url(new_user(dovecot, "hq"))

    @pytest.fixture
    def peer_inbox(self, dovecot) -> str:
        return dovecot.url(new_user(dovecot, "field"))

    def send_address(self, inbox: str) -> str:
        return f"mailto:{user_of(inbox)}@{MAIL_DOMAIN}"

    async def place_raw_file(self, address: str, name: str, data: bytes) -> None:
        recipient = f"{user_of(address)}@{MAIL_DOMAIN}"
        self.dovecot.deliver(user_of(address), build_email(name, data, f"hq@{MAIL_DOMAIN}", recipient))

    async def leave_interrupted_send(self, address: str, name: str, data: bytes) -> None:
        recipient = f"{user_of(address)}@{MAIL_DOMAIN}"
        whole = build_email(name, data, f"hq@{MAIL_DOMAIN}", recipient)
        await abandon_smtp_transaction(self.smtpd, "hq", recipient, whole[: len(whole) // 2])


# -- helpers --------------------------------------------------------------------------------


SENDER = f"hq@{MAIL_DOMAIN}"


def transport_for(dovecot, smtp, **options) -> EmailTransport:
    settings = dict(smtp_host="127.0.0.1", smtp_port=smtp.port, smtp_tls=smtp.tls, from_address=SENDER,
                    password_env=PASSWORD_VARIABLE, ca_file=str(dovecot.certificates.ca_file),
                    retries=2, retry_delay=0.05, timeout=10)
    settings.update(options)
    return EmailTransport(**settings)


def mailto(user: str) -> str:
    return f"mailto:{user}@{MAIL_DOMAIN}"


def one_line_error(error: BaseException) -> str:
    text = str(error)
    assert text and "\n" not in text
    return text


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-")


def plain_email(subject: str, body: str = "hello\n", **headers: str) -> bytes:
    message = EmailMessage(policy=email.policy.SMTP)
    message["From"] = f"someone@{MAIL_DOMAIN}"
    message["To"] = f"site@{MAIL_DOMAIN}"
    message["Subject"] = subject
    message["Message-ID"] = f"<{slug(subject)}@{MAIL_DOMAIN}>"
    for key, value in headers.items():
        message[key.replace("_", "-")] = value
    message.set_content(body)
    return message.as_bytes()


def mailbox_snapshot(dovecot, user: str, mailbox: str = "INBOX") -> dict[str, tuple[frozenset[str], bytes]]:
    """Every message in ``mailbox`` by Message-ID: (flags without \\Recent, bytes), read by another client."""
    context = ssl.create_default_context(cafile=str(dovecot.certificates.ca_file))
    with imaplib.IMAP4_SSL("127.0.0.1", dovecot.imaps_port, ssl_context=context) as client:
        client.login(user, dovecot.PASSWORD)
        status, _ = client.select(mailbox, readonly=True)
        assert status == "OK", mailbox
        status, data = client.uid("FETCH", "1:*", "(FLAGS BODY.PEEK[])")
        snapshot = {}
        for part in data:
            if not isinstance(part, tuple):
                continue
            flags = frozenset(flag.decode() for flag in imaplib.ParseFlags(part[0])) - {"\\Recent"}
            message_id = email.message_from_bytes(part[1])["Message-ID"]
            snapshot[message_id] = (flags, part[1])
        client.logout()
    return snapshot


async def snapshot(dovecot, user: str, mailbox: str = "INBOX"):
    return await asyncio.to_thread(mailbox_snapshot, dovecot, user, mailbox)


@pytest.fixture(autouse=True)
def _password(dovecot, monkeypatch) -> None:
    monkeypatch.setenv(PASSWORD_VARIABLE, dovecot.PASSWORD)


@pytest.fixture
def user(dovecot) -> str:
    return new_user(dovecot)


@pytest.fixture
async def transport(dovecot, smtpd):
    async with transport_for(dovecot, smtpd) as transport:
        yield transport


def _started(server):
    try:
        return server.start()
    except ServerFailed as error:
        server.close()
        pytest.fail(str(error), pytrace=False)


@pytest.fixture
def own_smtpd(dovecot):
    """An SMTP server of this test's own, which it may stop or make refuse mail."""
    server = _started(SmtpServer(dovecot))
    yield server
    server.close()


@pytest.fixture
def own_mail():
    """Dovecot and SMTP of this test's own, which the test may stop and start again."""
    dovecot = _started(DovecotServer())
    dovecot.add_user("hq")
    smtp = SmtpServer(dovecot)
    try:
        _started(smtp)
        yield dovecot, smtp
    finally:
        smtp.close()
        dovecot.close()


# -- addresses and options ------------------------------------------------------------------


@pytest.mark.parametrize("address, normal", [
    ("mailto:field1@example.com", "mailto:field1@example.com"),
    ("field1@example.com", "mailto:field1@example.com"),
    ("MAILTO:field1%2Bfs@example.com", "mailto:field1+fs@example.com"),
    ("imaps://field1@mail.example.com/INBOX", "imaps://field1@mail.example.com:993/INBOX"),
    ("imaps://field1%40example.com@mail.example.com:1993", "imaps://field1%40example.com@mail.example.com:1993/INBOX"),
    ("imap://hq@mail.example.com/fieldsync%20in", "imap://hq@mail.example.com:143/fieldsync%20in"),
])
def test_addresses_parse_and_normalise(address, normal) -> None:
    transport = EmailTransport()
    assert transport.check_address(address) == normal
    assert transport.check_address(normal) == normal


@pytest.mark.parametrize("address, complaint", [
    ("imaps://hq:secret@mail.example.com/INBOX", "password"),
    ("imaps://mail.example.com/INBOX", "names no user"),
    ("imaps://hq@mail.example.com/INBOX?x=1", "'?'"),
    ("mailto:field1@example.com?subject=hi", "'?'"),
    ("field1", "not a plain email address"),
    ("field1@example.com\r\nBcc: x@evil.test", "not a plain email address"),
    ("Field One <field1@example.com>", "not a plain email address"),
    ("pop3://hq@mail.example.com", "not a plain email address"),
    ("imaps://hq@mail.example.com/in%0Abox", "control character"),
    ("imaps://hq@mail.example.com/in%7Fbox", "control character"),
])
def test_bad_addresses_are_refused(address, complaint) -> None:
    with pytest.raises(BadAddress, match=re.escape(complaint)) as caught:
        EmailTransport().check_address(address)
    assert "secret" not in str(caught.value)


async def test_send_wants_mailto_and_receive_wants_an_imap_url(transport, dovecot, user) -> None:
    with pytest.raises(BadAddress, match="recipient's email address"):
        await transport.send(dovecot.url(user), message_name(1), b"x")
    with pytest.raises(BadAddress, match="IMAP mailbox"):
        await receive_all(transport, mailto(user))
    with pytest.raises(BadAddress, match="IMAP mailbox"):
        await transport.wait_incoming(mailto(user), 0)


@pytest.mark.parametrize("options", [
    {"smtp_tls": "ssl"}, {"smtp_port": 0}, {"from_address": "hq"}, {"password_file": "a", "password_env": "B"},
    {"imap_password_file": "a", "imap_password_env": "B"}, {"smtp_password_env": "1X"},
    {"move_to": ""}, {"quarantine_folder": "a\nb"}, {"max_message_size": -1}, {"max_message_size": 9999}, {"idle": "yes"}, {"timeout": 0},
    {"retries": 1.5},
])
def test_bad_options_are_refused(options) -> None:
    with pytest.raises(ValueError):
        EmailTransport(**options)


def test_the_registry_builds_it(monkeypatch) -> None:
    # Keep the registry's cache of loaded classes as it was: test_registry checks
    # what happens when a built-in's module cannot be imported.
    monkeypatch.setattr(transports.registry, "_loaded", dict(transports.registry._loaded))
    transport = create_transport("email", smtp_host="mail.example.com", from_address="hq@example.com")
    assert isinstance(transport, EmailTransport) and transport.smtp_port == 587
    with pytest.raises(BadTransportOptions):
        create_transport("email", password="secret")


async def test_a_transport_without_smtp_settings_cannot_send(dovecot, user) -> None:
    async with EmailTransport(password_env=PASSWORD_VARIABLE) as receive_only:
        with pytest.raises(TransportRefused, match="smtp_host and from_address"):
            await receive_only.send(mailto(user), message_name(1), b"x")


# -- the email on the wire ----------------------------------------------------------------------


async def test_each_file_travels_as_one_email_with_the_file_attached(transport, dovecot, user) -> None:
    name, data = message_name(7), bytes(range(256)) * 40
    await transport.send(mailto(user), name, data)
    [raw] = dovecot.files(user).values()
    message = email.message_from_bytes(raw, policy=email.policy.default)
    assert message["X-Fieldsync-Message"] == name
    assert name in message["Subject"]
    assert message["From"] == SENDER and message["To"] == f"{user}@{MAIL_DOMAIN}"
    assert message["Auto-Submitted"] == "auto-generated" and message["Message-ID"]
    [attachment] = message.iter_attachments()
    assert attachment.get_filename() == name
    assert attachment.get_content_type() == "application/octet-stream"
    assert attachment.get_content() == data
    assert max(len(line) for line in raw.splitlines()) <= 998


async def test_implicit_tls_smtp_and_starttls_imap(dovecot, smtpd_tls, user, tmp_path) -> None:
    password_file = tmp_path / "mail-password"
    password_file.write_text(dovecot.PASSWORD + "\n")
    password_file.chmod(0o600)
    async with transport_for(dovecot, smtpd_tls, password_env=None, password_file=str(password_file)) as transport:
        logins = len(smtpd_tls.logins)
        await transport.send(mailto(user), message_name(1), b"over implicit TLS")
        assert smtpd_tls.logins[logins:] == [SENDER]
        inbox = dovecot.url(user, implicit_tls=False)
        assert inbox.startswith("imap://")
        [incoming] = await receive_all(transport, inbox)
        assert incoming.data == b"over implicit TLS"
        await transport.ack(incoming)
        assert await receive_all(transport, inbox) == []


# -- other mail is left exactly as it was ------------------------------------------------------


async def test_a_mailbox_with_other_mail_keeps_it_untouched(transport, dovecot, user) -> None:
    dovecot.deliver(user, plain_email("lunch on friday"))
    dovecot.deliver(user, plain_email("read and flagged"), flags="FS")
    dovecot.deliver(user, plain_email("deleted by its owner, not yet expunged"), flags="ST")
    dovecot.deliver(user, plain_email("a draft"), flags="D")
    lookalike = EmailMessage(policy=email.policy.SMTP)
    lookalike["Subject"] = f"fieldsync {message_name(9)}"
    lookalike["Message-ID"] = f"<lookalike@{MAIL_DOMAIN}>"
    lookalike.set_content("forwarded by a person, without fieldsync's header")
    lookalike.add_attachment(b"not ours", maintype="application", subtype="octet-stream", filename=message_name(9))
    dovecot.deliver(user, lookalike.as_bytes())
    before = await snapshot(dovecot, user)
    assert len(before) == 5

    inbox = dovecot.url(user)
    for last in (1, 2):
        await transport.send(mailto(user), message_name(last), b"%d" % last)
    got = await receive_all(transport, inbox)
    assert [incoming.name for incoming in got] == [message_name(1), message_name(2)]
    ours = {message_id for message_id in (await snapshot(dovecot, user)) if message_id not in before}
    assert all("\\Seen" not in flags for message_id, (flags, _) in (await snapshot(dovecot, user)).items()
               if message_id in ours)  # read with BODY.PEEK
    for incoming in got:
        await transport.ack(incoming)
    assert await receive_all(transport, inbox) == []

    after = await snapshot(dovecot, user)
    assert after == before  # same messages, same flags, same bytes
    assert sorted(after[f"<read-and-flagged@{MAIL_DOMAIN}>"][0]) == ["\\Flagged", "\\Seen"]
    assert "\\Deleted" in after[f"<deleted-by-its-owner-not-yet-expunged@{MAIL_DOMAIN}>"][0]
    assert after[f"<lunch-on-friday@{MAIL_DOMAIN}>"][0] == frozenset()


# -- duplicates and unusable mail -----------------------------------------------------------------


async def test_copies_of_one_name_are_each_read_before_they_are_removed(transport, dovecot, user) -> None:
    """A receive yields the newest copy of a name; its ack removes that copy
    only, never one it did not read (anyone can mail a file under any name)."""
    name = message_name(3)
    first = build_email(name, b"first copy", SENDER, f"{user}@{MAIL_DOMAIN}")
    dovecot.deliver(user, first)
    dovecot.deliver(user, first)  # delivered twice, as after a send retried by a dropped connection
    dovecot.deliver(user, build_email(name, b"newest copy", SENDER, f"{user}@{MAIL_DOMAIN}"))
    inbox = dovecot.url(user)
    seen = []
    for _ in range(3):
        [incoming] = await receive_all(transport, inbox)
        seen.append(incoming.data)
        await transport.ack(incoming)
    assert seen == [b"newest copy", b"first copy", b"first copy"]
    assert await receive_all(transport, inbox) == []
    assert dovecot.files(user) == {}


def _unusable_mail(user: str) -> dict[str, bytes]:
    recipient = f"{user}@{MAIL_DOMAIN}"
    no_attachment = EmailMessage(policy=email.policy.SMTP)
    no_attachment["X-Fieldsync-Message"] = message_name(11)
    no_attachment["Subject"] = "no attachment"
    no_attachment["Message-ID"] = f"<no-attachment@{MAIL_DOMAIN}>"
    no_attachment.set_content("the file is missing")
    renamed = EmailMessage(policy=email.policy.SMTP)
    renamed["X-Fieldsync-Message"] = message_name(12)
    renamed["Message-ID"] = f"<renamed@{MAIL_DOMAIN}>"
    renamed.set_content("attachment under another name")
    renamed.add_attachment(b"data", maintype="application", subtype="octet-stream", filename=message_name(13))
    bad_name = build_email(message_name(14), b"data", SENDER, recipient).replace(
        message_name(14).encode(), b"../../etc/passwd.fsm......................................................")
    twice = build_email(message_name(15), b"data", SENDER, recipient).replace(
        b"X-Fieldsync-Message:", b"X-Fieldsync-Message: other\r\nX-Fieldsync-Message:", 1)
    too_large = build_email(message_name(16), b"z" * 20_000, SENDER, recipient)
    return {"no attachment": no_attachment.as_bytes(), "attachment is named": renamed.as_bytes(),
            "not a usable file name": bad_name, "repeated": twice, "over the max_message_size": too_large}


async def test_unusable_fieldsync_mail_is_skipped_logged_once_and_left(dovecot, smtpd, user, caplog) -> None:
    for raw in _unusable_mail(user).values():
        dovecot.deliver(user, raw)
    dovecot.deliver(user, build_email(message_name(1), b"fine", SENDER, f"{user}@{MAIL_DOMAIN}"))
    before = dovecot.files(user)
    inbox = dovecot.url(user)
    async with transport_for(dovecot, smtpd, max_message_size=10_000) as transport:
        with caplog.at_level(logging.WARNING, logger="transports.email"):
            for _ in range(2):
                assert await received(transport, inbox) == {message_name(1): b"fine"}
        [incoming] = await receive_all(transport, inbox)
        await transport.ack(incoming)
    warnings = [record.getMessage() for record in caplog.records if record.name.startswith("transports")]
    for reason in _unusable_mail(user):
        assert sum(reason in warning for warning in warnings) == 1, (reason, warnings)
    # Too large is the caller's to report (base.Refusal); without a caller's
    # sink the transport warns once itself.
    assert all(("left in place" in warning or "not read" in warning) and "\n" not in warning
               for warning in warnings)
    assert len(dovecot.files(user)) == len(before) - 1


async def test_unusable_fieldsync_mail_goes_to_the_quarantine_folder(dovecot, smtpd, user) -> None:
    unusable = _unusable_mail(user)
    for raw in unusable.values():
        dovecot.deliver(user, raw)
    dovecot.deliver(user, plain_email("not fieldsync's"))
    inbox = dovecot.url(user)
    async with transport_for(dovecot, smtpd, max_message_size=10_000, quarantine_folder="Quarantine") as transport:
        await transport.send(mailto(user), message_name(1), b"fine")
        assert await received(transport, inbox) == {message_name(1): b"fine"}
        [incoming] = await receive_all(transport, inbox)
        await transport.ack(incoming)
    assert list(await snapshot(dovecot, user)) == [f"<not-fieldsync-s@{MAIL_DOMAIN}>"]
    quarantined = await snapshot(dovecot, user, "Quarantine")
    assert len(quarantined) == len(unusable)
    assert all("\\Seen" not in flags for flags, _ in quarantined.values())


async def test_move_to_keeps_acked_mail_in_a_folder(dovecot, smtpd, user) -> None:
    inbox = dovecot.url(user)
    async with transport_for(dovecot, smtpd, move_to="Processed") as transport:
        await transport.send(mailto(user), message_name(1), b"keep me")
        [incoming] = await receive_all(transport, inbox)
        await transport.ack(incoming)
        await transport.ack(incoming)
        assert await receive_all(transport, inbox) == []
    [(flags, raw)] = (await snapshot(dovecot, user, "Processed")).values()
    assert b"X-Fieldsync-Message: " + message_name(1).encode() in raw


# -- authentication and TLS --------------------------------------------------------------------------


async def test_a_wrong_password_is_refused_by_imap_and_smtp(dovecot, smtpd, user, monkeypatch) -> None:
    monkeypatch.setenv(PASSWORD_VARIABLE, "not the password")
    async with transport_for(dovecot, smtpd, retry_delay=5) as transport:
        started = time.monotonic()
        with pytest.raises(TransportRefused) as imap_refusal:
            await receive_all(transport, dovecot.url(user))
        with pytest.raises(TransportRefused) as smtp_refusal:
            await transport.send(mailto(user), message_name(1), b"x")
    assert time.monotonic() - started < 3  # refused, not retried
    assert f"refused login as {user}" in one_line_error(imap_refusal.value)
    assert f"refused login as {SENDER}" in one_line_error(smtp_refusal.value)
    assert "535" in str(smtp_refusal.value)
    for error in (imap_refusal.value, smtp_refusal.value):
        assert "not the password" not in str(error) and f"password_env {PASSWORD_VARIABLE}" in str(error)
    assert dovecot.files(user) == {}


async def test_smtp_and_imap_logins_can_have_their_own_passwords(dovecot, smtpd, monkeypatch) -> None:
    """A mailbox whose password is not the SMTP login's: imap_password_env
    is used for IMAP, and only there; without it IMAP is refused, naming
    the option it read."""
    user = f"own{next(_users)}"
    dovecot.add_user(user, "the mailbox's own")
    monkeypatch.setenv(PASSWORD_VARIABLE, dovecot.PASSWORD)
    monkeypatch.setenv("FIELDSYNC_TEST_IMAP_PASSWORD", "the mailbox's own")
    async with transport_for(dovecot, smtpd, imap_password_env="FIELDSYNC_TEST_IMAP_PASSWORD") as transport:
        logins = len(smtpd.logins)
        await transport.send(mailto(user), message_name(1), b"own passwords")
        assert smtpd.logins[logins:] == [SENDER]
        [incoming] = await receive_all(transport, dovecot.url(user))
        assert incoming.data == b"own passwords"
        await transport.ack(incoming)
    async with transport_for(dovecot, smtpd, retry_delay=5) as shared:
        with pytest.raises(TransportRefused) as refusal:
            await receive_all(shared, dovecot.url(user))
    assert f"refused login as {user}" in one_line_error(refusal.value)
    assert f"password_env {PASSWORD_VARIABLE}" in str(refusal.value)
    monkeypatch.setenv(PASSWORD_VARIABLE, "not the password")
    async with transport_for(dovecot, smtpd, smtp_password_env="FIELDSYNC_TEST_SMTP_PASSWORD",
                             imap_password_env="FIELDSYNC_TEST_IMAP_PASSWORD") as split:
        monkeypatch.setenv("FIELDSYNC_TEST_SMTP_PASSWORD", dovecot.PASSWORD)
        await split.send(mailto(user), message_name(2), b"both own")
        [incoming] = await receive_all(split, dovecot.url(user))
        assert incoming.data == b"both own"
        await split.ack(incoming)


@pytest.mark.parametrize("ca", ["other", "system"])
async def test_a_certificate_that_does_not_verify_is_refused(dovecot, smtpd, smtpd_tls, user, ca) -> None:
    ca_file = str(dovecot.certificates.other_ca_file) if ca == "other" else None
    for smtp in (smtpd, smtpd_tls):
        async with transport_for(dovecot, smtp, ca_file=ca_file) as transport:
            with pytest.raises(TransportRefused) as caught:
                await transport.send(mailto(user), message_name(1), b"x")
            assert "certificate does not verify" in one_line_error(caught.value), smtp.tls
    for implicit_tls in (True, False):
        async with transport_for(dovecot, smtpd, ca_file=ca_file) as transport:
            with pytest.raises(TransportRefused) as caught:
                await receive_all(transport, dovecot.url(user, implicit_tls=implicit_tls))
            assert "certificate does not verify" in one_line_error(caught.value)
    assert dovecot.files(user) == {}


async def test_a_certificate_for_another_host_is_refused(dovecot, user) -> None:
    certificates = dataclasses.replace(dovecot.certificates, cert_file=dovecot.certificates.wrong_host_cert_file,
                                       key_file=dovecot.certificates.wrong_host_key_file)
    impostor = _started(SmtpServer(dovecot, certificates=certificates))
    try:
        async with transport_for(dovecot, impostor) as transport:
            with pytest.raises(TransportRefused, match="certificate does not verify.*(mismatch|127.0.0.1)"):
                await transport.send(mailto(user), message_name(1), b"x")
    finally:
        impostor.close()


# -- refusals, stopped servers, dropped connections ----------------------------------------------------


async def test_a_full_mailbox_fails_the_send_clearly_and_loses_nothing(dovecot, own_smtpd, user) -> None:
    inbox = dovecot.url(user)
    async with transport_for(dovecot, own_smtpd) as transport:
        await transport.send(mailto(user), message_name(1), b"one")
        own_smtpd.refuse_with = "452 4.2.2 Mailbox full"
        with pytest.raises(TransportUnavailable) as caught:
            await transport.send(mailto(user), message_name(2), b"two")
        message = one_line_error(caught.value)
        assert "452" in message and "Mailbox full" in message and "not sent" in message
        assert f"{user}@{MAIL_DOMAIN}" in message and message_name(2) in message
        assert caught.value.retryable
        own_smtpd.refuse_with = "552 5.2.2 Mailbox over quota, permanently"
        with pytest.raises(TransportRefused, match="552"):
            await transport.send(mailto(user), message_name(2), b"two")
        own_smtpd.refuse_with = None
        await transport.send(mailto(user), message_name(2), b"two")  # the agent's next try
        assert await received(transport, inbox) == {message_name(1): b"one", message_name(2): b"two"}
    assert len(dovecot.files(user)) == 2


async def test_an_unknown_recipient_is_refused(transport, dovecot) -> None:
    with pytest.raises(TransportRefused, match="550"):
        await transport.send(mailto("nobody-here"), message_name(1), b"x")


async def test_the_smtp_server_stopped_mid_run_and_restarted(dovecot, own_smtpd, user) -> None:
    async with transport_for(dovecot, own_smtpd, retries=1) as transport:
        await transport.send(mailto(user), message_name(1), b"one")
        own_smtpd.stop()
        with pytest.raises(TransportUnavailable) as caught:
            await transport.send(mailto(user), message_name(2), b"two")
        assert caught.value.retryable and "\n" not in str(caught.value)
        restarted = _started(SmtpServer(dovecot, port=own_smtpd.port))
        try:
            await transport.send(mailto(user), message_name(2), b"two")
            await transport.send(mailto(user), message_name(3), b"three")
        finally:
            restarted.close()
        assert await received(transport, dovecot.url(user)) == {
            message_name(1): b"one", message_name(2): b"two", message_name(3): b"three"}
    assert len(dovecot.files(user)) == 3


async def test_the_imap_server_stopped_mid_run_and_restarted(own_mail) -> None:
    dovecot, smtp = own_mail
    user = new_user(dovecot)
    inbox = dovecot.url(user)
    names = [message_name(last) for last in (1, 2, 3)]
    async with transport_for(dovecot, smtp, retries=1) as transport:
        for name in names:
            await transport.send(mailto(user), name, name.encode())
        first, second, _third = await receive_all(transport, inbox)
        await transport.ack(first)

        dovecot.stop()
        with pytest.raises(TransportUnavailable) as caught:
            await receive_all(transport, inbox)
        assert caught.value.retryable and "\n" not in str(caught.value)
        with pytest.raises(TransportUnavailable):
            await transport.ack(second)
        await transport.send(mailto(user), message_name(4), b"4")  # SMTP still takes mail

        dovecot.start()
        await transport.ack(second)  # the agent acks again what it stored
        got = await receive_all(transport, inbox)
        assert [incoming.name for incoming in got] == [names[2], message_name(4)]
        for incoming in got:
            await transport.ack(incoming)
        assert await receive_all(transport, inbox) == []
    assert dovecot.files(user) == {}


async def test_a_connection_dropped_mid_send_is_remade_and_delivers_once(dovecot, smtpd, user) -> None:
    proxy = TcpProxy(smtpd.port)
    data = random.Random(3).randbytes(1024 * 1024)
    try:
        async with transport_for(dovecot, smtpd, smtp_port=proxy.port) as transport:
            proxy.cut_after(upload=300_000)
            await transport.send(mailto(user), message_name(1), data)
            assert proxy.cuts == 1 and proxy.connections == 2
            assert await received(transport, dovecot.url(user)) == {message_name(1): data}
    finally:
        proxy.close()
    assert len(dovecot.files(user)) == 1


async def test_a_connection_dropped_mid_download_is_remade(dovecot, smtpd, user) -> None:
    proxy = TcpProxy(dovecot.imaps_port)
    data = random.Random(4).randbytes(3 * 1024 * 1024)
    dovecot.deliver(user, build_email(message_name(1), data, SENDER, f"{user}@{MAIL_DOMAIN}"))
    inbox = f"imaps://{user}@127.0.0.1:{proxy.port}/INBOX"
    try:
        async with transport_for(dovecot, smtpd) as transport:
            proxy.cut_after(download=1024 * 1024)
            [incoming] = await receive_all(transport, inbox)
            assert incoming.data == data
            await transport.ack(incoming)
            assert proxy.cuts == 1 and proxy.connections == 2
            assert await receive_all(transport, inbox) == []
    finally:
        proxy.close()


# -- waiting for mail (IDLE) ------------------------------------------------------------------------------


async def test_wait_incoming_wakes_when_mail_arrives(transport, dovecot, user) -> None:
    inbox = dovecot.url(user)
    assert await receive_all(transport, inbox) == []
    loop = asyncio.get_running_loop()
    sent_at = []

    async def send_later() -> None:
        await asyncio.sleep(0.5)
        sent_at.append(loop.time())
        await transport.send(mailto(user), message_name(1), b"x")

    sender = asyncio.create_task(send_later())
    started = loop.time()
    await transport.wait_incoming(inbox, 30)
    woke = loop.time()
    await sender
    assert woke - started < 10 and sent_at and woke >= sent_at[0]
    assert await received(transport, inbox) == {message_name(1): b"x"}


async def test_wait_incoming_returns_at_once_for_mail_not_yet_received(transport, dovecot, user) -> None:
    inbox = dovecot.url(user)
    await transport.send(mailto(user), message_name(1), b"x")
    async with asyncio.timeout(5):
        await transport.wait_incoming(inbox, 30)  # never received: waiting
    [incoming] = await receive_all(transport, inbox)
    await transport.send(mailto(user), message_name(2), b"y")
    async with asyncio.timeout(5):
        await transport.wait_incoming(inbox, 30)  # arrived after that receive
    await transport.ack(incoming)


async def test_wait_incoming_waits_for_the_timeout_when_nothing_comes(transport, dovecot, user) -> None:
    inbox = dovecot.url(user)
    await transport.send(mailto(user), message_name(1), b"x")
    await receive_all(transport, inbox)  # seen, not acked: not new any more
    dovecot.deliver(user, plain_email("other mail does not count as fieldsync mail"))
    loop = asyncio.get_running_loop()
    started = loop.time()
    await transport.wait_incoming(inbox, 1.0)
    assert 0.9 <= loop.time() - started < 5


async def test_wait_incoming_reports_mail_once_then_sleeps_and_renews_idle(transport, dovecot, user,
                                                                           monkeypatch) -> None:
    """Mail already reported, but not yet received, does not wake the next
    call at once (no NOOP/SEARCH spinning); a long wait renews its IDLE
    (RFC 2177: at least every 29 minutes; 0.5 s here)."""
    import os

    import transports.email as email_module

    rawlog = dovecot.base / "rawlog" / user
    rawlog.mkdir(parents=True)
    os.chown(rawlog, dovecot.mail_uid, dovecot.mail_gid)
    inbox = dovecot.url(user)
    await transport.send(mailto(user), message_name(1), b"x")
    async with asyncio.timeout(5):
        assert await transport.wait_incoming(inbox, 30) is True
    monkeypatch.setattr(email_module, "IDLE_RENEWAL", 0.5)
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await transport.wait_incoming(inbox, 2.0) is False  # reported once already: it sleeps
    assert 1.9 <= loop.time() - started < 6
    await transport.aclose()
    # Dovecot's rawlog: one command a line, "TAG COMMAND ...", optionally after a timestamp.
    commands = []
    for path in rawlog.glob("*.in"):
        for line in path.read_bytes().decode().splitlines():
            words = line.split()
            if words and re.fullmatch(r"[0-9.]+", words[0]):
                words = words[1:]
            commands.append((words[1] if len(words) > 1 else words[0] if words else "").upper())
    assert 3 <= commands.count("IDLE") <= 6, commands  # renewed about every 0.5 s in 2 s
    assert commands.count("SEARCH") + commands.count("UID") <= 2 * commands.count("IDLE") + 2, commands


async def test_cancelling_wait_incoming_leaves_the_transport_usable(transport, dovecot, user) -> None:
    inbox = dovecot.url(user)
    await receive_all(transport, inbox)
    waiting = asyncio.create_task(transport.wait_incoming(inbox, 30))
    await asyncio.sleep(0.3)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await transport.send(mailto(user), message_name(1), b"x")
    async with asyncio.timeout(5):
        await transport.wait_incoming(inbox, 30)
    assert await received(transport, inbox) == {message_name(1): b"x"}


async def test_stopping_while_idle_starts_leaves_no_unretrieved_task(transport, dovecot, user, monkeypatch) -> None:
    """An agent stopped (its wait cancelled) while the server had not yet
    answered IDLE: aioimaplib's idle_start left the IDLE command's task
    running; the session was closed, the task failed with SessionLost,
    and asyncio reported "Task exception was never retrieved" with a
    traceback (the email soak's agents, stopped by SIGTERM)."""
    import gc

    import aioimaplib

    inbox = dovecot.url(user)
    await receive_all(transport, inbox)

    async def slow_to_answer_idle(protocol):
        await asyncio.Event().wait()

    answer_idle = aioimaplib.IMAP4ClientProtocol.wait_for_idle_response
    monkeypatch.setattr(aioimaplib.IMAP4ClientProtocol, "wait_for_idle_response", slow_to_answer_idle)
    loop = asyncio.get_running_loop()
    unretrieved = []
    monkeypatch.setattr(loop, "call_exception_handler", unretrieved.append)
    waiting = asyncio.create_task(transport.wait_incoming(inbox, 30))
    await asyncio.sleep(0.5)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    for _ in range(3):
        await asyncio.sleep(0.05)
        gc.collect()
    assert unretrieved == []
    monkeypatch.setattr(aioimaplib.IMAP4ClientProtocol, "wait_for_idle_response", answer_idle)
    await transport.send(mailto(user), message_name(1), b"x")
    async with asyncio.timeout(10):
        assert await transport.wait_incoming(inbox, 30) is True


async def test_a_connection_lost_as_the_greeting_is_answered_is_a_lost_connection(transport, dovecot, user,
                                                                                   monkeypatch) -> None:
    """Dovecot's greeting arrives and the link drops as aioimaplib answers
    it (its CAPABILITY, sent from a task of its own): the session is lost,
    as on any dropped link, so the receive connects again and goes
    through; it was taken for a server that offers no STARTTLS (a
    refusal, which stops the receive for an operator to fix), and asyncio
    reported the task's failure that nobody retrieved (the email soak's
    agents under load: "Task exception was never retrieved")."""
    import gc

    proxy = TcpProxy(dovecot.imap_port)
    inbox = f"imap://{user}@127.0.0.1:{proxy.port}/INBOX"
    loop = asyncio.get_running_loop()
    unretrieved: list[dict] = []
    monkeypatch.setattr(loop, "call_exception_handler", unretrieved.append)
    try:
        proxy.cut_after(upload=4)  # the first bytes the client sends: the greeting's CAPABILITY
        dovecot.deliver(user, build_email(message_name(1), b"x", SENDER, f"{user}@{MAIL_DOMAIN}"))
        [incoming] = await receive_all(transport, inbox)
        assert incoming.data == b"x" and (proxy.cuts, proxy.connections) == (1, 2)
        for _ in range(3):
            await asyncio.sleep(0.05)
            gc.collect()
        assert unretrieved == []
    finally:
        proxy.close()


async def test_without_idle_wait_incoming_polls(dovecot, smtpd, user) -> None:
    inbox = dovecot.url(user)
    async with transport_for(dovecot, smtpd, idle=False) as transport:
        loop = asyncio.get_running_loop()
        started = loop.time()
        await transport.wait_incoming(inbox, 0.5)
        assert 0.45 <= loop.time() - started < 5
        await transport.send(mailto(user), message_name(1), b"x")
        async with asyncio.timeout(5):
            await transport.wait_incoming(inbox, 30)


async def test_a_mailbox_that_does_not_exist_is_refused(transport, dovecot, user) -> None:
    with pytest.raises(TransportRefused) as caught:
        await receive_all(transport, dovecot.url(user, "Nowhere"))
    assert "does the mailbox 'Nowhere' exist?" in one_line_error(caught.value)


async def test_ack_keeps_a_copy_delivered_after_the_receive(transport, dovecot, user) -> None:
    inbox = dovecot.url(user)
    name = message_name(1)
    await transport.send(mailto(user), name, b"old")
    [stale] = await receive_all(transport, inbox)
    await transport.send(mailto(user), name, b"delivered again")
    await transport.ack(stale)
    [fresh] = await receive_all(transport, inbox)
    assert fresh.data == b"delivered again"
    await transport.ack(fresh)
    assert await receive_all(transport, inbox) == []


async def test_mail_the_caller_does_not_want_is_not_downloaded(transport, dovecot, user, monkeypatch) -> None:
    """Only the listing's header fetch touches it: another site's mail in a
    shared mailbox costs no download at each poll."""
    ours, theirs = message_name(1), message_name(1, recipient="field2")
    for name in (ours, theirs):
        dovecot.deliver(user, build_email(name, name.encode(), SENDER, f"{user}@{MAIL_DOMAIN}"))
    reads = record_reads(monkeypatch, transport, "_read", lambda session, box, uidvalidity, entry, wanted: entry.name)
    assert await receive_wanted(transport, dovecot.url(user), ours) == [ours]
    assert reads == [ours]
    assert len(await snapshot(dovecot, user)) == 2


# -- sizes: RFC822.SIZE is a hint, not a bound ------------------------------------------------------


@pytest.mark.parametrize("announced, fetched, refused", [
    (10_000, None, False), (10_001, None, True),  # before the fetch: only a large announcement refuses
    (100, 10_000, False), (100, 10_001, True),  # the server said 100: what came is what counts
    (10_000, 10_001, True), (20_000, 50, True),
])
def test_oversize_believes_the_bytes_fetched_not_the_size_announced(announced, fetched, refused) -> None:
    reason = oversize(announced, fetched, 10_000)
    assert (reason is not None) == refused
    if refused:
        assert "over the max_message_size of 10000" in reason


async def test_a_message_longer_than_announced_is_refused_after_limit_plus_one_bytes(
        transport, dovecot, user, monkeypatch) -> None:
    """A server that announces 100 bytes for a message of 30 kB: the body
    fetch asks for at most max_message_size + 1 bytes and the message is
    left unread, reported as too large."""
    inbox = dovecot.url(user)
    big = build_email(message_name(1), b"z" * 20_000, SENDER, f"{user}@{MAIL_DOMAIN}")
    dovecot.deliver(user, big)
    transport.max_message_size = 10_000
    requested: list[str] = []
    real_fetch = ImapSession.uid_fetch

    async def lying_fetch(session, uids, attributes):
        requested.append(attributes)
        items = await real_fetch(session, uids, attributes)
        for item in items:
            if "RFC822.SIZE" in item.numbers:
                item.numbers["RFC822.SIZE"] = 100
        return items

    monkeypatch.setattr(ImapSession, "uid_fetch", lying_fetch)
    refusals = []
    assert [incoming async for incoming in transport.receive(inbox, refused=refusals.append)] == []
    [refusal] = refusals
    assert refusal.name == message_name(1) and "over the max_message_size of 10000" in refusal.reason
    assert "announced 100 bytes" in refusal.reason
    bodies = [attributes for attributes in requested if "BODY.PEEK[]" in attributes]
    assert bodies == ["(UID BODY.PEEK[]<0.10001>)"]
    assert len(await snapshot(dovecot, user)) == 1  # left in place


# -- a wrong password, against Postfix and Dovecot ---------------------------------------------------


@pytest.fixture
def quick_refusing_mail():
    """Dovecot and Postfix of this test's own; Dovecot answers a failed login
    at once (``auth_failure_delay = 0``), so what is timed is the client's
    share: Dovecot still answers every further failure from the address 2,
    4, 8, then 15 s later than the last, whatever its settings."""
    dovecot = DovecotServer()
    with open(dovecot.base / "dovecot.conf", "a") as config:
        config.write("auth_failure_delay = 0\n")
    _started(dovecot)
    dovecot.add_user("hq")
    postfix = PostfixServer(dovecot)
    try:
        _started(postfix)
        yield dovecot, postfix
    finally:
        postfix.close()
        dovecot.close()


async def test_a_wrong_password_is_reported_at_once_and_not_offered_again(quick_refusing_mail, monkeypatch) -> None:
    """aiosmtplib's login tries each mechanism after a 535, and each try
    made Dovecot answer the next login later: 14 s for one wrong password.
    One mechanism is tried, and a refused password is not offered again."""
    dovecot, postfix = quick_refusing_mail
    user = new_user(dovecot)
    monkeypatch.setenv(PASSWORD_VARIABLE, "not the password")
    async with transport_for(dovecot, postfix, retry_delay=5) as transport:
        started = time.monotonic()
        with pytest.raises(TransportRefused) as smtp_refusal:
            await transport.send(mailto(user), message_name(1), b"x")
        assert time.monotonic() - started < 1.0
        started = time.monotonic()
        with pytest.raises(TransportRefused) as again:
            await transport.send(mailto(user), message_name(2), b"x")  # the next peer's message, say
        assert time.monotonic() - started < 0.2
        assert "refused this password already" in one_line_error(again.value)
        # Dovecot now holds the failure above against this address: its answer to IMAP is late, not ours.
        with pytest.raises(TransportRefused) as imap_refusal:
            await receive_all(transport, dovecot.url(user))
        started = time.monotonic()
        with pytest.raises(TransportRefused):
            await receive_all(transport, dovecot.url(user))
        assert time.monotonic() - started < 0.2
    assert f"SMTP server 127.0.0.1:{postfix.port} refused login as {SENDER}: 535" in one_line_error(smtp_refusal.value)
    assert f"IMAP server 127.0.0.1:{dovecot.imaps_port} refused login as {user}" in one_line_error(imap_refusal.value)
    for error in (smtp_refusal.value, again.value, imap_refusal.value):
        assert "not the password" not in str(error) and f"password_env {PASSWORD_VARIABLE}" in str(error)
    # One SASL attempt reached the server for the two sends.
    assert postfix.log.read_text(errors="replace").count("SASL PLAIN authentication failed") + \
        postfix.log.read_text(errors="replace").count("SASL LOGIN authentication failed") == 1
    monkeypatch.setenv(PASSWORD_VARIABLE, dovecot.PASSWORD)  # fixed: tried again, and taken
    async with transport_for(dovecot, postfix) as transport:
        await transport.send(mailto(user), message_name(3), b"fixed")
