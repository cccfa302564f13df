"""The codec's error tree.

Every problem the codec finds in its input is one of these; any other
exception escaping the codec is a bug.  Messages name the file (or value)
and what is wrong with it, on one line.
"""

from __future__ import annotations


class CodecError(Exception):
    """Base of every error raised by :mod:`codec`."""


class InvalidValue(CodecError, ValueError):
    """A value handed to the codec by local code breaks the model's rules
    (a header with ``prev > last``, an out-of-range integer, ...)."""


class BadFileName(CodecError):
    """A file name is not a fieldsync message name (or is unsafe)."""


class KeyFileError(CodecError):
    """A key file or keyring is missing, malformed or has unsafe permissions."""


class MessageError(CodecError):
    """A message file was rejected.  ``source`` names the file."""

    def __init__(self, source: str, problem: str) -> None:
        self.source = source
        self.problem = problem
        super().__init__(f"{source}: {problem}")


class CorruptMessage(MessageError):
    """Truncated, garbled or structurally invalid message file."""


class UnsupportedVersion(MessageError):
    """The file is a fieldsync message of a format version this code cannot read."""


class BadSignature(MessageError):
    """The Ed25519 signature does not verify with the sender's key.

    ``claimed_incarnation`` is the incarnation id the file's frame names.
    It is *not* verified: use it only to explain the rejection (a file from
    a copy of the sender that was extracted again, with other keys), never
    to accept anything.
    """

    def __init__(self, source: str, problem: str, claimed_incarnation: bytes | None = None) -> None:
        super().__init__(source, problem)
        self.claimed_incarnation = claimed_incarnation


class UnknownSender(MessageError):
    """The sender is not in the keyring."""


class WrongRecipient(MessageError):
    """The message is addressed to another site."""


class MessageTooLarge(MessageError):
    """The file, or its decompressed payload, is over the allowed size."""


class SealError(MessageError):
    """A sealed message cannot be opened (no key, or authentication failed)."""
