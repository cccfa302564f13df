"""The email that carries a message file: building it, and reading the
file back out of one.

Rules of this file:
* A message file travels as one email: the file is its only attachment,
  named like the file; the name is also in the subject and in the header
  ``X-Fieldsync-Message``, which is what marks fieldsync's mail.
* An email marked as ours that cannot be a message file (headers changed,
  no or several attachments, bad base64, an unusable name) is
  ``Malformed``, with the reason; it is never half read.
* The server's announced size is a hint, not a bound: only what was
  fetched is believed (``oversize``).
"""

from __future__ import annotations

import email.policy
from email.message import EmailMessage
from email.parser import BytesHeaderParser, BytesParser
from email.utils import formatdate, make_msgid

HEADER = "X-Fieldsync-Message"
# RFC 5322 allows 998-character lines: long file names stay whole, unfolded.
_POLICY = email.policy.SMTP.clone(max_line_length=998)


def build_email(name: str, data: bytes, sender: str, recipient: str) -> bytes:
    """The email that carries file ``name``: a short note and the file as attachment."""
    message = EmailMessage(policy=_POLICY)
    message["From"] = sender
    message["To"] = recipient
    message["Subject"] = f"fieldsync {name}"
    message["Date"] = formatdate(usegmt=True)
    message["Message-ID"] = make_msgid("fieldsync", domain=sender.rpartition("@")[2])
    message[HEADER] = name
    # No vacation replies or bounces-to-bounces for machine mail (RFC 3834).
    message["Auto-Submitted"] = "auto-generated"
    message.set_content(f"fieldsync message file {name} ({len(data)} bytes) is attached.\n"
                        "It is read and removed by the fieldsync agent of the receiving site.\n")
    message.add_attachment(data, maintype="application", subtype="octet-stream", filename=name)
    return message.as_bytes()


class Malformed(Exception):
    """An email marked as fieldsync's that cannot be a message file (the reason)."""


def usable_name(name: str | None) -> bool:
    """A name that is safe to hand to the agent as a file name (message name or not)."""
    return (bool(name) and len(name.encode("utf-8", "surrogatepass")) <= 255 and not name.startswith(".")
            and not any(char in name for char in "/\\") and not any(ord(char) < 32 or ord(char) == 127
                                                                    for char in name))


def read_attachment(raw: bytes, name: str) -> bytes:
    """The file carried by ``raw``, an email announcing ``name``; Malformed if it is not one."""
    message = BytesParser(policy=email.policy.default).parsebytes(raw)
    announced = [str(value).strip() for value in message.get_all(HEADER, [])]
    if announced != [name]:
        raise Malformed(f"its {HEADER} headers changed to {announced!r}")
    if not message.is_multipart():
        raise Malformed("it has no attachment")
    files = [part for part in message.iter_attachments() if part.get_filename() is not None]
    if len(files) != 1:
        raise Malformed(f"it has {len(files)} attached files, not one")
    [part] = files
    if part.get_filename() != name:
        raise Malformed(f"its attachment is named {part.get_filename()!r}, not {name!r}")
    if part.get_content_maintype() in ("multipart", "message"):
        raise Malformed("its attachment is not a file")
    data = part.get_payload(decode=True)
    encoding = (part.get("Content-Transfer-Encoding") or "").strip().lower()
    if encoding == "base64" and any("base64" in type(defect).__name__.lower() or "padding" in str(defect).lower()
                                    for defect in part.defects):
        raise Malformed("its attachment is not valid base64")
    if not isinstance(data, bytes):
        raise Malformed("its attachment has no content")
    return data


def oversize(announced: int, fetched: int | None, limit: int) -> str | None:
    """Why an email is too large to read, or None.  ``announced`` is the
    server's RFC822.SIZE, ``fetched`` how many bytes a fetch of at most
    ``limit`` + 1 gave (None before the fetch): only what was fetched is
    believed, the announced size only spares the fetch of a large one."""
    if announced > limit:
        return f"it is {announced} bytes, over the max_message_size of {limit}"
    if fetched is not None and fetched > limit:
        return (f"it is over the max_message_size of {limit} (the server announced {announced} bytes; "
                f"reading stopped at {fetched})")
    return None


def announced_name(header_block: bytes) -> str | None:
    values = BytesHeaderParser(policy=email.policy.default).parsebytes(header_block).get_all(HEADER, [])
    return str(values[0]).strip() or None if len(values) == 1 else None
