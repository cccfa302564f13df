"""The ``email`` transport's send side: SMTP submission.

Rules of this file:
* One SMTP session per transport, reused for the next message and made
  again after any error; a session the server closed while idle gets one
  fresh try at once.
* TLS is always verified; STARTTLS is required when asked for, never
  opportunistic; no password is sent without TLS.
* A login is tried once, with one mechanism (another only when the server
  says it does not take the first); a password a server refused is not
  offered to it again while the transport lives.
* Connection failures are retried with backoff; what the server refuses
  on purpose is raised at once: ``TransportRefused`` for a permanent (5xx)
  answer, ``TransportUnavailable`` for a temporary one (4xx).
"""

from __future__ import annotations

import asyncio
import logging
import ssl

import aiosmtplib

from ._email_address import Recipient
from ._email_format import build_email
from ._mail_servers import MailServers
from ._remote import SecretSource, one_line
from .errors import TransportError, TransportRefused, TransportUnavailable

log = logging.getLogger("transports.email")  # the transport's logger: operators filter by transport


class SmtpSender:
    """Sends message files as emails through one SMTP server."""

    def __init__(self, servers: MailServers, *, host: str | None, port: int, tls: str, from_address: str | None,
                 username: str | None, password: SecretSource, timeout: float, connect_timeout: float) -> None:
        self._servers = servers
        self.host = host
        self.port = port
        self.tls = tls
        self.from_address = from_address
        self.username = username
        self.password = password
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._smtp: aiosmtplib.SMTP | None = None
        self._lock = asyncio.Lock()

    async def send(self, recipient: Recipient, name: str, data: bytes) -> None:
        """Send file ``name`` to ``recipient``, reconnecting with backoff."""
        assert self.from_address is not None
        message = await asyncio.to_thread(build_email, name, data, self.from_address, recipient.email)
        delays = self._servers.backoff.delays()
        while True:
            async with self._lock:
                reused = self._smtp is not None
                try:
                    smtp = await self._connection()
                    await smtp.sendmail(self.from_address, [recipient.email], message)
                    return
                except aiosmtplib.SMTPResponseException as error:
                    # The server answered; start the next message on a fresh session.
                    self.drop()
                    if isinstance(error, aiosmtplib.SMTPAuthenticationError):
                        raise self._login_refused(error) from None
                    if isinstance(error, aiosmtplib.SMTPConnectResponseError) and 400 <= error.code < 500:
                        failure = TransportUnavailable(f"SMTP server {self.where()} is busy: "
                                                       f"{error.code} {one_line(error.message)}")
                    else:
                        raise _smtp_refusal(error, name, recipient, self.where()) from None
                except aiosmtplib.SMTPRecipientsRefused as error:
                    self.drop()
                    raise _smtp_refusal(error.recipients[0], name, recipient, self.where()) from None
                except (aiosmtplib.SMTPException, OSError, TimeoutError) as error:
                    self.drop()
                    refused = _tls_refusal(error)
                    if refused is not None:
                        raise TransportRefused(f"cannot send {name} through SMTP server {self.where()}: "
                                               f"{refused}") from None
                    failure = TransportUnavailable(
                        f"cannot send {name} through SMTP server {self.where()}: {_describe(error)}")
                    if reused:
                        # The server may have closed an idle session: one fresh try at once.
                        log.debug("%s; reconnecting", failure)
                        continue
                except BaseException:
                    # Cancelled mid-dialogue, or refused before connecting: no half-used session stays.
                    self.drop()
                    raise
            await self._servers.backing_off(failure, delays)

    def where(self) -> str:
        return f"{self.host}:{self.port}"

    def _login(self) -> str:
        return self.username or self.from_address or ""

    def _login_refused(self, error: aiosmtplib.SMTPResponseException) -> TransportError:
        text = (f"SMTP server {self.where()} refused login as {self._login()}: "
                f"{error.code} {one_line(error.message)}")
        if 400 <= error.code < 500:
            return TransportUnavailable(text + "; trying again later")
        return TransportRefused(text + f"; check username and {self.password.describe()}")

    async def _connection(self) -> aiosmtplib.SMTP:
        if self._smtp is not None and self._smtp.is_connected:
            return self._smtp
        self.drop()
        password = await self._servers.password(self.password)
        use_tls = self.tls == "tls"
        start_tls = True if self.tls == "starttls" else False
        context = self._servers.context() if self.tls != "none" else None
        smtp = aiosmtplib.SMTP(hostname=self.host, port=self.port, use_tls=use_tls, start_tls=start_tls,
                               tls_context=context, timeout=self.timeout,
                               local_hostname=self.from_address.rpartition("@")[2])
        if password is not None and self.tls == "none":
            raise TransportRefused(f"not sending the SMTP password to {self.where()} without TLS; "
                                   "use smtp_tls='starttls' or 'tls', or no password for a local relay")
        key = None
        if password is not None:
            key = self._servers.login_key("smtp", self.host, self.port, self._login(), password)
            self._servers.refused_before(key)
        self._smtp = smtp  # dropped by the caller if anything below fails
        async with asyncio.timeout(self.connect_timeout + self.timeout):
            await smtp.connect(timeout=self.connect_timeout)
        if password is not None:
            try:
                await _smtp_login_once(smtp, self._login(), password)
            except aiosmtplib.SMTPAuthenticationError as error:
                refusal = self._login_refused(error)
                if isinstance(refusal, TransportRefused):
                    self._servers.remember_refusal(key, refusal)
                raise refusal from None
        return smtp

    def drop(self) -> None:
        if self._smtp is not None:
            self._smtp.close()
            self._smtp = None

    async def aclose(self) -> None:
        if self._smtp is not None:
            smtp, self._smtp = self._smtp, None
            try:
                await smtp.quit()
            except (aiosmtplib.SMTPException, OSError):
                smtp.close()


# What an SMTP server answers when it does not take a mechanism (RFC 4954):
# only then is the next one tried.  Any other refusal (535: the user name or
# password is wrong) is final; a retry would cost another failed login.
_MECHANISM_REFUSED = frozenset({504, 534, 538})


async def _smtp_login_once(smtp: aiosmtplib.SMTP, user: str, password: str) -> None:
    """Log in with the server's first mechanism that aiosmtplib has.

    ``SMTP.login`` tries every mechanism in turn after a refusal, so one
    wrong password is several failed logins, each answered later than the
    last by servers that slow down guessing (Dovecot behind Postfix).
    """
    if smtp.is_ehlo_or_helo_needed:
        await smtp.ehlo()
    methods = smtp.supported_auth_methods
    if not methods:
        await smtp.login(user, password)  # raises aiosmtplib's error: no AUTH, or no mechanism in common
        return
    for number, method in enumerate(methods):
        try:
            await getattr(smtp, f"auth_{method.replace('-', '')}")(user, password)
            return
        except aiosmtplib.SMTPAuthenticationError as error:
            if error.code not in _MECHANISM_REFUSED or number == len(methods) - 1:
                raise


def _describe(error: BaseException) -> str:
    text = one_line(error)
    return text or type(error).__name__


def _tls_refusal(error: BaseException) -> str | None:
    """Why TLS failed, if ``error`` (or what caused it) is a certificate problem."""
    seen = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ssl.SSLCertVerificationError):
            return (f"the server's certificate does not verify: {current.verify_message}; set ca_file to the CA "
                    "that signed it, and use the host name the certificate names")
        if isinstance(current, aiosmtplib.SMTPNotSupported) or "STARTTLS" in str(current) and "not supported" in str(current):
            return f"{one_line(current)}; the server does not offer STARTTLS (try smtp_tls='tls')"
        current = current.__cause__ or current.__context__
    if "CERTIFICATE_VERIFY_FAILED" in str(error):
        return f"the server's certificate does not verify ({one_line(error)}); set ca_file"
    return None


def _smtp_refusal(error: aiosmtplib.SMTPResponseException, name: str, recipient: Recipient,
                  where: str) -> TransportError:
    """What the server said about this message: 4xx is temporary (retry later), 5xx is final."""
    what = {aiosmtplib.SMTPSenderRefused: "refused the sender",
            aiosmtplib.SMTPRecipientRefused: f"refused the recipient {recipient.email}",
            aiosmtplib.SMTPDataError: "refused the message"}.get(type(error), "refused")
    text = f"SMTP server {where} {what} for {name}: {error.code} {one_line(error.message)}"
    if 400 <= error.code < 500:
        return TransportUnavailable(f"{text}; the message was not sent, try again later")
    return TransportRefused(f"{text}; the message was not sent")
