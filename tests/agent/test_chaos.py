"""The fault-injection suite in CI: many seeds of random workloads, faults
and crashes, with realistic timers; and proof that the suite notices when a
safety rule is off, or when repairs need more than the settle bound."""

import dataclasses
import json
import os
import random
import sqlite3

import pytest

from agent.chaos import (CONFIRM_TIMEOUTS, DEFAULT_HEARTBEAT, SETTLE_ROUNDS, ChaosParams, ChaosResult, Simulation,
                         run_seed, run_seeds, summarize)
from agent.chaos import Templates as _Templates
from agent.chaos.sites import Sites
from agent.chaos.workload import Workload
from agent.protocol import PairProtocol
from transports.faults import FaultRates

pytestmark = pytest.mark.timeout(900)

SEEDS = int(os.environ.get("FIELDSYNC_CHAOS_SEEDS", "500"))


@pytest.mark.slow
async def test_many_seeds_find_no_divergence_double_apply_or_loss():
    results = await run_seeds(range(SEEDS))
    summary = summarize(results)
    assert summary["seeds"] == SEEDS
    # The suite really injected faults of every kind, and crashes.
    assert all(summary["faults"].get(kind, 0) > 0
               for kind in ("drop", "corrupt", "duplicate", "reorder", "delay", "partition")), summary["faults"]
    assert summary["crashes"] > 0 and summary["resend_requests"] > 0
    if SEEDS >= 100:
        # Sites changed the same customers at once (an UPDATE of a row the
        # other deleted fails by design), and still converged.
        assert summary["apply_errors"] > 0
        # Streams went unconfirmed long enough to be probed.
        assert summary["probes"] > 0
        # Most seeds wrote the follow chain, moving clients (their orders
        # and lines with them) and handing orders to other clients.
        chain = summary["chain"]
        assert chain["seeds"] >= SEEDS // 2 and chain["moves"] > 0 and chain["handovers"] > 0, chain
    assert summary["failing_seeds"] == [], summary["failing_seeds"][:5]
    # Every seed came to rest within the bound, the clock advancing by at
    # most one confirm timeout a round.
    rest = summary["rounds_to_rest"]
    assert rest["stuck"] == 0 and 1 <= rest["max"] <= SETTLE_ROUNDS, rest
    assert sum(rest["histogram"].values()) == SEEDS
    for result in results:
        assert result.settle_seconds <= result.rounds_to_quiesce * result.params.confirm_timeout + 1e-6, result


def test_the_seeds_draw_realistic_timers():
    """The heartbeat is the default 24 h in at least half the seeds, the
    confirm timeout a few minutes to an hour and never above the heartbeat;
    a run given other timers replays with them."""
    drawn = [ChaosParams.random(seed) for seed in range(1000)]
    assert sum(params.heartbeat == DEFAULT_HEARTBEAT for params in drawn) >= 500
    assert {params.heartbeat for params in drawn} == {3600.0, 21600.0, DEFAULT_HEARTBEAT}
    assert {params.confirm_timeout for params in drawn} == set(CONFIRM_TIMEOUTS)
    assert all(300 <= params.confirm_timeout <= min(3600, params.heartbeat) for params in drawn)
    assert all(" --heartbeat" not in params.command() and "--confirm-timeout" not in params.command()
               for params in drawn[:50])
    # A heartbeat given alone lowers the drawn confirm timeout to it, in the
    # replay as well.
    seed = next(params.seed for params in drawn if params.confirm_timeout == 3600.0)
    short = ChaosParams.random(seed, heartbeat=1800.0)
    assert (short.heartbeat, short.confirm_timeout) == (1800.0, 1800.0)
    assert short.command() == f"agent chaos --seed {seed} --heartbeat 30m"
    assert ChaosParams.random(seed, heartbeat=1800.0, confirm_timeout=600.0).command() == \
        f"agent chaos --seed {seed} --heartbeat 30m --confirm-timeout 10m"
    assert ChaosParams.random(seed, confirm_timeout=90.0).command() == \
        f"agent chaos --seed {seed} --confirm-timeout 1m30s"
    with pytest.raises(ValueError, match="not above the heartbeat"):
        ChaosParams.random(seed, heartbeat=600.0, confirm_timeout=1200.0)


def test_a_replay_command_runs_with_the_timers_it_names(capsys):
    from agent.cli import main

    command = ChaosParams.random(4, heartbeat=7200.0, confirm_timeout=120.0).command()
    assert command == "agent chaos --seed 4 --heartbeat 2h --confirm-timeout 2m"
    assert main(command.split()[1:] + ["--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["timers"] == {"heartbeat": {"2h": 1}, "confirm_timeout": {"2m": 1}}
    assert main(["chaos", "--seed", "4", "--heartbeat", "10m", "--confirm-timeout", "1h"]) == 2
    assert "the confirm timeout (1h) is above the heartbeat (10m)" in capsys.readouterr().err


def test_most_seeds_draw_the_follow_chain_and_a_replay_names_a_choice_of_its_own():
    drawn = [ChaosParams.random(seed) for seed in range(1000)]
    assert 500 <= sum(params.chain for params in drawn) < 1000
    chained = next(params for params in drawn if params.chain)
    plain = next(params for params in drawn if not params.chain)
    assert "follow-chain" not in chained.command() + plain.command()
    assert (ChaosParams.random(chained.seed, chain=False).command()
            == f"agent chaos --seed {chained.seed} --no-follow-chain")
    assert ChaosParams.random(plain.seed, chain=True).command() == f"agent chaos --seed {plain.seed} --follow-chain"
    # The chain is drawn after everything else: a seed's other draws are what they were.
    assert dataclasses.replace(ChaosParams.random(plain.seed, chain=True), chain=False) == plain


class _RecordedSites(Sites):
    """A seed's sites that also keep what the workload writes."""

    def __init__(self, root):
        super().__init__(root)
        self.written = []

    def write(self, site, statements):
        statements = list(statements)
        self.written += statements
        super().write(site, statements)


def test_every_product_title_the_workload_writes_is_new(tmp_path):
    """Every site writes the prices and titles of the shared products, and
    a passthrough's fix changes only a title: a title written twice could
    pass at a remote for the one an UPDATE on its way was written on, with
    nothing else in the UPDATE to show otherwise (the value coincidence
    tests/site/test_concurrent.py shows), and the suite would report it as
    a divergence.  So, as for names and keys, no title is written twice."""
    (tmp_path / "seed").mkdir()
    _Templates(tmp_path / "templates").copy(2, tmp_path / "seed")
    places = _RecordedSites(tmp_path / "seed")
    workload = Workload(places, ["hq", "f1", "f2"], random.Random("run:585"))
    for _ in range(40):
        workload.step()
    titles = [values[1] for sql, values in places.written if sql.startswith("UPDATE product")]
    assert len(titles) >= 20
    assert sorted(titles) == sorted(set(titles))


async def test_the_chain_check_finds_a_remote_holding_other_rows_than_routed_to_it(tmp_path):
    """Every remote must hold exactly hq's clients, orders and lines that
    route to it: an order missing there, or one hq does not route to it,
    is a divergence."""
    params = ChaosParams.random(5, rates=FaultRates(), chain=True)
    simulation = Simulation(tmp_path / "seed", params, _Templates(tmp_path / "templates"))
    result = await simulation.run()
    assert result.ok, result.summary()
    conn = sqlite3.connect(tmp_path / "seed" / "f1.db")
    with conn:
        [(order, client, note)] = conn.execute("SELECT id, client_id, note FROM orders ORDER BY id LIMIT 1").fetchall()
        conn.execute("DELETE FROM order_line WHERE order_id = ?", (order,))
        conn.execute("UPDATE orders SET id = -1 WHERE id = ?", (order,))
    conn.close()
    simulation.result = ChaosResult(params)
    simulation.check()
    assert (f"f1: orders differs from hq's rows routed to it (missing [{(order, client, note)!r}], "
            f"extra [{(-1, client, note)!r}])") in simulation.result.divergences, simulation.result.divergences
    assert not simulation.result.ok


async def test_a_seed_not_at_rest_within_the_bound_is_stuck(tmp_path):
    """The settle phase stops after its rounds: a seed that needs one round
    more than it is given fails as stuck, its timers in the report."""
    templates = _Templates(tmp_path / "templates")
    for seed in range(40):
        params = ChaosParams.random(seed)
        result = await Simulation(tmp_path / f"seed-{seed}", params, templates).run()
        assert result.ok, result.summary()
        if result.rounds_to_quiesce >= 3:
            break
    else:
        pytest.fail("no seed among the first 40 needed three rounds")
    rounds = result.rounds_to_quiesce
    short = await Simulation(tmp_path / f"again-{seed}", params, templates).run(settle_rounds=rounds - 1)
    assert short.stuck is not None and not short.ok and short.rounds_to_quiesce == 0
    assert short.stuck.startswith(f"not at rest after {rounds - 1} clean rounds ")
    assert params.timers in short.stuck
    assert short.settle_seconds == pytest.approx((rounds - 1) * params.confirm_timeout)
    failing = summarize([short])["failing_seeds"][0]
    assert (failing["heartbeat"], failing["confirm_timeout"]) == (params.heartbeat, params.confirm_timeout)


async def test_without_probes_a_lost_confirmation_waits_for_the_heartbeat_and_the_suite_says_so(monkeypatch):
    """Rule 3's probes are what repairs a stream whose last confirmation or
    data message was lost with nothing behind it.  With them gone, a 24 h
    heartbeat is the only repair, far beyond ten rounds of one confirm
    timeout: some seed is stuck that passes with them.  (Files are only
    dropped, and more often than the seeds draw, so that such a loss comes
    within a few seeds.)"""
    send_controls = PairProtocol.send_controls

    def without_probes(self, now, *, heartbeat=None, confirm_timeout=None, force=False):
        return send_controls(self, now, heartbeat=heartbeat, confirm_timeout=None, force=force)

    monkeypatch.setattr(PairProtocol, "send_controls", without_probes)
    found = None
    for seed in range(100):
        result = await run_seed(ChaosParams.random(seed, heartbeat=DEFAULT_HEARTBEAT, rates=FaultRates(drop=0.2)))
        assert result.probes == 0
        if result.stuck:
            found = result
            break
    assert found is not None, "the suite should notice that no stream is ever probed"
    assert found.stuck.startswith(f"not at rest after {SETTLE_ROUNDS} clean rounds ")
    assert "heartbeat 24h" in found.stuck
    monkeypatch.setattr(PairProtocol, "send_controls", send_controls)
    again = await run_seed(found.params)
    assert again.ok and again.rounds_to_quiesce <= SETTLE_ROUNDS and again.probes > 0, again.summary()


async def test_without_the_duplicate_rule_the_suite_finds_a_double_apply():
    found = None
    for seed in range(200):
        params = ChaosParams.random(seed, unsafe_without_duplicate_rule=True, crash_rate=0.3)
        result = await run_seed(params)
        if result.double_applies or result.divergences:
            found = result
            break
    assert found is not None, "the suite should notice that duplicates are applied again"
    assert "--unsafe-without-duplicate-rule" in found.params.command()


async def test_without_the_stale_rule_the_suite_finds_a_stale_epoch_apply():
    """I3 is watched at every apply: with the stale-epoch rule off, old-epoch
    copies that arrive late get applied, and the suite says so."""
    found = None
    for seed in range(200):
        result = await run_seed(ChaosParams.random(seed, unsafe_without_stale_rule=True))
        if result.stale_applies:
            found = result
            break
    assert found is not None, "the suite should notice that stale-epoch messages are applied"
    assert not found.ok and found.stale_applies[0].startswith("I3: ")
    assert "--unsafe-without-stale-rule" in found.params.command()


# Late mail of a remote extracted again with its keys kept: copies of files
# the consolidated applied before the extraction (duplicates and reordered
# files the faults wrapper releases late) arrive after it.
LATE_MAIL = dict(reextract_rate=0.3, rates=FaultRates(drop=0.05, duplicate=0.3, reorder=0.1, max_hold_ticks=6))


async def test_without_the_stale_rule_the_suite_finds_a_double_apply():
    """Extraction starts a new epoch both ways, so rule 1 finds every file of
    the copy it replaced stale.  Without the rule, such a file is applied as
    the new copy's, whose log counts offsets afresh: transactions the
    consolidated applied before the extraction are applied a second time."""
    found = None
    for seed in range(200):
        result = await run_seed(ChaosParams.random(seed, unsafe_without_stale_rule=True, **LATE_MAIL))
        if result.double_applies:
            found = result
            break
    assert found is not None, "the suite should notice that stale-epoch messages apply transactions twice"
    assert found.reextractions > 0
    assert any(problem.startswith("hq: ledger entry ") and " applied again: INSERT of an existing key" in problem
               for problem in found.double_applies), found.double_applies
    command = found.params.command()
    assert "--unsafe-without-stale-rule" in command and "--reextract-rate 0.3" in command
    assert "--fault-rate duplicate=0.3" in command


async def test_within_one_copy_the_duplicate_rule_alone_keeps_applies_single():
    """Defence in depth: with the stale rule off but no remote extracted
    again, late old-epoch copies are applied (I3 says so), yet rule 2 skips
    every transaction at or below log_received, so each is applied once and
    in order; with the duplicate rule off as well, the suite finds damage."""
    stale_only = []
    for seed in range(300):  # at least 40 seeds, and on until one applies a stale-epoch message
        stale_only.append(await run_seed(ChaosParams.random(seed, unsafe_without_stale_rule=True,
                                                            reextract_rate=0.0, crash_rate=0.2)))
        if len(stale_only) >= 40 and any(result.stale_applies for result in stale_only):
            break
    summary = summarize(stale_only)
    assert summary["stale_applies"] > 0
    assert (summary["double_applies"], summary["divergences"], summary["losses"], summary["out_of_order"],
            summary["stuck"]) == (0, 0, 0, 0, 0)
    found = None
    for seed in range(200):
        result = await run_seed(ChaosParams.random(seed, unsafe_without_stale_rule=True,
                                                   unsafe_without_duplicate_rule=True, crash_rate=0.3,
                                                   reextract_rate=0.0))
        if result.double_applies or result.divergences:
            found = result
            break
    assert found is not None, "with both rules off the suite should find a double apply"


async def test_the_order_check_finds_entries_applied_against_their_commit_order(tmp_path):
    """I2: the arrival journal each site keeps is read in order; an origin's
    entry arriving after a later one of the same origin is reported."""
    params = ChaosParams.random(5, rates=FaultRates())
    simulation = Simulation(tmp_path / "seed", params, _Templates(tmp_path / "templates"))
    result = await simulation.run()
    assert result.ok, result.summary()
    conn = sqlite3.connect(tmp_path / "seed" / "f1.db")
    with conn:
        arrivals = conn.execute("SELECT entry FROM chaos_arrival WHERE entry LIKE 'hq-%' ORDER BY n").fetchall()
        assert len(arrivals) >= 2
        # The first of hq's entries arrives once more, after the others.
        conn.execute("INSERT INTO chaos_arrival (entry) VALUES (?)", arrivals[0])
    conn.close()
    simulation.result = ChaosResult(params)
    simulation.check()
    assert simulation.result.out_of_order == [
        f"I2: f1 applied {arrivals[0][0]} after {arrivals[-1][0]}, against hq's commit order"]
    assert not simulation.result.ok


async def test_a_failing_seed_prints_a_command_that_replays_it():
    params = ChaosParams.random(17, unsafe_without_stale_rule=True)
    assert params.command().startswith("agent chaos --seed 17") and "--unsafe-without-stale-rule" in params.command()
    again = await run_seed(ChaosParams.random(3))
    same = await run_seed(ChaosParams.random(3))
    assert (again.faults, again.crashes, again.ok) == (same.faults, same.crashes, same.ok)


async def test_the_seeds_folders_go_under_the_tmpdir_the_user_set(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    seen = []
    results = await run_seeds([5], progress=lambda result: seen.append(sorted(p.name for p in tmp_path.iterdir())))
    assert results[0].ok, results[0].summary()
    assert len(seen[0]) == 1 and seen[0][0].startswith("fieldsync-chaos-")
    assert list(tmp_path.iterdir()) == []  # and deleted after the run


async def test_late_mail_of_an_earlier_seed_in_a_shared_inbox_is_not_taken_as_this_seeds(tmp_path):
    """Inboxes that outlive a seed (email, sftp, a shared folder) may get an
    earlier seed's mail after the next seed emptied them: Postfix delivered
    a queued control message late.  With every seed's sites copied from one
    template, that file verified as the new seed's f1 and its resend request
    (rereceive_count above the new f1's) set hq's epoch where no confirmation
    of f1 counted any more: the email suite's seed 19 never came to rest."""
    from codec.message import ControlState, encode_control_message

    from agent.keyfiles import load_site_keys
    from agent.site import SiteDatabase

    inboxes = tmp_path / "shared" / "{site}"
    templates = _Templates(tmp_path / "templates")
    earlier = ChaosParams.random(2, address_template=str(inboxes))
    assert (await Simulation(tmp_path / "earlier", earlier, templates).run()).ok
    with SiteDatabase.open(tmp_path / "earlier" / "f1.db") as f1:
        late = encode_control_message(ControlState(log_received=0, rereceive_count=9, log_sent=0, resend_count=9),
                                      keys=load_site_keys(f1), recipient="hq", incarnation=f1.identity.incarnation)

    class LateMail(Simulation):
        async def _empty_inboxes(self) -> None:
            await super()._empty_inboxes()
            (tmp_path / "shared" / "hq" / late.name).write_bytes(late.data)

    params = ChaosParams.random(3, address_template=str(inboxes))
    result = await LateMail(tmp_path / "later", params, templates).run()
    assert result.ok, result.summary()
    with SiteDatabase.open(tmp_path / "later" / "hq.db") as hq:
        assert hq.remote("f1").resend_count < 9
    assert any(late.name in path.name for path in (tmp_path / "later").rglob("*.fsm")), "not set aside"
