"""The message header ``(resend_count-prev-last-seq)``.

Rules of this file:
* ``prev`` is the last commit offset of the previous message of the stream,
  ``last`` the last commit offset this message covers, ``seq`` numbers the
  parts of one transaction too large for a single message.  All parts but the
  final have ``prev == last``.
* The text form pads offsets to at least 10 digits, as dbremote prints them;
  wider offsets print wider and are never truncated.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import InvalidValue
from .ops import OFFSET_MAX

COUNT_MAX = 2**32 - 1

_COUNT = r"(0|[1-9]\d{0,9})"
_OFFSET = r"(\d{10}|[1-9]\d{10,18})"
_TEXT = re.compile(rf"\({_COUNT}-{_OFFSET}-{_OFFSET}-{_COUNT}\)\Z")


@dataclass(frozen=True, slots=True, order=True)
class Header:
    resend_count: int
    prev: int
    last: int
    seq: int = 0

    def __post_init__(self) -> None:
        for field, limit in (("resend_count", COUNT_MAX), ("prev", OFFSET_MAX),
                             ("last", OFFSET_MAX), ("seq", COUNT_MAX)):
            value = getattr(self, field)
            if type(value) is not int or not 0 <= value <= limit:
                raise InvalidValue(f"header {field} must be an integer in 0..{limit}, got {value!r}")
        if self.prev > self.last:
            raise InvalidValue(f"header prev {self.prev} is after last {self.last}")

    @property
    def is_part(self) -> bool:
        """True for a part of a transaction split over several messages."""
        return self.prev == self.last or self.seq > 0

    @property
    def is_final_part(self) -> bool:
        return self.prev < self.last

    def __str__(self) -> str:
        return f"({self.resend_count}-{self.prev:010d}-{self.last:010d}-{self.seq})"

    @classmethod
    def parse(cls, text: str) -> "Header":
        match = _TEXT.match(text)
        if match is None:
            raise InvalidValue(f"not a message header: {text!r} (expected like (0-0000942712-0001119170-0))")
        resend_count, prev, last, seq = (int(group) for group in match.groups())
        return cls(resend_count, prev, last, seq)
