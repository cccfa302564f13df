"""The faults wrapper: reproducible, recorded faults over a real folder."""

import json
from collections import Counter
from pathlib import Path

import pytest

from codec.header import Header
from codec.names import Kind, MessageName
from transports import TransportUnavailable, create_transport
from transports.faults import FaultRates, FaultsTransport
from transports.folder import FolderTransport

from . import test_folder


def name(index: int) -> str:
    return str(MessageName("hq", "f1", Kind.DATA, Header(0, index, index + 1)))


async def send_many(transport, inbox: Path, count: int = 200) -> None:
    for index in range(count):
        await transport.send(str(inbox), name(index), b"payload-%d" % index)


def listing(inbox: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(inbox.iterdir()) if not p.name.startswith(".")}


class TestFaultsWithNoFaultsConforms(test_folder.TestFolderConformance):
    """With every rate at zero the wrapper is a plain transport."""

    @pytest.fixture
    def make_transport(self):
        return lambda: FaultsTransport(FolderTransport(), seed=1)


async def test_same_seed_same_faults_and_everything_is_recorded(tmp_path):
    outcomes = []
    for attempt in range(2):
        inbox = tmp_path / f"inbox{attempt}"
        inbox.mkdir()
        record = tmp_path / f"faults{attempt}.jsonl"
        transport = FaultsTransport(FolderTransport(), seed=42, drop=0.1, corrupt=0.1, duplicate=0.1, reorder=0.1,
                                    delay=0.05, record=record)
        async with transport:
            sent = 0
            for index in range(200):
                try:
                    await transport.send(str(inbox), name(index), b"payload-%d" % index)
                    sent += 1
                except TransportUnavailable:
                    pass
            before_flush = listing(inbox)
            await transport.flush()
        lines = [json.loads(line) for line in record.read_text().splitlines()]
        assert len(lines) == len(transport.injected)
        outcomes.append((before_flush, listing(inbox), Counter(line["kind"] for line in lines)))
    assert outcomes[0] == outcomes[1]
    counts = outcomes[0][2]
    assert all(counts[kind] > 5 for kind in ("drop", "corrupt", "duplicate", "reorder")), counts


async def test_each_fault_does_what_it_says(tmp_path):
    inbox = tmp_path / "in"
    inbox.mkdir()
    async with FaultsTransport(FolderTransport(), seed=5, drop=1.0) as dropping:
        await send_many(dropping, inbox, 20)
    assert listing(inbox) == {} and dropping.counts() == {"drop": 20}

    async with FaultsTransport(FolderTransport(), seed=5, corrupt=1.0) as corrupting:
        await send_many(corrupting, inbox, 20)
    files = listing(inbox)
    assert len(files) == 20 and all(data != b"payload-%d" % i for i, data in enumerate(files.values()))
    for path in inbox.iterdir():
        path.unlink()

    async with FaultsTransport(FolderTransport(), seed=5, reorder=1.0, max_hold_ticks=3) as holding:
        await send_many(holding, inbox, 10)
        assert len(listing(inbox)) < 10  # some are still held back
        await holding.flush()
    assert len(listing(inbox)) == 10


async def test_held_files_survive_the_process_in_hold_dir(tmp_path):
    inbox = tmp_path / "in"
    inbox.mkdir()
    hold = tmp_path / "hold"
    async with FaultsTransport(FolderTransport(), seed=9, delay=1.0, max_hold_ticks=50, hold_dir=hold) as first:
        await send_many(first, inbox, 5)
    assert listing(inbox) == {} and len(list(hold.glob("*.held"))) == 5
    async with FaultsTransport(FolderTransport(), seed=9, hold_dir=hold) as second:  # a later process
        await second.flush()
    assert sorted(listing(inbox)) == sorted(name(i) for i in range(5))


async def test_a_partition_refuses_sends_for_a_while(tmp_path):
    inbox = tmp_path / "in"
    inbox.mkdir()
    transport = FaultsTransport(FolderTransport(), seed=2, partition=1.0, partition_ticks=3)
    with pytest.raises(TransportUnavailable, match="partitioned"):
        await transport.send(str(inbox), name(0), b"x")
    with pytest.raises(TransportUnavailable):
        await transport.send(str(inbox), name(1), b"x")  # still partitioned
    assert transport.counts() == {"partition": 2}
    transport.active = False  # the faults stop: the destination is reachable again
    await transport.send(str(inbox), name(2), b"x")
    assert list(listing(inbox)) == [name(2)]


def test_rates_are_checked_and_read_from_a_config(tmp_path):
    from transports.errors import BadTransportOptions
    with pytest.raises(BadTransportOptions):
        FaultRates(drop=1.5)
    with pytest.raises(BadTransportOptions):
        FaultRates(drop=0.6, corrupt=0.6)
    config = tmp_path / "faults.json"
    config.write_text('{"drop": 0.25, "max_hold_ticks": 4}')
    assert FaultRates.from_config(config) == FaultRates(drop=0.25, max_hold_ticks=4)
    config.write_text('{"dorp": 0.25}')
    with pytest.raises(BadTransportOptions, match="keys"):
        FaultRates.from_config(config)
    # A misspelt option or a tick count that is no number is one line naming it.
    with pytest.raises(BadTransportOptions, match=r"^transport 'faults' has no option 'bogus'; its options: seed, .*\bdrop\b"):
        create_transport("faults+folder", wrapper_options={"faults": {"bogus": 7}})
    with pytest.raises(BadTransportOptions, match=r"^transport 'faults': max_hold_ticks='x' is not a whole number$"):
        create_transport("faults+folder", wrapper_options={"faults": {"max_hold_ticks": "x"}})
    with pytest.raises(BadTransportOptions, match=r"^faults: max_hold_ticks must be a whole number >= 1, got 1.5$"):
        create_transport("faults+folder", wrapper_options={"faults": {"max_hold_ticks": 1.5}})
    with pytest.raises(BadTransportOptions, match=r"^transport 'faults': option rates cannot be given as text"):
        create_transport("faults+folder", wrapper_options={"faults": {"rates": "0.5"}})
    with pytest.raises(BadTransportOptions, match=r"^faults: config must be the path of a JSON file of rates, got ''$"):
        create_transport("faults+folder", wrapper_options={"faults": {"config": ""}})
    in_the_way = tmp_path / "a-file"
    in_the_way.write_text("x")
    with pytest.raises(BadTransportOptions, match=r"^faults: hold_dir .*a-file is not a folder"):
        create_transport("faults+folder", wrapper_options={"faults": {"hold_dir": str(in_the_way)}})
    with pytest.raises(BadTransportOptions, match=r"^faults: record .* is a folder"):
        create_transport("faults+folder", wrapper_options={"faults": {"record": str(tmp_path)}})
    texts = create_transport("faults+folder", wrapper_options={"faults": {
        "seed": "7", "active": "no", "drop": "0.25", "max_hold_ticks": "3"}})
    assert (texts.seed, texts.active, texts.rates) == (7, False, FaultRates(drop=0.25, max_hold_ticks=3))
    config.write_text('{"drop": 0.25}')
    transport = create_transport("faults+folder", wrapper_options={"faults": {"config": str(config)}})
    assert transport.rates == FaultRates(drop=0.25)
