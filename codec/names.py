"""Message file names.

Rules of this file:
* A name carries sender, recipient, kind and header, and nothing a file
  system could mistake for a path: site names are ``[A-Za-z0-9][A-Za-z0-9_-]*``
  (at most 48 characters), so a name never holds ``/``, ``\\``, ``..`` or a
  control character.
* Numbers are zero-padded to fixed widths (epoch and seq 10 digits, offsets
  19 digits) so that sorting names sorts one sender's data stream by
  (resend_count, prev, last, seq) whatever the magnitudes.
* Control messages add 16 hex digits of the SHA-256 of their file, so two
  control messages never share a name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from .errors import BadFileName, InvalidValue
from .header import Header

SITE_NAME_MAX = 48
NAME_MAX_BYTES = 200
SUFFIX = ".fsm"

_SITE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,%d}\Z" % (SITE_NAME_MAX - 1))
_NAME = re.compile(
    r"(?P<sender>[A-Za-z0-9][A-Za-z0-9_-]*)\.(?P<recipient>[A-Za-z0-9][A-Za-z0-9_-]*)\."
    r"(?P<kind>[dc])\.(?P<rc>\d{10})-(?P<prev>\d{19})-(?P<last>\d{19})-(?P<seq>\d{10})"
    r"(?:\.(?P<digest>[0-9a-f]{16}))?\.fsm\Z"
)


class Kind(Enum):
    DATA = "d"
    CONTROL = "c"


def check_site_name(site: str) -> str:
    """Return ``site`` if it is a valid site name, else raise InvalidValue."""
    if type(site) is not str or not _SITE.match(site):
        raise InvalidValue(
            f"invalid site name {site!r}: use 1-{SITE_NAME_MAX} letters, digits, '_' or '-', "
            "starting with a letter or digit"
        )
    return site


@dataclass(frozen=True, slots=True)
class MessageName:
    sender: str
    recipient: str
    kind: Kind
    header: Header
    digest: str | None = None

    def __post_init__(self) -> None:
        check_site_name(self.sender)
        check_site_name(self.recipient)
        if (self.kind is Kind.CONTROL) != (self.digest is not None):
            raise InvalidValue("a control message name has a digest and a data message name has none")
        if self.digest is not None and not re.fullmatch(r"[0-9a-f]{16}", self.digest):
            raise InvalidValue(f"name digest must be 16 lowercase hex digits, got {self.digest!r}")

    def __str__(self) -> str:
        header = self.header
        text = (f"{self.sender}.{self.recipient}.{self.kind.value}."
                f"{header.resend_count:010d}-{header.prev:019d}-{header.last:019d}-{header.seq:010d}")
        if self.digest is not None:
            text += "." + self.digest
        return text + SUFFIX

    @classmethod
    def parse(cls, name: str) -> "MessageName":
        """Parse a file name; raise BadFileName for anything else."""
        if type(name) is not str:
            raise BadFileName(f"file name must be text, got {type(name).__name__}")
        if len(name.encode("utf-8", "surrogatepass")) > NAME_MAX_BYTES:
            raise BadFileName(f"file name {name[:40]!r}... is over {NAME_MAX_BYTES} bytes")
        match = _NAME.match(name)
        if match is None:
            raise BadFileName(f"not a fieldsync message file name: {name!r}")
        try:
            header = Header(int(match["rc"]), int(match["prev"]), int(match["last"]), int(match["seq"]))
            return cls(match["sender"], match["recipient"], Kind(match["kind"]), header, match["digest"])
        except InvalidValue as error:
            raise BadFileName(f"file name {name!r}: {error}") from None
