"""fieldsync's message codec: headers, file names, message files, keys, packing."""

from .errors import (
    BadFileName,
    BadSignature,
    CodecError,
    CorruptMessage,
    InvalidValue,
    KeyFileError,
    MessageError,
    MessageTooLarge,
    SealError,
    UnknownSender,
    UnsupportedVersion,
    WrongRecipient,
)
from .ops import OP_KIND_NAMES, Operation, OpKind, Transaction, Value, check_operation, check_value, values_identical

__all__ = [
    "BadFileName", "BadSignature", "CodecError", "CorruptMessage", "InvalidValue", "KeyFileError",
    "MessageError", "MessageTooLarge", "SealError", "UnknownSender", "UnsupportedVersion",
    "WrongRecipient", "OP_KIND_NAMES", "Operation", "OpKind", "check_operation", "Transaction", "Value", "check_value", "values_identical",
]
