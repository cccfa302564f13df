"""The fault-injection suite over real servers: seeds of agent.chaos whose
files travel through OpenSSH's sftp and through SMTP into Dovecot mailboxes.

The inboxes are fixed places on the servers, made once for the sites hq
and f1-f3, as an operator would make them for ``agent chaos --transport``
(docs/testing.md); the suite empties them at the start of every seed.
"""

import os

import pytest

from agent.chaos import run_seeds, summarize
from tests.transports.servers import MAIL_DOMAIN
from transports.faults import KINDS

from .transport_worlds import mail_servers, sshd  # noqa: F401 (fixtures)

pytestmark = pytest.mark.timeout(600)

SEEDS = int(os.environ.get("FIELDSYNC_CHAOS_TRANSPORT_SEEDS", "20"))
SITES = ("hq", "f1", "f2", "f3")


def check(summary: dict, transport: str) -> None:
    assert summary["seeds"] == SEEDS
    # Faults of every kind were injected, and repaired: files lost, damaged, doubled, held back,
    # and sites cut off.
    for kind in KINDS:
        assert summary["faults"].get(kind, 0) > 0, summary["faults"]
    assert summary["resend_requests"] > 0 and summary["quarantined"] > 0, summary
    assert summary["failing_seeds"] == [], (
        f"seeds failing over {transport} (replay each over folder too: "
        f"`agent chaos --seed N`): {summary['failing_seeds'][:5]}")


async def test_seeds_over_sftp_find_no_divergence_double_apply_or_loss(sshd):
    for site in SITES:
        (sshd.root / "chaos" / site).mkdir(parents=True, exist_ok=True)
    results = await run_seeds(
        range(SEEDS), transport="sftp", address_template=sshd.address(sshd.root / "chaos" / "{site}"),
        transport_options=(("key_file", str(sshd.client_key)), ("known_hosts", str(sshd.known_hosts))))
    check(summarize(results), "sftp")
    assert "Starting session: subsystem 'sftp'" in sshd.log.read_text()  # the files went through sshd


async def test_seeds_over_email_find_no_divergence_double_apply_or_loss(mail_servers, tmp_path):
    dovecot, postfix = mail_servers.dovecot, mail_servers.postfix
    for site in SITES:
        dovecot.add_user(f"chaos-{site}")
    password = tmp_path / "mail-password"
    password.write_text(dovecot.PASSWORD + "\n")
    password.chmod(0o600)
    results = await run_seeds(
        range(SEEDS), transport="email", address_template=dovecot.url("chaos-{site}"),
        send_address_template=f"mailto:chaos-{{site}}@{MAIL_DOMAIN}",
        transport_options=(("smtp_host", "127.0.0.1"), ("smtp_port", postfix.port), ("smtp_tls", "starttls"),
                           ("from_address", f"chaos-{{site}}@{MAIL_DOMAIN}"), ("password_file", str(password)),
                           ("ca_file", str(dovecot.certificates.ca_file))))
    check(summarize(results), "email")
    # Every site logged in to SMTP as itself.
    senders = {login.partition("@")[0] for login in postfix.logins}
    assert {"chaos-hq", "chaos-f1"} <= senders <= {f"chaos-{site}" for site in SITES}, senders
