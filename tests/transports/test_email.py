"""The email transport against real servers (aiosmtpd, Dovecot): conformance, then what only email has."""

from __future__ import annotations

import itertools
from urllib.parse import urlsplit

import pytest

from transports.email import EmailTransport, build_email

from .conformance import TransportConformance
from .servers import MAIL_DOMAIN, abandon_smtp_transaction

PASSWORD_VARIABLE = "FIELDSYNC_TEST_MAIL_PASSWORD"
_users = itertools.count(1)


def new_user(dovecot, label: str = "site") -> str:
    user = f"{label}{next(_users)}"
    dovecot.add_user(user)
    return user


def user_of(address: str) -> str:
    return urlsplit(address).username


class TestEmailConformance(TransportConformance):
    @pytest.fixture(autouse=True)
    def _servers(self, dovecot, smtpd, monkeypatch) -> None:
        self.dovecot, self.smtpd = dovecot, smtpd
        monkeypatch.setenv(PASSWORD_VARIABLE, dovecot.PASSWORD)

    @pytest.fixture
    def make_transport(self, dovecot, smtpd):
        return lambda: EmailTransport(
            smtp_host="127.0.0.1", smtp_port=smtpd.port, smtp_tls="starttls", from_address=f"hq@{MAIL_DOMAIN}",
            password_env=PASSWORD_VARIABLE, ca_file=str(dovecot.certificates.ca_file))

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
