"""Site keys: an Ed25519 signing key and an X25519 sealing key per site.

Rules of this file:
* A secret key file is text (format in docs/message-format.md), written
  whole (temp file, fsync, rename) with mode 0600, and refused on load when
  group or others have any access to it or another user owns it.
* A public key travels as one line, ``fieldsync-public-key v1 SITE SIGN SEAL``
  (base64 of the raw 32-byte keys), so it can be pasted into a command.
* The fingerprint is what people compare by eye: 16 base32 characters of the
  SHA-256 of both public keys, in groups of four.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Iterable, Iterator, Mapping

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from .atomic import write_file_atomically
from .errors import InvalidValue, KeyFileError
from .names import check_site_name

SECRET_MAGIC = "fieldsync-secret-key v1"
PUBLIC_MAGIC = "fieldsync-public-key v1"
_MAX_KEY_FILE = 4096  # a key file is four short lines; anything far larger is not one
_RAW = serialization.Encoding.Raw
# Any private key shows a low-order public one: their shared secret is zero.
_PROBE = X25519PrivateKey.from_private_bytes(hashlib.sha256(b"fieldsync low-order probe").digest())


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str, what: str) -> bytes:
    try:
        data = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise InvalidValue(f"{what} is not base64") from None
    if len(data) != 32:
        raise InvalidValue(f"{what} must be 32 bytes, got {len(data)}")
    return data


def _parse_line(line: str) -> tuple[str, bytes, bytes]:
    """The site name and raw keys of a public key line, its form checked."""
    parts = line.strip().split()
    if len(parts) != 5 or " ".join(parts[:2]) != PUBLIC_MAGIC:
        raise InvalidValue(f"not a fieldsync public key line: {line.strip()[:60]!r}")
    site = parts[2]
    return check_site_name(site), _unb64(parts[3], f"sign key of {site}"), _unb64(parts[4], f"seal key of {site}")


def _fingerprint(sign: bytes, seal: bytes) -> str:
    digest = hashlib.sha256(sign + seal).digest()
    text = base64.b32encode(digest[:10]).decode("ascii")
    return "-".join(text[i:i + 4] for i in range(0, 16, 4))


def line_fingerprint(line: str) -> str:
    """The fingerprint of a public key line, the line's form checked as
    :meth:`PublicKeys.from_line` checks it, but not whether its seal key
    is a usable X25519 point: that check is an exchange (tens of
    microseconds a key), a listing of a fleet's stored keys (``agent
    status``) need not pay it, and every use of a key checks it."""
    _, sign, seal = _parse_line(line)
    return _fingerprint(sign, seal)


# Parsed signature keys by their bytes (PublicKeys.verifier): at most this
# many are kept, then all are dropped and parsed again as they are used.
VERIFIERS_KEPT = 4096
_VERIFIERS: dict[bytes, Ed25519PublicKey] = {}


@dataclass(frozen=True, slots=True)
class PublicKeys:
    """A site's public keys: ``sign`` (Ed25519) and ``seal`` (X25519), raw bytes."""

    site: str
    sign: bytes
    seal: bytes

    def __post_init__(self) -> None:
        check_site_name(self.site)
        for field in ("sign", "seal"):
            value = getattr(self, field)
            if type(value) is not bytes or len(value) != 32:
                raise InvalidValue(f"{field} public key of {self.site} must be 32 raw bytes")
        try:
            _PROBE.exchange(X25519PublicKey.from_public_bytes(self.seal))
        except ValueError:
            # A low-order point (all zeros, say): every secret made with it is
            # zero, so nothing sealed to it would be secret.
            raise InvalidValue(f"seal public key of {self.site} is a low-order X25519 point, "
                               f"not a usable key") from None

    @property
    def fingerprint(self) -> str:
        return _fingerprint(self.sign, self.seal)

    def to_line(self) -> str:
        return f"{PUBLIC_MAGIC} {self.site} {_b64(self.sign)} {_b64(self.seal)}"

    @classmethod
    def from_line(cls, line: str) -> "PublicKeys":
        return cls(*_parse_line(line))

    def verifier(self) -> Ed25519PublicKey:
        """The key that checks this site's signatures, parsed once (a
        receiver checks many messages of a few senders, and parsing a key
        costs about what checking a small message does)."""
        verifier = _VERIFIERS.get(self.sign)
        if verifier is None:
            if len(_VERIFIERS) >= VERIFIERS_KEPT:
                _VERIFIERS.clear()
            verifier = _VERIFIERS[self.sign] = Ed25519PublicKey.from_public_bytes(self.sign)
        return verifier

    def seal_key(self) -> X25519PublicKey:
        return X25519PublicKey.from_public_bytes(self.seal)


class SiteKeys:
    """A site's private keys.  Not a value: it holds secrets, so no repr of them."""

    __slots__ = ("site", "_sign", "_seal", "_public")

    def __init__(self, site: str, sign: Ed25519PrivateKey, seal: X25519PrivateKey) -> None:
        self.site = check_site_name(site)
        self._sign = sign
        self._seal = seal
        self._public = PublicKeys(
            site,
            sign.public_key().public_bytes(_RAW, serialization.PublicFormat.Raw),
            seal.public_key().public_bytes(_RAW, serialization.PublicFormat.Raw),
        )

    @classmethod
    def generate(cls, site: str) -> "SiteKeys":
        return cls(site, Ed25519PrivateKey.generate(), X25519PrivateKey.generate())

    @classmethod
    def from_seeds(cls, site: str, sign_seed: bytes, seal_seed: bytes) -> "SiteKeys":
        """Rebuild keys from their raw 32-byte private values (fixtures, tests)."""
        return cls(site, Ed25519PrivateKey.from_private_bytes(sign_seed),
                   X25519PrivateKey.from_private_bytes(seal_seed))

    @property
    def public(self) -> PublicKeys:
        return self._public

    @property
    def signer(self) -> Ed25519PrivateKey:
        return self._sign

    @property
    def sealer(self) -> X25519PrivateKey:
        return self._seal

    def secret_seed(self) -> bytes:
        """Raw signing seed; used to derive per-message sealing keys."""
        return self._sign.private_bytes(_RAW, serialization.PrivateFormat.Raw, serialization.NoEncryption())

    def __repr__(self) -> str:
        return f"SiteKeys({self.site!r}, fingerprint={self.public.fingerprint})"

    # --- files -------------------------------------------------------------

    def to_text(self) -> str:
        seal = self._seal.private_bytes(_RAW, serialization.PrivateFormat.Raw, serialization.NoEncryption())
        return (f"{SECRET_MAGIC}\nsite: {self.site}\nsign: {_b64(self.secret_seed())}\n"
                f"seal: {_b64(seal)}\n")

    def save(self, path: str | os.PathLike[str], *, replace: bool = True) -> Path:
        """Write the secret key file whole, mode 0600; with ``replace=False``
        never over an existing file (FileExistsError)."""
        target = Path(path)
        write_file_atomically(target, self.to_text().encode("ascii"), mode=0o600, replace=replace)
        return target

    @classmethod
    def from_text(cls, text: str, source: str = "key") -> "SiteKeys":
        lines = text.splitlines()
        if not lines or lines[0].strip() != SECRET_MAGIC:
            raise KeyFileError(f"{source}: not a fieldsync secret key file (first line must be {SECRET_MAGIC!r})")
        fields: dict[str, str] = {}
        for number, line in enumerate(lines[1:], start=2):
            if not line.strip():
                continue
            name, colon, value = line.partition(":")
            if not colon:
                raise KeyFileError(f"{source}: line {number} is not 'name: value'")
            fields[name.strip()] = value.strip()
        missing = {"site", "sign", "seal"} - fields.keys()
        if missing:
            raise KeyFileError(f"{source}: missing {', '.join(sorted(missing))}")
        try:
            return cls.from_seeds(check_site_name(fields["site"]), _unb64(fields["sign"], "sign key"),
                                  _unb64(fields["seal"], "seal key"))
        except InvalidValue as error:
            raise KeyFileError(f"{source}: {error}") from None

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> "SiteKeys":
        """Read a secret key file, refused (as OpenSSH refuses a private key)
        when group or others have any access to it or another user owns it."""
        source = Path(path)
        try:
            if not stat.S_ISREG(source.stat().st_mode):
                # Opening a FIFO would wait for a writer; a folder has no text.
                raise KeyFileError(f"{source}: a secret key file must be a regular file")
            with open(source, "rb") as handle:
                # The checks look at the file that is read, not at whatever
                # the name pointed to a moment before.
                _check_private(source, os.fstat(handle.fileno()))
                data = handle.read(_MAX_KEY_FILE + 1)
            if len(data) > _MAX_KEY_FILE:
                raise KeyFileError(f"{source}: too large for a secret key file")
            text = data.decode("ascii")
        except KeyFileError:
            raise
        except (OSError, UnicodeDecodeError) as error:
            raise KeyFileError(f"{source}: cannot read secret key file ({error})") from None
        return cls.from_text(text, str(source))


def _check_private(source: Path, status: os.stat_result) -> None:
    mode = stat.S_IMODE(status.st_mode)
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyFileError(f"{source}: secret key file is open to group or others (mode {mode:o}); "
                           f"run: chmod 600 {source}")
    user = os.geteuid() if hasattr(os, "geteuid") else None  # no owners to compare on Windows
    if user is not None and status.st_uid != user:
        raise KeyFileError(f"{source}: secret key file belongs to uid {status.st_uid}, not to {_user_name(user)} "
                           f"who runs fieldsync; run fieldsync as its owner, or as root: "
                           f"chown {_user_name(user)} {source}")


def _user_name(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return str(uid)


class Keyring(Mapping[str, PublicKeys]):
    """The public keys of a site's peers, by site name."""

    def __init__(self, keys: Iterable[PublicKeys] = ()) -> None:
        self._keys: dict[str, PublicKeys] = {}
        self.view = MappingProxyType(self._keys)
        for key in keys:
            self.add(key)

    def add(self, key: PublicKeys, *, replace: bool = False) -> None:
        known = self._keys.get(key.site)
        if known is not None and known != key and not replace:
            raise InvalidValue(
                f"keyring already holds a different key for {key.site} "
                f"({known.fingerprint}, new {key.fingerprint}); pass replace=True to change it"
            )
        self._keys[key.site] = key

    def remove(self, site: str) -> None:
        self._keys.pop(site, None)

    def __getitem__(self, site: str) -> PublicKeys:
        return self._keys[site]

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def to_text(self) -> str:
        return "".join(self._keys[site].to_line() + "\n" for site in sorted(self._keys))

    def save(self, path: str | os.PathLike[str]) -> None:
        write_file_atomically(Path(path), self.to_text().encode("ascii"), mode=0o644)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> "Keyring":
        source = Path(path)
        try:
            text = source.read_text(encoding="ascii")
        except (OSError, UnicodeDecodeError) as error:
            raise KeyFileError(f"{source}: cannot read keyring ({error})") from None
        ring = cls()
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            try:
                ring.add(PublicKeys.from_line(line))
            except InvalidValue as error:
                raise KeyFileError(f"{source}:{number}: {error}") from None
        return ring
