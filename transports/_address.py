"""Server URLs (``sftp://user@host:port/path``, ``imaps://user@host/INBOX``):
the checks every transport that logs in to a server makes of its address.

Rules of this file:
* An address names a user, a host and a path, and nothing else: a
  password in it is refused (secrets come from a file or an environment
  variable) and shown redacted; a ``?`` or ``#`` part is refused, as is a
  control character in the path.
* The user and the path come back unquoted (``%40`` is an ``@``); the host
  is shown in brackets when it is an IPv6 address.
* Every refusal is a ``BadAddress`` that quotes the address and says how to
  write it.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from .errors import BadAddress
from .options import has_control_character


@dataclass(frozen=True, slots=True)
class ServerUrl:
    """The parts of a checked server address."""

    scheme: str  # lower case
    user: str
    host: str
    port: int | None  # None: the scheme's default
    path: str  # unquoted (a leading "/" included)
    written_path: str  # as written, still quoted


def parse_server_url(address: str, *, kind: str, schemes: tuple[str, ...], expected: str, example: str,
                     path_name: str = "path") -> ServerUrl:
    """Check ``address``, a ``kind`` address (``"sftp"``, ``"IMAP"``) with one
    of ``schemes``.  ``expected`` says what it must look like (a scheme not
    taken), ``example`` how to write it (no user), ``path_name`` what its
    path is called."""
    try:
        parts = urlsplit(address)
        port = parts.port
    except ValueError as error:
        raise BadAddress(f"{kind} address {address!r} is not a URL: {error}") from None
    scheme = parts.scheme.lower()
    if scheme not in schemes:
        raise BadAddress(f"{expected}, got {address!r}")
    if parts.password is not None:
        raise BadAddress(f"{kind} address {redact(address)} holds a password: never put one in an address; "
                         "use the password_file or password_env option")
    if not parts.username:
        raise BadAddress(f"{kind} address {address!r} names no user; write it as {example} "
                         "(an @ in the user name is written %40)")
    if not parts.hostname:
        raise BadAddress(f"{kind} address {address!r} names no host")
    if parts.query or parts.fragment:
        raise BadAddress(f"{kind} address {address!r} has a '?' or '#' part, which means nothing here")
    path = unquote(parts.path)
    if has_control_character(path):
        raise BadAddress(f"{kind} address {address!r} has a control character in its {path_name}")
    return ServerUrl(scheme, unquote(parts.username), parts.hostname, port, path, parts.path)


def redact(address: str) -> str:
    """``address`` with the password it holds, if any, shown as ``***``."""
    parts = urlsplit(address)
    return address.replace(f":{parts.password}@", ":***@") if parts.password else address


def display_host(host: str, port: int) -> str:
    """``host:port``, an IPv6 host in brackets."""
    shown = f"[{host}]" if ":" in host else host
    return f"{shown}:{port}"
