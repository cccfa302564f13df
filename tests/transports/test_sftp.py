"""The sftp transport against a real OpenSSH server: conformance, then what only SFTP has."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import re
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import paramiko
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

import transports.registry
from transports import (
    BadAddress,
    BadTransportOptions,
    Incoming,
    TransportRefused,
    TransportUnavailable,
    create_transport,
)
from transports.sftp import SftpAddress, SftpTransport, quiet_read_ahead_threads

from .conformance import TransportConformance, message_name, receive_all, receive_wanted, received, record_reads
from .servers import REPO_ROOT, ServerFailed, SshServer, TcpProxy, free_port, make_ssh_key

TEMP_NAME = re.compile(r"\.(?P<name>.+)\.[0-9a-f]{16}\.tmp\Z")

INTERRUPTED_SEND = """
import asyncio, os, sys
import paramiko
from transports.sftp import SftpTransport

# Killed between writing the temp file and renaming it.
paramiko.SFTPClient.posix_rename = lambda *args: os._exit(9)

async def main():
    transport = SftpTransport(key_file=sys.argv[3], known_hosts=sys.argv[4])
    await transport.send(sys.argv[1], sys.argv[2], sys.stdin.buffer.read())

asyncio.run(main())
"""


def local_path(address: str) -> Path:
    """The inbox's path on this machine (the test server serves the local file system)."""
    return Path(SftpAddress.parse(address).path)


class TestSftpConformance(TransportConformance):
    @pytest.fixture
    def make_transport(self, sshd):
        return lambda: SftpTransport(key_file=str(sshd.client_key), known_hosts=str(sshd.known_hosts))

    @pytest.fixture
    def inbox(self, sshd) -> str:
        return sshd.new_inbox("hq")[0]

    @pytest.fixture
    def peer_inbox(self, sshd) -> str:
        return sshd.new_inbox("field1")[0]

    @pytest.fixture(autouse=True)
    def _server(self, sshd) -> None:
        self.sshd = sshd

    async def place_raw_file(self, address: str, name: str, data: bytes) -> None:
        (local_path(address) / name).write_bytes(data)

    async def leave_interrupted_send(self, address: str, name: str, data: bytes) -> None:
        result = subprocess.run(
            [sys.executable, "-c", INTERRUPTED_SEND, address, name, str(self.sshd.client_key),
             str(self.sshd.known_hosts)],
            input=data, cwd=REPO_ROOT, capture_output=True, timeout=60)
        assert result.returncode == 9, result.stderr.decode()
        [temp] = [path.name for path in local_path(address).iterdir()]
        assert temp.startswith(f".{name}.") and temp.endswith(".tmp")
        assert (local_path(address) / temp).read_bytes() == data


# -- helpers -------------------------------------------------------------------------


def transport_for(sshd, **options) -> SftpTransport:
    settings = dict(key_file=str(sshd.client_key), known_hosts=str(sshd.known_hosts), retries=2, retry_delay=0.05)
    settings.update(options)
    return SftpTransport(**settings)


def known_hosts_for(sshd, tmp_path: Path, port: int) -> Path:
    path = tmp_path / f"known_hosts-{port}"
    path.write_text(f"[127.0.0.1]:{port} {sshd.host_public_key}\n")
    return path


def visible(path: Path) -> list[str]:
    return sorted(entry.name for entry in path.iterdir())


def one_line_error(error: BaseException) -> str:
    text = str(error)
    assert "\n" not in text and text
    return text


@pytest.fixture
def inbox(sshd) -> tuple[str, Path]:
    return sshd.new_inbox()


@pytest.fixture
async def transport(sshd):
    async with transport_for(sshd) as transport:
        yield transport


@pytest.fixture
def own_sshd():
    """An sshd of this test's own, which the test may stop and start again."""
    server = SshServer()
    try:
        server.start()
    except ServerFailed as error:
        server.close()
        pytest.fail(str(error), pytrace=False)
    yield server
    server.close()


@pytest.fixture
def proxy(sshd):
    relay = TcpProxy(sshd.port)
    yield relay
    relay.close()


# -- addresses ---------------------------------------------------------------------------


@pytest.mark.parametrize("address, user, host, port, path, normal", [
    ("sftp://hq@files.example.com/srv/fieldsync/hq", "hq", "files.example.com", 22, "/srv/fieldsync/hq",
     "sftp://hq@files.example.com:22/srv/fieldsync/hq"),
    ("SFTP://hq@files.example.com:2222/srv/in%20box/", "hq", "files.example.com", 2222, "/srv/in box",
     "sftp://hq@files.example.com:2222/srv/in%20box"),
    ("sftp://field1@10.0.0.5/~/inbox", "field1", "10.0.0.5", 22, "inbox", "sftp://field1@10.0.0.5:22/~/inbox"),
    ("sftp://field1@[::1]:22/srv/./a/../inbox", "field1", "::1", 22, "/srv/inbox", "sftp://field1@[::1]:22/srv/inbox"),
    ("sftp://me%40corp@host/in", "me@corp", "host", 22, "/in", "sftp://me%40corp@host:22/in"),
])
def test_addresses_parse_and_normalise(address, user, host, port, path, normal) -> None:
    parsed = SftpAddress.parse(address)
    assert (parsed.user, parsed.host, parsed.port, parsed.path) == (user, host, port, path)
    assert str(parsed) == normal
    assert SftpAddress.parse(normal) == parsed
    assert SftpTransport().check_address(address) == normal


@pytest.mark.parametrize("address, complaint", [
    ("sftp://hq:secret@host/inbox", "password"),
    ("sftp://host/inbox", "names no user"),
    ("sftp://hq@host", "names no inbox"),
    ("sftp://hq@host/", "names no inbox"),
    ("sftp://hq@host/inbox?x=1", "'?'"),
    ("ftp://hq@host/inbox", "sftp://user@host"),
    ("/srv/inbox", "sftp://user@host"),
    ("sftp://hq@host:99999/inbox", "not a URL"),
    ("sftp://hq@host/in%0Abox", "control character"),
    ("sftp://hq@host/in%7Fbox", "control character"),
    ("sftp://hq@host/in%C2%85box", "control character"),
])
async def test_bad_addresses_are_refused_before_connecting(address, complaint) -> None:
    async with SftpTransport() as transport:
        with pytest.raises(BadAddress, match=re.escape(complaint)) as caught:
            await transport.send(address, message_name(1), b"x")
    assert "secret" not in str(caught.value)


@pytest.mark.parametrize("options", [
    {"password_file": "a", "password_env": "B"}, {"password_env": "not a name"}, {"retries": -1},
    {"retry_delay": 100}, {"channels": 0}, {"timeout": 0}, {"max_file_size": -1}, {"max_file_size": 0}, {"file_mode": 0o1000},
    {"accept_new_host_key": "yes"}, {"key_file": ""},
])
def test_bad_options_are_refused(options) -> None:
    with pytest.raises(ValueError):
        SftpTransport(**options)


def test_the_registry_builds_it(sshd, monkeypatch) -> None:
    # Keep the registry's cache of loaded classes as it was: test_registry checks
    # what happens when a built-in's module cannot be imported.
    monkeypatch.setattr(transports.registry, "_loaded", dict(transports.registry._loaded))
    transport = create_transport("sftp", key_file=str(sshd.client_key), accept_new_host_key=False)
    assert isinstance(transport, SftpTransport)
    with pytest.raises(BadTransportOptions):
        create_transport("sftp", password="secret")


# -- how send writes ---------------------------------------------------------------------


async def test_send_writes_a_temp_file_then_renames_it_in_worker_threads(transport, inbox, monkeypatch) -> None:
    address, path = inbox
    name, data = message_name(1), b"d" * 300_000
    loop_thread = threading.get_ident()
    events = []
    real_rename = paramiko.SFTPClient.posix_rename
    real_request = paramiko.SFTPClient._request

    def spy_rename(client, source, target):
        source_name = source.rsplit("/", 1)[1]
        assert TEMP_NAME.match(source_name)["name"] == name
        assert (path / source_name).read_bytes() == data  # whole before it gets its name
        assert not (path / name).exists()
        events.append(("rename", threading.get_ident() != loop_thread))
        return real_rename(client, source, target)

    def spy_request(client, kind, *args):
        if args and args[0] == "fsync@openssh.com":
            events.append(("fsync", threading.get_ident() != loop_thread))
        return real_request(client, kind, *args)

    monkeypatch.setattr(paramiko.SFTPClient, "posix_rename", spy_rename)
    monkeypatch.setattr(paramiko.SFTPClient, "_request", spy_request)
    await transport.send(address, name, data)
    assert events == [("fsync", True), ("rename", True)]
    assert visible(path) == [name]
    assert (path / name).read_bytes() == data


async def test_file_mode_option(sshd, inbox) -> None:
    address, path = inbox
    async with transport_for(sshd, file_mode=0o640) as transport:
        await transport.send(address, message_name(1), b"x")
    assert stat.S_IMODE((path / message_name(1)).stat().st_mode) == 0o640


async def test_a_missing_inbox_directory_is_unavailable_at_once(sshd) -> None:
    address = sshd.address(sshd.root / "not-created")
    async with transport_for(sshd, retry_delay=5) as transport:
        started = time.monotonic()
        with pytest.raises(TransportUnavailable) as caught:
            await transport.send(address, message_name(1), b"x")
        with pytest.raises(TransportUnavailable):
            await receive_all(transport, address)
    assert time.monotonic() - started < 3  # an answer about the file is not retried
    assert "does not exist on the server" in one_line_error(caught.value)
    assert str(sshd.root / "not-created") in str(caught.value)


# -- what receive reads --------------------------------------------------------------------


async def test_temp_files_are_skipped_and_only_our_stale_ones_removed(transport, inbox) -> None:
    address, path = inbox
    name = message_name(1)
    stale_own = path / f".{name}.0123456789abcdef.tmp"
    fresh_own = path / f".{name}.fedcba9876543210.tmp"
    not_ours = [path / ".notes.tmp", path / f"{name}.part", path / f"{name}.filepart"]
    for file in [stale_own, fresh_own, *not_ours]:
        file.write_bytes(b"partial")
    for file in [stale_own, *not_ours]:
        moment = time.time() - 2 * 3600
        os.utime(file, (moment, moment))
    assert await receive_all(transport, address) == []
    assert not stale_own.exists()
    assert fresh_own.exists() and all(file.exists() for file in not_ours)


async def test_links_and_directories_are_ignored(transport, inbox, tmp_path) -> None:
    address, path = inbox
    outside = tmp_path / "outside.fsm"
    outside.write_bytes(b"secret")
    (path / message_name(1)).symlink_to(outside)
    (path / message_name(2)).mkdir()
    (path / message_name(3)).write_bytes(b"real")
    got = await receive_all(transport, address)
    assert [(incoming.name, incoming.data) for incoming in got] == [(message_name(3), b"real")]
    await transport.ack(got[0])
    assert outside.read_bytes() == b"secret"
    assert visible(path) == [message_name(1), message_name(2)]


async def test_files_over_the_size_limit_are_left_and_logged_once(sshd, inbox, caplog) -> None:
    address, path = inbox
    (path / message_name(1)).write_bytes(b"x" * 10_001)
    (path / message_name(2)).write_bytes(b"y" * 10_000)
    async with transport_for(sshd, max_file_size=10_000) as limited:
        with caplog.at_level(logging.WARNING, logger="transports"):
            assert await received(limited, address) == {message_name(2): b"y" * 10_000}
            assert await received(limited, address) == {message_name(2): b"y" * 10_000}
        refusals = []
        assert [incoming.name async for incoming in limited.receive(address, refused=refusals.append)] == [
            message_name(2)]
    warnings = [record.getMessage() for record in caplog.records if message_name(1) in record.getMessage()]
    assert len(warnings) == 1 and "10000 byte limit" in warnings[0]
    [refusal] = refusals
    assert refusal.name == message_name(1) and "10001 bytes, over the 10000 byte limit" in refusal.reason
    assert (path / message_name(1)).stat().st_size == 10_001


async def test_a_hard_link_is_left_unread_as_the_folder_transport_does(transport, inbox, tmp_path) -> None:
    """A file with a second link (to a file outside the inbox, say) is
    refused, not read: its link count comes from the listing."""
    address, path = inbox
    outside = tmp_path / "private.key"
    outside.write_bytes(b"someone's secret")
    os.link(outside, path / message_name(1))
    (path / message_name(2)).write_bytes(b"real")
    assert await received(transport, address) == {message_name(2): b"real"}
    refusals = []
    got = [incoming async for incoming in transport.receive(address, refused=refusals.append)]
    assert [(incoming.name, incoming.data) for incoming in got] == [(message_name(2), b"real")]
    [refusal] = refusals
    assert refusal.name == message_name(1) and "2 links" in refusal.reason
    assert visible(path) == [message_name(1), message_name(2)] and outside.read_bytes() == b"someone's secret"
    os.unlink(outside)  # the last other link gone: an ordinary file again, read
    assert await received(transport, address) == {message_name(1): b"someone's secret", message_name(2): b"real"}
    assert (path / message_name(1)).exists()


async def test_ack_keeps_a_copy_delivered_after_the_receive(transport, inbox) -> None:
    address, path = inbox
    name = message_name(1)
    await transport.send(address, name, b"old")
    [stale] = await receive_all(transport, address)
    await transport.send(address, name, b"delivered again")
    await transport.ack(stale)
    [fresh] = await receive_all(transport, address)
    assert fresh.data == b"delivered again"
    await transport.ack(fresh)
    assert visible(path) == []


async def test_ack_of_an_incoming_from_another_transport_is_refused(transport) -> None:
    with pytest.raises(TypeError):
        await transport.ack(Incoming(message_name(1), b"x", token=("imap", 17)))


# -- host keys -------------------------------------------------------------------------------


async def test_an_unknown_host_key_is_refused(sshd, inbox, tmp_path) -> None:
    address, path = inbox
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("[127.0.0.1]:1 " + sshd.host_public_key + "\n")  # some other server
    async with transport_for(sshd, known_hosts=str(known_hosts)) as transport:
        with pytest.raises(TransportRefused) as caught:
            await transport.send(address, message_name(1), b"x")
    message = one_line_error(caught.value)
    assert "unknown host key" in message and sshd.host_entry in message
    assert "accept_new_host_key=True" in message and "SHA256:" in message
    assert not caught.value.retryable
    assert visible(path) == []
    assert known_hosts.read_text() == "[127.0.0.1]:1 " + sshd.host_public_key + "\n"


async def test_accept_new_host_key_records_the_key_for_next_time(sshd, inbox, tmp_path) -> None:
    address, path = inbox
    known_hosts = tmp_path / "new" / "known_hosts"
    async with transport_for(sshd, known_hosts=str(known_hosts), accept_new_host_key=True) as trusting:
        await trusting.send(address, message_name(1), b"first")
    assert known_hosts.read_text() == f"{sshd.host_entry} {sshd.host_public_key.split()[0]} " \
                                      f"{sshd.host_public_key.split()[1]}\n"
    async with transport_for(sshd, known_hosts=str(known_hosts)) as strict:
        await strict.send(address, message_name(2), b"second")
    assert visible(path) == [message_name(1), message_name(2)]


async def test_a_changed_host_key_is_refused_even_when_accepting_new_keys(sshd, inbox, tmp_path) -> None:
    address, path = inbox
    impostor = make_ssh_key(tmp_path / "impostor_key")
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"{sshd.host_entry} {impostor}\n")
    async with transport_for(sshd, known_hosts=str(known_hosts), accept_new_host_key=True) as transport:
        with pytest.raises(TransportRefused) as caught:
            await transport.send(address, message_name(1), b"x")
    message = one_line_error(caught.value)
    assert "HOST KEY CHANGED" in message and "ssh-keygen -R" in message and sshd.host_entry in message
    assert visible(path) == []
    assert known_hosts.read_text() == f"{sshd.host_entry} {impostor}\n"


async def test_a_recorded_key_of_another_type_is_a_changed_key(sshd, inbox, tmp_path) -> None:
    address, _ = inbox
    rsa_key = paramiko.RSAKey.generate(2048)
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"{sshd.host_entry} ssh-rsa {rsa_key.get_base64()}\n")
    async with transport_for(sshd, known_hosts=str(known_hosts)) as transport:
        with pytest.raises(TransportRefused, match="HOST KEY CHANGED.*ssh-rsa"):
            await transport.send(address, message_name(1), b"x")


# -- authentication ---------------------------------------------------------------------------


async def test_a_key_the_server_does_not_know_is_refused_at_once(sshd, inbox, tmp_path) -> None:
    address, path = inbox
    make_ssh_key(tmp_path / "stranger")
    async with transport_for(sshd, key_file=str(tmp_path / "stranger"), retry_delay=5) as transport:
        started = time.monotonic()
        with pytest.raises(TransportRefused) as caught:
            await transport.send(address, message_name(1), b"x")
    assert time.monotonic() - started < 3
    message = one_line_error(caught.value)
    assert f"refused login as {sshd.user}" in message and "stranger" in message
    assert visible(path) == []


async def test_a_wrong_password_is_refused(sshd, inbox, tmp_path) -> None:
    address, _ = inbox
    password_file = tmp_path / "password"
    password_file.write_text("not the password\n")
    password_file.chmod(0o600)
    async with transport_for(sshd, key_file=None, password_file=str(password_file)) as transport:
        with pytest.raises(TransportRefused) as caught:
            await transport.send(address, message_name(1), b"x")
    message = one_line_error(caught.value)
    assert "refused login" in message and f"password_file {password_file}" in message
    assert "not the password" not in message


async def test_a_password_variable_that_is_not_set_is_refused(sshd, inbox, monkeypatch) -> None:
    monkeypatch.delenv("FIELDSYNC_SFTP_PASSWORD", raising=False)
    async with transport_for(sshd, key_file=None, password_env="FIELDSYNC_SFTP_PASSWORD") as transport:
        with pytest.raises(TransportRefused, match=r"\$FIELDSYNC_SFTP_PASSWORD, which is not set"):
            await transport.send(inbox[0], message_name(1), b"x")


async def test_no_credentials_is_refused(sshd, inbox) -> None:
    async with transport_for(sshd, key_file=None) as transport:
        with pytest.raises(TransportRefused, match="no credentials"):
            await transport.send(inbox[0], message_name(1), b"x")


async def test_an_encrypted_key_needs_its_passphrase(sshd, inbox, tmp_path, monkeypatch) -> None:
    address, path = inbox
    key = ed25519.Ed25519PrivateKey.generate()
    key_file = tmp_path / "locked_key"
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                           serialization.BestAvailableEncryption(b"open sesame")))
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    with open(sshd.base / "authorized_keys", "a") as authorized:
        authorized.write(public.decode() + "\n")
    async with transport_for(sshd, key_file=str(key_file)) as locked:
        with pytest.raises(TransportRefused, match="encrypted.*key_passphrase"):
            await locked.send(address, message_name(1), b"x")
    monkeypatch.setenv("FIELDSYNC_KEY_PASSPHRASE", "open sesame")
    async with transport_for(sshd, key_file=str(key_file), key_passphrase_env="FIELDSYNC_KEY_PASSPHRASE") as opened:
        await opened.send(address, message_name(1), b"x")
    assert visible(path) == [message_name(1)]


# -- connections: reuse, loss, servers going away --------------------------------------------


async def test_one_connection_serves_every_call(sshd, inbox, proxy, tmp_path) -> None:
    _, path = inbox
    address = f"sftp://{sshd.user}@127.0.0.1:{proxy.port}{path}"
    known_hosts = known_hosts_for(sshd, tmp_path, proxy.port)
    async with transport_for(sshd, known_hosts=str(known_hosts)) as transport:
        await asyncio.gather(*(transport.send(address, message_name(last), b"x" * last) for last in range(1, 11)))
        for incoming in await receive_all(transport, address):
            await transport.ack(incoming)
        assert proxy.connections == 1
    await asyncio.sleep(0.2)
    assert proxy.open_connections == 0  # aclose hung up
    assert visible(path) == []


async def test_a_server_that_is_not_running_is_unavailable_after_retries(sshd, caplog) -> None:
    address = f"sftp://{sshd.user}@127.0.0.1:{free_port()}/inbox"
    async with transport_for(sshd, retries=2, retry_delay=0.05) as transport:
        with caplog.at_level(logging.INFO, logger="transports.sftp"):
            with pytest.raises(TransportUnavailable) as caught:
                await transport.send(address, message_name(1), b"x")
    assert caught.value.retryable
    assert "is it running" in one_line_error(caught.value)
    assert sum("trying again" in record.getMessage() for record in caplog.records) == 2


async def test_the_server_stopped_mid_run_and_restarted(own_sshd) -> None:
    address, path = own_sshd.new_inbox()
    names = [message_name(last) for last in range(1, 7)]
    async with transport_for(own_sshd, retries=1, retry_delay=0.05) as transport:
        for name in names[:3]:
            await transport.send(address, name, name.encode())
        first, *_ = await receive_all(transport, address)
        await transport.ack(first)

        own_sshd.stop()
        with pytest.raises(TransportUnavailable) as caught:
            await transport.send(address, names[3], names[3].encode())
        assert caught.value.retryable and "\n" not in str(caught.value)
        with pytest.raises(TransportUnavailable):
            await receive_all(transport, address)

        own_sshd.start()
        # The same transport reconnects; the agent sends what failed again.
        for name in names[3:]:
            await transport.send(address, name, name.encode())
        got = await receive_all(transport, address)
        assert [incoming.name for incoming in got] == names[1:]
        assert all(incoming.data == incoming.name.encode() for incoming in got)
        for incoming in got:
            await transport.ack(incoming)
        assert await receive_all(transport, address) == []
    assert visible(path) == []


async def test_a_server_back_within_the_backoff_is_reached_by_the_same_call(own_sshd) -> None:
    address, path = own_sshd.new_inbox()
    async with transport_for(own_sshd, retries=8, retry_delay=0.1) as transport:
        await transport.send(address, message_name(1), b"before")
        own_sshd.stop()
        restart = asyncio.get_running_loop().call_later(0.4, own_sshd.start)
        try:
            await transport.send(address, message_name(2), b"after")
        finally:
            restart.cancel()
    assert visible(path) == [message_name(1), message_name(2)]
    assert (path / message_name(2)).read_bytes() == b"after"


async def test_a_connection_dropped_mid_upload_is_remade_and_leaves_one_file(sshd, inbox, proxy, tmp_path) -> None:
    _, path = inbox
    address = f"sftp://{sshd.user}@127.0.0.1:{proxy.port}{path}"
    data = random.Random(1).randbytes(3 * 1024 * 1024)
    async with transport_for(sshd, known_hosts=str(known_hosts_for(sshd, tmp_path, proxy.port))) as transport:
        await transport.send(address, message_name(1), b"warm up")
        proxy.cut_after(upload=1024 * 1024)
        await transport.send(address, message_name(2), data)
    assert proxy.cuts == 1 and proxy.connections == 2
    assert visible(path) == [message_name(1), message_name(2)]  # no temp file left behind
    assert (path / message_name(2)).read_bytes() == data


# paramiko's read-ahead thread dies with the connection: its traceback must not reach stderr.
@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
async def test_a_connection_dropped_mid_download_is_remade(sshd, inbox, proxy, tmp_path) -> None:
    _, path = inbox
    address = f"sftp://{sshd.user}@127.0.0.1:{proxy.port}{path}"
    data = random.Random(2).randbytes(3 * 1024 * 1024)
    (path / message_name(1)).write_bytes(data)
    async with transport_for(sshd, known_hosts=str(known_hosts_for(sshd, tmp_path, proxy.port))) as transport:
        proxy.cut_after(download=1024 * 1024)  # well past the handshake, inside the file
        [incoming] = await receive_all(transport, address)
        assert incoming.data == data
        await transport.ack(incoming)
    assert proxy.cuts == 1
    assert visible(path) == []


async def test_a_name_the_caller_does_not_want_is_not_downloaded(transport, inbox, monkeypatch) -> None:
    address, path = inbox
    ours, theirs = message_name(1), message_name(1, recipient="field2")
    (path / ours).write_bytes(b"ours")
    (path / theirs).write_bytes(b"another site's")
    reads = record_reads(monkeypatch, transport, "_read_blocking", lambda client, box, name, links: name)
    assert await receive_wanted(transport, address, ours) == [ours]
    assert reads == [ours]
    assert sorted(os.listdir(path)) == sorted([ours, theirs])


def test_a_read_ahead_thread_lost_with_its_connection_is_a_debug_line(monkeypatch, caplog) -> None:
    reached: list[str] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: reached.append(args.thread.name))
    quiet_read_ahead_threads()
    quiet_read_ahead_threads()  # once in front of the hook, however often it is called
    caplog.set_level(logging.DEBUG, logger="transports.sftp")

    def _prefetch_thread() -> None:  # what paramiko.SFTPFile.prefetch starts
        raise EOFError()

    def other() -> None:
        raise EOFError()

    def _prefetch_thread_bug() -> None:
        raise KeyError("a bug, not a lost connection")

    for target in (_prefetch_thread, other, _prefetch_thread_bug):
        thread = threading.Thread(target=target)
        thread.start()
        thread.join()
    assert [name.rsplit(" ", 1)[-1] for name in reached] == ["(other)", "(_prefetch_thread_bug)"]
    assert [record.getMessage() for record in caplog.records] == [
        "SFTP read-ahead stopped with its connection: EOFError"]
