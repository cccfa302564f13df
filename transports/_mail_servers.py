"""What the SMTP and IMAP sides of one ``email`` transport share: the TLS
settings, the logins servers refused, and the retries.

Rules of this file:
* TLS is always verified (the system's CAs, or ``ca_file``), TLS 1.2 at
  least; one context, made on first use.
* A password a server refused is not offered to it again while the
  transport lives (servers such as Dovecot answer each failure later than
  the last); a changed password is tried.  Passwords are kept only as a
  keyed hash, with a key of this process.
* Retries back off (``Backoff``) and stop when the transport closes; one
  warning when a server goes away, not one per retry or per call.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import secrets
import ssl
from collections.abc import Callable, Iterator

from ._remote import Backoff, SecretSource
from .errors import TransportError, TransportRefused

log = logging.getLogger("transports.email")  # the transport's logger: operators filter by transport


class MailServers:
    def __init__(self, *, ca_file: str | None, backoff: Backoff, closed: Callable[[], bool]) -> None:
        self.ca_file = ca_file
        self.backoff = backoff
        self._closed = closed
        self._tls_context: ssl.SSLContext | None = None
        self.failing = False  # a server stopped answering; warned once until it answers again
        # Logins a server refused, by (protocol, host, port, user, keyed hash of the password).
        self._refused_logins: dict[tuple, TransportRefused] = {}
        self._login_key_salt = secrets.token_bytes(16)

    def context(self) -> ssl.SSLContext:
        """The TLS settings for SMTP and IMAP: verify the chain and the host name."""
        if self._tls_context is None:
            try:
                context = ssl.create_default_context(cafile=os.path.expanduser(self.ca_file) if self.ca_file else None)
            except (OSError, ssl.SSLError) as error:
                raise TransportRefused(f"cannot load ca_file {self.ca_file}: {error}") from None
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            self._tls_context = context
        return self._tls_context

    @staticmethod
    async def password(source: SecretSource) -> str | None:
        return await asyncio.to_thread(source.read)

    def login_key(self, protocol: str, host: str | None, port: int, user: str, password: str) -> tuple:
        digest = hashlib.blake2b(password.encode("utf-8", "surrogatepass"), key=self._login_key_salt).digest()
        return (protocol, host, port, user, digest)

    def refused_before(self, key: tuple) -> None:
        """Raise at once for a login this server refused already with the same password."""
        refusal = self._refused_logins.get(key)
        if refusal is not None:
            raise TransportRefused(f"{refusal} (not tried again: the server refused this password already; "
                                   "it is tried again once the password changes)")

    def remember_refusal(self, key: tuple, refusal: TransportRefused) -> None:
        self._refused_logins[key] = refusal

    async def backing_off(self, failure: TransportError, delays: Iterator[float]) -> None:
        """Wait before the next try, or raise ``failure`` when none is left."""
        delay = next(delays, None)
        if delay is None or self._closed():
            raise failure
        # One warning when a server goes away, not one per retry or per call.
        level = logging.INFO if self.failing else logging.WARNING
        self.failing = True
        log.log(level, "%s; trying again in %.1f s", failure, delay)
        await asyncio.sleep(delay)
