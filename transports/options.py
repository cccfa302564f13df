"""Transport options given as text (docs/transports.md, "Options as text").

A command line (``-O timeout=90s``) or a config file gives every option as
text; the transport's constructor wants numbers, booleans and paths.
:func:`read_text_options` reads each text value by the annotation of the
parameter it goes to, so one rule serves every transport, built-in or not:

* a parameter that takes ``str`` (or a path) keeps the text as it is: an
  IMAP user ``1001`` stays the text ``"1001"``;
* ``bool``: ``true``/``false``, ``yes``/``no``, ``on``/``off``, ``1``/``0``;
* ``int``: a whole number; ``float``: a finite number;
* :data:`Seconds`, :data:`ByteCount`, :data:`FileMode` (``Annotated``
  markers a transport puts on its parameters): ``90s``/``5m``/``1h``,
  ``48k``/``64m``/``1g``, octal permission bits ``640``/``0o640``;
* anything else cannot be given as text, and says so; nor can a text
  with a control character, whatever the option.

Values that are not text (a program's ``create_transport(..., timeout=5)``)
are passed on untouched; the constructor checks them as always.  A text
that does not read is one :class:`BadTransportOptions` line naming the
transport, the option and the value.
"""

from __future__ import annotations

import inspect
import math
import os
import re
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Mapping

from .errors import BadTransportOptions


@dataclass(frozen=True, slots=True)
class TextForm:
    """How an ``Annotated`` parameter is written as text: ``parse`` turns the
    text into the value or raises ValueError; ``wanted`` says what was
    expected, for the error line."""

    parse: Callable[[str], Any]
    wanted: str


_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|h|m|s)?")
_DURATION_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, None: 1.0, "ms": 0.001}
_BYTES = re.compile(r"(\d+)([kmg]?)(?:i?b)?")
_BYTE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_seconds(text: str) -> float:
    """``90``, ``1.5``, ``90s``, ``250ms``, ``5m``, ``1h`` or ``1h30m``, in seconds."""
    compact = text.strip().lower().replace(" ", "")
    position, total, units = 0, 0.0, set()
    while position < len(compact):
        match = _DURATION.match(compact, position)
        if match is None or match.group(2) in units or (match.group(2) is None and position):
            raise ValueError(text)
        units.add(match.group(2))
        total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        position = match.end()
    if not compact:
        raise ValueError(text)
    return total


def parse_byte_count(text: str) -> int:
    """``50000``, ``48k``, ``64m``, ``1g`` (also ``64MiB``, ``64mb``): powers of 1024."""
    match = _BYTES.fullmatch(text.strip().lower().replace("_", ""))
    if match is None:
        raise ValueError(text)
    return int(match.group(1)) * _BYTE_UNITS[match.group(2)]


def parse_file_mode(text: str) -> int:
    """Permission bits, always octal as chmod reads them: ``640``, ``0640``, ``0o640``."""
    digits = text.strip().lower()
    digits = digits[2:] if digits.startswith("0o") else digits
    if not digits or not set(digits) <= set("01234567"):
        raise ValueError(text)
    return int(digits, 8)


def parse_bool(text: str) -> bool:
    word = text.strip().lower()
    if word in ("true", "yes", "on", "1"):
        return True
    if word in ("false", "no", "off", "0"):
        return False
    raise ValueError(text)


def parse_int(text: str) -> int:
    return int(text.strip())


def parse_float(text: str) -> float:
    value = float(text.strip())
    if not math.isfinite(value):
        raise ValueError(text)
    return value


#: A length of time in seconds; as text ``90``, ``90s``, ``5m``, ``1h``.
Seconds = Annotated[float, TextForm(parse_seconds, "a number of seconds such as 30, 90s, 5m or 1h")]
#: A number of bytes; as text ``50000``, ``48k``, ``64m``, ``1g``.
ByteCount = Annotated[int, TextForm(parse_byte_count, "a byte count such as 50000, 48k, 64m or 1g")]
#: Permission bits; as text in octal, ``640`` or ``0o640``.
FileMode = Annotated[int, TextForm(parse_file_mode, "permission bits in octal such as 640 or 0o640")]

_PLAIN_FORMS = {
    bool: TextForm(parse_bool, "true or false"),
    int: TextForm(parse_int, "a whole number"),
    float: TextForm(parse_float, "a finite number"),
}
_KEEP_TEXT = object()


def _form_of(annotation: Any) -> TextForm | object | None:
    """The TextForm for a parameter's annotation, ``_KEEP_TEXT`` if it takes
    text as it is, None if it cannot be written as text."""
    if annotation is inspect.Parameter.empty or annotation is Any:
        return _KEEP_TEXT
    if typing.get_origin(annotation) is Annotated:
        for extra in annotation.__metadata__:
            if isinstance(extra, TextForm):
                return extra
        annotation = typing.get_args(annotation)[0]
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        forms = [_form_of(arm) for arm in typing.get_args(annotation) if arm is not type(None)]
        if _KEEP_TEXT in forms:
            return _KEEP_TEXT
        return next((form for form in forms if form is not None), None)
    if annotation is str or annotation is os.PathLike or origin is os.PathLike:
        return _KEEP_TEXT
    return _PLAIN_FORMS.get(annotation)


def _annotations(cls: type) -> dict[str, Any]:
    try:
        hints = typing.get_type_hints(cls.__init__, include_extras=True)
    except Exception:  # noqa: BLE001 - an unresolvable annotation: take the texts as they are
        hints = {}
    names = {}
    for name, parameter in inspect.signature(cls.__init__).parameters.items():
        if parameter.kind is parameter.KEYWORD_ONLY or parameter.kind is parameter.POSITIONAL_OR_KEYWORD:
            names[name] = hints.get(name, inspect.Parameter.empty)
    return names


def read_text_options(cls: type, label: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` with each text value read by the annotation of ``cls``'s
    parameter of that name.  Names the class does not take are passed on for
    the caller to refuse."""
    annotations = _annotations(cls)
    read: dict[str, Any] = {}
    for name, value in options.items():
        if not isinstance(value, str) or name not in annotations:
            read[name] = value
            continue
        if any(ord(char) < 32 or ord(char) == 127 for char in value):
            raise BadTransportOptions(f"transport {label!r}: {name}={value!r} has a control character")
        form = _form_of(annotations[name])
        if form is _KEEP_TEXT:
            read[name] = value
            continue
        if form is None:
            raise BadTransportOptions(f"transport {label!r}: option {name} cannot be given as text "
                                      f"(got {name}={value!r})")
        assert isinstance(form, TextForm)
        try:
            read[name] = form.parse(value)
        except (ValueError, OverflowError):
            raise BadTransportOptions(f"transport {label!r}: {name}={value!r} is not {form.wanted}") from None
    return read
