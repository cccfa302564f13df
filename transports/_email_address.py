"""The ``email`` transport's addresses: where ``send`` delivers
(``mailto:field1@example.com``) and where ``receive`` reads
(``imaps://user@host[:port]/INBOX``, or ``imap://`` with STARTTLS).

Rules of this file:
* A recipient is one plain address (``local@domain``): nothing that could
  smuggle a header or an SMTP command, no ``?`` part.
* A mailbox URL gets the checks of every server address
  (transports._address: no password, no ``?`` or ``#``, no control
  character); ``imaps`` is implicit TLS, ``imap`` STARTTLS (required).
* ``str()`` writes an address back in one form.
"""

from __future__ import annotations

from dataclasses import dataclass
from email.utils import parseaddr
from urllib.parse import quote, unquote

from ._address import display_host, parse_server_url
from .errors import BadAddress

DEFAULT_IMAP_PORTS = {"imaps": 993, "imap": 143}


def check_email(text: str, what: str) -> str:
    """``local@domain`` or BadAddress; nothing that could smuggle a header or a command."""
    if type(text) is not str:
        raise BadAddress(f"{what} must be an email address, got {text!r}")
    if any(char in text for char in "\r\n\x00 <>,;\"()[]\\") or any(ord(char) < 32 for char in text):
        raise BadAddress(f"{what} {text!r} is not a plain email address like field1@example.com")
    name, parsed = parseaddr(text)
    local, _, domain = parsed.rpartition("@")
    if parsed != text or not local or not domain or "." not in domain.strip(".") and domain != "localhost":
        raise BadAddress(f"{what} {text!r} is not a plain email address like field1@example.com")
    return text


@dataclass(frozen=True, slots=True)
class Recipient:
    """Where ``send`` delivers: ``mailto:field1@example.com`` (or the bare address)."""

    email: str

    @classmethod
    def parse(cls, address: str) -> "Recipient":
        text = address.strip()
        if text.lower().startswith("mailto:"):
            text = unquote(text[len("mailto:"):])
            if "?" in text:
                raise BadAddress(f"email address {address!r} has a '?' part; give only the recipient, "
                                 "as in mailto:field1@example.com")
        return cls(check_email(text, "recipient"))

    def __str__(self) -> str:
        return f"mailto:{self.email}"


@dataclass(frozen=True, slots=True)
class Mailbox:
    """Where ``receive`` reads: ``imaps://user@host[:port]/INBOX`` (implicit TLS) or
    ``imap://...`` (STARTTLS, required)."""

    tls: str
    user: str
    host: str
    port: int
    mailbox: str

    @classmethod
    def parse(cls, address: str) -> "Mailbox":
        url = parse_server_url(address.strip(), kind="IMAP", schemes=tuple(DEFAULT_IMAP_PORTS),
                               expected="email inbox must be an IMAP URL like imaps://user@host/INBOX",
                               example="imaps://user@host/INBOX", path_name="mailbox name")
        mailbox = unquote(url.written_path.lstrip("/")) or "INBOX"
        tls = "tls" if url.scheme == "imaps" else "starttls"
        return cls(tls, url.user, url.host, url.port or DEFAULT_IMAP_PORTS[url.scheme], mailbox)

    @property
    def server(self) -> tuple[str, str, str, int]:
        return (self.tls, self.user, self.host, self.port)

    @property
    def display_host(self) -> str:
        return display_host(self.host, self.port)

    def __str__(self) -> str:
        scheme = "imaps" if self.tls == "tls" else "imap"
        return f"{scheme}://{quote(self.user, safe='')}@{self.display_host}/{quote(self.mailbox, safe='')}"
