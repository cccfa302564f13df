"""The fault-injection suite with real `agent run --once` processes over the
real folder transport, faults in between, and random SIGKILLs.  The agents
run in real time with `--heartbeat 24h --confirm-timeout 1s`: the heartbeat
never falls due, so the probes of rule 3 repair what the faults left, and
every seed comes to rest within the same 10 clean rounds as in-process."""

import os

import pytest

from agent.chaos import SETTLE_ROUNDS, ChaosParams, run_process_seed

pytestmark = pytest.mark.timeout(900)

RUNS = int(os.environ.get("FIELDSYNC_CHAOS_PROCESS_RUNS", "20"))


@pytest.mark.slow
async def test_multi_process_runs_find_no_divergence_double_apply_or_loss():
    failures = []
    faults = 0
    kills = 0
    rounds = []
    for seed in range(RUNS):
        result = await run_process_seed(ChaosParams.random(1000 + seed, steps=3))
        faults += sum(result.faults.values())
        kills += result.crashes
        rounds.append(result.rounds_to_quiesce)
        if not result.ok:
            failures.append(f"{result.params.command()}: {result.summary()}")
    assert not failures, failures
    assert faults > 0 and kills > 0, (faults, kills)
    assert all(1 <= number <= SETTLE_ROUNDS for number in rounds), rounds
