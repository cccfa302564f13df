import base64
import os
import stat

import pytest
from cryptography.exceptions import InvalidSignature

from codec.errors import InvalidValue, KeyFileError
from codec.keys import PUBLIC_MAGIC, Keyring, PublicKeys, SiteKeys, line_fingerprint


def test_generate_save_load_round_trip(tmp_path):
    keys = SiteKeys.generate("hq")
    path = keys.save(tmp_path / "hq.key")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    loaded = SiteKeys.load(path)
    assert loaded.public == keys.public
    signature = loaded.signer.sign(b"data")
    keys.public.verifier().verify(signature, b"data")
    assert "sign" not in repr(loaded) and keys.public.fingerprint in repr(loaded)
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_verifier_is_parsed_once_per_key_and_the_kept_ones_are_bounded(monkeypatch):
    import codec.keys

    monkeypatch.setattr(codec.keys, "_VERIFIERS", {})
    monkeypatch.setattr(codec.keys, "VERIFIERS_KEPT", 3)
    keys = [SiteKeys.generate(f"s{index}") for index in range(4)]
    first = keys[0].public.verifier()
    assert keys[0].public.verifier() is first
    assert PublicKeys.from_line(keys[0].public.to_line()).verifier() is first  # the same key, another value
    assert keys[1].public.verifier() is not first
    keys[1].public.verifier().verify(keys[1].signer.sign(b"m"), b"m")
    with pytest.raises(InvalidSignature):
        keys[1].public.verifier().verify(keys[0].signer.sign(b"m"), b"m")
    keys[2].public.verifier()
    assert len(codec.keys._VERIFIERS) == 3
    keys[3].public.verifier()
    assert list(codec.keys._VERIFIERS) == [keys[3].public.sign]
    assert keys[0].public.verifier() is not first  # dropped with the rest, parsed again
    keys[0].public.verifier().verify(keys[0].signer.sign(b"m"), b"m")


def test_load_refuses_a_key_others_can_read(tmp_path):
    path = SiteKeys.generate("hq").save(tmp_path / "hq.key")
    os.chmod(path, 0o644)
    with pytest.raises(KeyFileError, match="chmod 600"):
        SiteKeys.load(path)


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o610, 0o601, 0o660])
def test_load_refuses_a_key_group_or_others_have_any_access_to(tmp_path, mode):
    path = SiteKeys.generate("hq").save(tmp_path / "hq.key")
    os.chmod(path, mode)
    with pytest.raises(KeyFileError) as raised:
        SiteKeys.load(path)
    assert str(raised.value) == (f"{path}: secret key file is open to group or others (mode {mode:o}); "
                                 f"run: chmod 600 {path}")


def test_load_refuses_a_key_another_user_owns(tmp_path, monkeypatch):
    path = SiteKeys.generate("hq").save(tmp_path / "hq.key")
    owner = path.stat().st_uid
    monkeypatch.setattr(os, "geteuid", lambda: owner + 1)
    with pytest.raises(KeyFileError, match=f"belongs to uid {owner}, not to .* chown .* {path}$"):
        SiteKeys.load(path)


def test_load_refuses_what_is_not_a_regular_file(tmp_path):
    os.mkfifo(tmp_path / "fifo")  # reading it would wait for a writer
    with pytest.raises(KeyFileError, match="must be a regular file"):
        SiteKeys.load(tmp_path / "fifo")


def test_save_without_replace_never_writes_over_a_key(tmp_path):
    keys = SiteKeys.generate("hq")
    first = keys.save(tmp_path / "hq.key", replace=False)
    with pytest.raises(FileExistsError) as raised:
        SiteKeys.generate("hq").save(first, replace=False)
    assert raised.value.filename == str(first)
    assert SiteKeys.load(first).to_text() == keys.to_text()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["hq.key"]  # no temporary file left


@pytest.mark.parametrize("text, problem", [
    ("", "not a fieldsync secret key"),
    ("fieldsync-secret-key v1\nsite: hq\nsign: AAAA\n", "missing seal"),
    ("fieldsync-secret-key v1\nsite: hq\nsign: !!\nseal: AAAA\n", "not base64"),
    ("fieldsync-secret-key v1\nsite: hq\nsign: AAAA\nseal: AAAA\n", "32 bytes"),
    ("fieldsync-secret-key v1\nsite: ../x\nsign: AAAA\nseal: AAAA\n", "invalid site name"),
    ("fieldsync-secret-key v1\nbroken line\n", "line 2"),
])
def test_bad_key_files_give_one_clear_error(tmp_path, text, problem):
    path = tmp_path / "k.key"
    path.write_text(text)
    os.chmod(path, 0o600)
    with pytest.raises(KeyFileError, match=problem) as raised:
        SiteKeys.load(path)
    assert str(path) in str(raised.value)


def test_missing_key_file(tmp_path):
    with pytest.raises(KeyFileError, match="cannot read"):
        SiteKeys.load(tmp_path / "absent.key")


def test_fingerprint_is_short_stable_and_distinct():
    keys = SiteKeys.from_seeds("hq", bytes(32), bytes(range(32)))
    fingerprint = keys.public.fingerprint
    assert len(fingerprint) == 19 and fingerprint.count("-") == 3
    assert fingerprint == SiteKeys.from_seeds("hq", bytes(32), bytes(range(32))).public.fingerprint
    assert fingerprint != SiteKeys.from_seeds("hq", bytes([1]) * 32, bytes(range(32))).public.fingerprint


def test_public_key_line_round_trip_and_errors():
    public = SiteKeys.generate("field-7").public
    assert PublicKeys.from_line(public.to_line()) == public
    for line in ("", "fieldsync-public-key v1 hq", "ssh-ed25519 AAAA hq",
                 public.to_line().replace("field-7", "a/b")):
        with pytest.raises(InvalidValue):
            PublicKeys.from_line(line)


@pytest.mark.parametrize("seal", [
    bytes(32),  # zero
    (1).to_bytes(32, "little"),  # the point of order 4
    bytes.fromhex("e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800"),  # order 8
])
def test_a_low_order_seal_key_is_refused_where_it_is_read(seal):
    public = SiteKeys.generate("field-7").public
    line = f"{PUBLIC_MAGIC} field-7 {base64.b64encode(public.sign).decode()} {base64.b64encode(seal).decode()}"
    with pytest.raises(InvalidValue, match="^seal public key of field-7 is a low-order X25519 point, not a usable key$"):
        PublicKeys.from_line(line)
    # A listing of stored keys shows its fingerprint; using it refuses it (above).
    assert len(line_fingerprint(line)) == 19


def test_a_line_fingerprint_is_the_keys_and_its_line_is_checked_as_from_line_checks_it():
    for seed in range(5):
        public = SiteKeys.from_seeds(f"r{seed}", bytes([seed]) * 32, bytes([seed + 1]) * 32).public
        assert line_fingerprint(public.to_line()) == public.fingerprint
    public = SiteKeys.generate("field-7").public
    for line in ("", "fieldsync-public-key v1 hq", "ssh-ed25519 AAAA hq",
                 public.to_line().replace("field-7", "a/b"), public.to_line()[:-8]):
        with pytest.raises(InvalidValue):
            line_fingerprint(line)


def test_keyring_refuses_silent_key_change(tmp_path):
    first = SiteKeys.generate("f1").public
    second = SiteKeys.generate("f1").public
    ring = Keyring([first])
    ring.add(first)  # the same key again is fine
    with pytest.raises(InvalidValue, match="different key"):
        ring.add(second)
    ring.add(second, replace=True)
    assert ring["f1"] == second
    ring.add(SiteKeys.generate("f2").public)
    ring.save(tmp_path / "ring")
    assert dict(Keyring.load(tmp_path / "ring")) == dict(ring)
    ring.remove("f2")
    assert list(ring) == ["f1"] and len(ring) == 1
    with pytest.raises(TypeError):
        ring.view["x"] = first  # the view is read-only


def test_keyring_file_errors_name_the_line(tmp_path):
    path = tmp_path / "ring"
    path.write_text("# peers\n" + SiteKeys.generate("f1").public.to_line() + "\ngarbage\n")
    with pytest.raises(KeyFileError, match=r"ring:3"):
        Keyring.load(path)
