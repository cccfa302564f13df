"""The ``sftp`` transport's address: ``sftp://user@host[:port]/path``.

Rules of this file:
* The checks every server address gets are transports._address's (no
  password, no ``?`` or ``#``, no control character); an sftp address also
  names its inbox directory.
* ``/~/dir`` is ``dir`` in the user's home directory on the server; the
  path is normalised, and ``str()`` writes the address back in one form.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from urllib.parse import quote

from ._address import display_host, parse_server_url
from .errors import BadAddress

DEFAULT_PORT = 22


@dataclass(frozen=True, slots=True)
class SftpAddress:
    """``sftp://user@host[:port]/path``: the inbox directory ``path`` on ``host``.

    ``/~/dir`` is ``dir`` in the user's home directory on the server.
    """

    user: str
    host: str
    port: int
    path: str

    @classmethod
    def parse(cls, address: str) -> "SftpAddress":
        url = parse_server_url(address, kind="sftp", schemes=("sftp",),
                               expected="sftp address must look like sftp://user@host:port/path",
                               example="sftp://user@host/path")
        path = url.path
        if path in ("", "/"):
            raise BadAddress(f"sftp address {address!r} names no inbox directory; add its path, "
                             "as in sftp://user@host/srv/fieldsync/hq")
        if path == "/~" or path.startswith("/~/"):
            path = posixpath.normpath(path[3:] or ".")
        else:
            path = posixpath.normpath(path)
        return cls(url.user, url.host, url.port or DEFAULT_PORT, path)

    @property
    def server(self) -> tuple[str, str, int]:
        return (self.user, self.host, self.port)

    @property
    def known_hosts_entry(self) -> str:
        """The host as OpenSSH writes it in known_hosts."""
        return self.host if self.port == DEFAULT_PORT else f"[{self.host}]:{self.port}"

    @property
    def display_host(self) -> str:
        return display_host(self.host, self.port)

    def file(self, name: str) -> str:
        return posixpath.join(self.path, name)

    def __str__(self) -> str:
        path = self.path if self.path.startswith("/") else "/~/" + self.path.removeprefix("./")
        if self.path == ".":
            path = "/~"
        return f"sftp://{quote(self.user, safe='')}@{self.display_host}{quote(path)}"
