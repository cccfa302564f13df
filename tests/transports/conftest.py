"""Real servers for the sftp and email tests, shared by a test session.

Each fixture starts its server once; tests that stop or break a server make
their own (see test_sftp.py and test_email.py).  A server that cannot start
fails the tests that need it, with its log.
"""

from __future__ import annotations

import pytest

from .postfix import PostfixServer
from .servers import DovecotServer, ServerFailed, SmtpServer, SshServer


def _start(server):
    try:
        return server.start()
    except ServerFailed as error:
        server.close()
        pytest.fail(str(error), pytrace=False)


@pytest.fixture(scope="session")
def sshd():
    server = _start(SshServer())
    yield server
    server.close()


@pytest.fixture(scope="session")
def dovecot():
    """Dovecot with one user, ``hq``, that sends; tests add a fresh user per inbox."""
    server = _start(DovecotServer())
    server.add_user("hq")
    yield server
    server.close()


@pytest.fixture(scope="session")
def smtpd(dovecot):
    """SMTP with STARTTLS required, delivering into ``dovecot``'s Maildirs."""
    server = _start(SmtpServer(dovecot, tls="starttls"))
    yield server
    server.close()


@pytest.fixture(scope="session")
def smtpd_tls(dovecot):
    """SMTP over implicit TLS, delivering into ``dovecot``'s Maildirs."""
    server = _start(SmtpServer(dovecot, tls="tls"))
    yield server
    server.close()


@pytest.fixture(scope="session")
def postfix(dovecot):
    """Postfix: submission with STARTTLS and AUTH through ``dovecot``, delivering into its Maildirs."""
    server = _start(PostfixServer(dovecot))
    yield server
    server.close()
