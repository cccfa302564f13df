"""The sftp transport against a real OpenSSH server: conformance, then what only SFTP has."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from transports.sftp import SftpAddress, SftpTransport

from .conformance import TransportConformance
from .servers import REPO_ROOT

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
