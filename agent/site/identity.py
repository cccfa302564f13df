"""Who a site is: its name, role and incarnation, whatever holds it.

Rules of this file:
* Site and remote names follow the codec's rule (they end up in message
  file names); a role is ``consolidated`` or ``remote``; an incarnation is
  16 random bytes (a UUID4), new at init and at extraction, carried by
  every message.
* Pure: no database.  A SQLite site keeps its identity in
  ``fieldsync_site`` (agent.site.sqlite.schema), a PostgreSQL one in
  ``fieldsync.identity`` (agent.site.postgres.identity).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from enum import Enum

from codec.errors import InvalidValue
from codec.names import check_site_name

from .errors import InvalidSetting


class Role(str, Enum):
    CONSOLIDATED = "consolidated"
    REMOTE = "remote"


@dataclass(frozen=True, slots=True)
class SiteIdentity:
    """Who this database is.  ``incarnation`` is 16 random bytes (a UUID4),
    new at init and at extraction; every message carries it."""

    name: str
    role: Role
    incarnation: bytes
    address: str | None
    transport: str | None
    public_key: str | None
    created_at: datetime
    #: Where peers send to this site when that differs from its inbox
    #: (email: ``mailto:`` while the inbox is an IMAP URL); None: the inbox.
    reply_address: str | None = None

    @property
    def send_address(self) -> str | None:
        """The address this site's peers send to."""
        return self.reply_address or self.address

    def __post_init__(self) -> None:
        check_name(self.name, "site name")
        if not isinstance(self.role, Role):
            raise InvalidSetting(f"site role must be a Role, got {self.role!r}")
        if type(self.incarnation) is not bytes or len(self.incarnation) != 16:
            raise InvalidSetting("site incarnation must be 16 bytes")

    @property
    def incarnation_uuid(self) -> uuid.UUID:
        return uuid.UUID(bytes=self.incarnation)


def check_name(name: object, what: str) -> str:
    """Site names follow the codec's rule (they end up in message file names)."""
    try:
        return check_site_name(name)  # type: ignore[arg-type]
    except InvalidValue as error:
        raise InvalidSetting(f"{what}: {error}") from None


def check_role(role: object) -> Role:
    try:
        return Role(role)
    except ValueError:
        raise InvalidSetting(f"site role must be 'consolidated' or 'remote', got {role!r}") from None


def check_texts(what: str, **values: object) -> None:
    """Refuse any of ``values`` (an address, a transport, a public key ...)
    that is neither None nor text: ``what`` names whose they are."""
    for name, value in values.items():
        if value is not None and type(value) is not str:
            raise InvalidSetting(f"{what} {name.replace('_', ' ')} must be text, got {type(value).__name__}")


def new_incarnation() -> bytes:
    return uuid.uuid4().bytes


def next_generation(database_generation: int, identity: SiteIdentity, marker_generation: int,
                    marker_incarnation: bytes | None) -> tuple[int, bytes, bytes | None]:
    """The count of agent runs a site keeps (agent/restore.py compares it
    with the count kept in the agent's folder), the rule for both backends:
    a folder whose count is ahead of the database's, for this incarnation,
    means the database was put back; it then takes a new incarnation.
    Returns (generation, incarnation, replaced incarnation or None)."""
    incarnation, renewed = identity.incarnation, None
    if marker_incarnation == incarnation and marker_generation > database_generation:
        renewed, incarnation = incarnation, new_incarnation()
    return max(database_generation, marker_generation) + 1, incarnation, renewed
