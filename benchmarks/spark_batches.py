"""Large outbound batches: the Spark job against the agent's own sending path.

World (``benchmarks.spark_world``): a consolidated with ``--subscribers``
remotes, each subscribed to its own subset of ``orders`` and to a shared
catalog, and a log of about ``--operations`` capture rows.  The world is
built once, at the largest size; a backlog of k operations is the log range
``(0, end]``, ``end`` the first commit offset at or after k, sent to every
subscriber (one send of ``(0, end]`` each): only the range matters to both
paths.

* agent: the agent's own path (``agent.pack_workers.pack_due_sends``, what
  ``Agent.send_phase`` runs on the local engine) on ``--agent-workers``
  packing workers (default: the master's cores, so both sides get the same
  cores), each a share of the subscribers: one pass over the log for its
  subscribers, each subscriber's transactions packed as they come, each
  file written as the job's driver writes its files (temporary name,
  rename).  ``agent_one_core``: the same in the agent's one process
  (``agent.outbound.pack_sends``: ``--pack-workers 1``).
* agent_workers_startup_s: what the first batch on workers costs beyond a
  later one (the workers' server starting: agent.pack_workers), measured
  on the smallest backlog.
* spark: ``agent.spark.export.export_batch`` then
  ``contrib.spark.job.run_job`` on a SparkSession started beforehand
  (``--master``, default ``local[2]``).
* spark_startup_s: what one ``spark-submit`` of the job (what the agent runs
  for each batch) costs beyond the same job in a started session: JVM,
  SparkContext, Python workers, stop.  Measured on the smallest backlog.

* efficiency: what a core of Spark does against the agent's one core, at
  the largest size: ``agent_one_core_us_per_op / spark_core_us_per_op``, the Spark
  figure counting the export (the agent's one core) and the job (wall time
  x the master's cores): ``(export_s + job_s x cores) / operations``.
* local_scaling: the job's time on ``local[1]`` over its time on the master
  (``local[2]`` by default) at the largest size, both in started sessions,
  the master's measured again right after ``local[1]`` (the best of both
  measurements): the machine's load (``load_average``, at the end) moves
  both alike.

``ratio`` is spark_ops_per_s / agent_ops_per_s at the largest size, startup
excluded; ``ratio_with_startup`` includes it.  The crossover is the smallest
backlog at which startup + export + job takes less than the agent's path.
Operations count the log range each subscriber is sent; the agent's
``--spark-threshold`` counts the sum over the sends (``crossover_backlog``).

Both paths must make the same files: same count and bytes at every size,
and the same SHA-256 for every file at the largest (on both masters); the
run fails if not.
Run: ``python -m benchmarks.spark_batches --json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from agent.admin import site_keys
from agent.keyfiles import key_path
from agent.outbound import BatchSend
from agent.pack_workers import pack_due_sends
from agent.site import SiteDatabase
from agent.spark.export import export_batch
from benchmarks.common import timed
from benchmarks.spark_world import build_world, subscriber_names
from codec.keys import SiteKeys
from codec.message import EncodedMessage
from contrib.spark.job import _write_atomic, run_job

ROOT = Path(__file__).resolve().parents[1]
MAX_SIZE = 50_000
TARGET_RATIO = 1.3
TARGET_FLATNESS = 1.2
TARGET_EFFICIENCY = 0.5
TARGET_SCALING = 1.5


@dataclass(frozen=True, slots=True)
class Point:
    """Both paths timed on one backlog (log range ``(0, operations]``)."""

    operations: int
    agent_s: float
    agent_one_s: float  # in the agent's one process
    export_s: float
    job_s: float
    files: int
    bytes: int

    @property
    def spark_s(self) -> float:
        return self.export_s + self.job_s


def commit_ends(db: SiteDatabase, sizes: list[int]) -> list[int]:
    """For each size, the first commit offset at or after it (the log end
    when none is): sends must end on a commit boundary."""
    ends = set()
    for size in sizes:
        row = db.connection.execute("SELECT min(commit_offset) FROM fieldsync_log WHERE commit_offset >= ?",
                                    (size,)).fetchone()
        ends.add(row[0] if row[0] is not None else db.log_end())
    return sorted(ends)


def send_with_agent(db: SiteDatabase, keys: SiteKeys, names: list[str], end: int, folder: Path,
                    workers: int = 1) -> None:
    """The agent's path on ``workers`` packing workers (1: in this process)."""
    sends = [BatchSend(name, 0, end, 0) for name in names]
    for name in names:
        (folder / name).mkdir(parents=True)

    def put(index: int, message: EncodedMessage) -> None:
        # The job's own write, so writing files costs the same on both sides.
        _write_atomic(folder / names[index] / message.name, message.data)

    for send, outcome in zip(sends, pack_due_sends(db, keys, sends, put, max_size=MAX_SIZE, workers=workers,
                                                   workers_from=0)):
        if outcome.error is not None:
            raise SystemExit(f"the agent could not pack its send to {send.subscriber}: {outcome.error}")


def file_digests(folder: Path) -> dict[str, tuple[int, str]]:
    """``subscriber/file name`` -> (size, SHA-256) of every file below ``folder``."""
    return {f"{path.parent.name}/{path.name}": (path.stat().st_size, hashlib.sha256(path.read_bytes()).hexdigest())
            for path in sorted(folder.glob("*/*"))}


def count_files(folder: Path) -> tuple[int, int]:
    sizes = [path.stat().st_size for path in folder.glob("*/*")]
    return len(sizes), sum(sizes)


def measure_point(db: SiteDatabase, keys: SiteKeys, names: list[str], end: int, spark: Any, folder: Path,
                  rounds: int, workers: int) -> Point:
    """Time both paths on ``(0, end]``, the best of ``rounds`` each (which
    goes first alternates), the agent's on ``workers`` and in one process;
    the last round's outputs stay in ``folder`` (agent/, agent-1/, export/,
    spark/) for the caller to check and delete."""
    sends = [BatchSend(name, 0, end, 0) for name in names]

    def agent() -> float:
        return timed(lambda: send_with_agent(db, keys, names, end, folder / "agent", workers))[0]

    def agent_one() -> float:
        return timed(lambda: send_with_agent(db, keys, names, end, folder / "agent-1"))[0]

    def spark_path() -> tuple[float, float, dict]:
        export_s, _ = timed(lambda: export_batch(db, sends, folder / "export", max_size=MAX_SIZE))
        job_s, summary = timed(lambda: run_job(spark, folder / "export", folder / "spark", keys=keys))
        return export_s, job_s, summary

    agent_best, one_best, spark_best = float("inf"), float("inf"), (float("inf"), 0.0, 0.0)
    for round_number in range(rounds):
        shutil.rmtree(folder, ignore_errors=True)
        if round_number % 2 == 0:
            agent_s, one_s = agent(), agent_one()
            export_s, job_s, summary = spark_path()
        else:
            export_s, job_s, summary = spark_path()
            one_s, agent_s = agent_one(), agent()
        files, size = count_files(folder / "agent")
        if (files, size) != (summary["files"], summary["bytes"]) or \
                (files, size) != count_files(folder / "spark" / "files") or \
                (files, size) != count_files(folder / "agent-1"):
            raise SystemExit(f"backlog {end}: the agent made {files} files of {size} bytes, the Spark job "
                             f"{summary['files']} of {summary['bytes']}: the paths did different work")
        agent_best, one_best = min(agent_best, agent_s), min(one_best, one_s)
        spark_best = min(spark_best, (export_s + job_s, export_s, job_s))
    return Point(end, agent_best, one_best, spark_best[1], spark_best[2], files, size)


def verify_same_files(agent_folder: Path, spark_files: Path) -> None:
    agent, spark = file_digests(agent_folder), file_digests(spark_files)
    if agent != spark:
        differing = sorted(set(agent) ^ set(spark) | {name for name in agent if spark.get(name) != agent[name]})
        raise SystemExit(f"the agent and the Spark job made different files ({len(differing)} differ, first: "
                         f"{', '.join(differing[:3])}): the benchmark would compare different work")


def measure_single(db: SiteDatabase, keys: SiteKeys, names: list[str], end: int, spark: Any, folder: Path,
                   rounds: int, agent_digests: dict[str, tuple[int, str]], warm_end: int) -> float:
    """The job alone on ``(0, end]`` in ``spark`` (best of ``rounds``, after
    a warm-up job on ``(0, warm_end]``), its files checked against the
    agent's."""
    shutil.rmtree(folder, ignore_errors=True)
    export_batch(db, [BatchSend(name, 0, warm_end, 0) for name in names], folder / "warm-up-export",
                 max_size=MAX_SIZE)
    run_job(spark, folder / "warm-up-export", folder / "warm-up", keys=keys)
    sends = [BatchSend(name, 0, end, 0) for name in names]
    export_batch(db, sends, folder / "export", max_size=MAX_SIZE)
    best = float("inf")
    for _ in range(rounds):
        shutil.rmtree(folder / "spark", ignore_errors=True)
        best = min(best, timed(lambda: run_job(spark, folder / "export", folder / "spark", keys=keys))[0])
    if file_digests(folder / "spark" / "files") != agent_digests:
        raise SystemExit(f"the job on {spark.sparkContext.master} made other files than the agent")
    shutil.rmtree(folder)
    return best


def master_cores(master: str) -> int:
    """The cores a local master runs tasks on (``local``: 1, ``local[N]``,
    ``local[*]``: this machine's)."""
    if master == "local":
        return 1
    inside = master.partition("[")[2].partition("]")[0].partition(",")[0]
    if master.startswith("local[") and inside.isdigit():
        return int(inside)
    return os.cpu_count() or 1


def spark_submit(master: str, export: Path, output: Path, keys: Path) -> float:
    """Wall time of the job through ``spark-submit``, as the agent runs it."""
    launcher = Path(sys.executable).with_name("spark-submit")
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable,
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    command = [str(launcher if launcher.exists() else "spark-submit"), "--master", master,
               "--conf", f"spark.pyspark.python={sys.executable}", "--conf", "spark.ui.enabled=false",
               str(ROOT / "contrib" / "spark" / "job.py"), "--keys", str(keys), str(export), str(output)]
    seconds, completed = timed(lambda: subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True))
    if completed.returncode != 0:
        raise SystemExit(f"spark-submit of the job failed ({completed.returncode}): {completed.stderr[-2000:]}")
    return seconds


def start_spark(master: str) -> Any:
    from pyspark.sql import SparkSession

    # A session made from Python starts its workers with PYSPARK_PYTHON.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (SparkSession.builder.master(master).appName("fieldsync-benchmark")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.pyspark.python", sys.executable)
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    return session


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares ``seconds = fixed + per_op * operations``."""
    count = len(points)
    mean_x = sum(x for x, _ in points) / count
    mean_y = sum(y for _, y in points) / count
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    per_op = sum((x - mean_x) * (y - mean_y) for x, y in points) / spread if spread else mean_y / mean_x
    return mean_y - per_op * mean_x, per_op


def crossover(points: list[Point], startup: float) -> tuple[int | None, str]:
    """Smallest backlog from which startup + export + job beats the agent:
    interpolated between the measured backlogs where that starts, else on
    the fitted lines when it starts outside the measured range."""
    gains = [point.agent_s - (startup + point.spark_s) for point in points]
    first = next((index for index in range(len(points)) if all(gain > 0 for gain in gains[index:])), None)
    if first is not None and first > 0:
        low, high = points[first - 1], points[first]
        share = -gains[first - 1] / (gains[first] - gains[first - 1])
        at = low.operations + (high.operations - low.operations) * share
        return round(at), f"linear interpolation between the measured backlogs {low.operations} and {high.operations}"
    agent_fixed, agent_per_op = fit([(point.operations, point.agent_s) for point in points])
    spark_fixed, spark_per_op = fit([(point.operations, point.spark_s) for point in points])
    where = "below the smallest" if first == 0 else "above the largest"
    method = f"fitted lines (least squares over the {len(points)} measured backlogs), {where} measured backlog"
    if agent_per_op <= spark_per_op:
        return None, f"{method}: Spark never wins (its cost per operation is not lower)"
    return max(0, round((startup + spark_fixed - agent_fixed) / (agent_per_op - spark_per_op))), method


def run(args: argparse.Namespace, progress: Callable[[str], None]) -> dict:
    sizes = sorted(set(args.sizes))
    small = sorted(set(args.crossover_sizes))
    keep = Path(args.keep) if args.keep else None
    work = keep if keep is not None else Path(tempfile.mkdtemp(prefix="fieldsync-spark-batches-"))
    spark = None
    try:
        world_build_s, db = open_world(work, args, progress)
        keys = site_keys(db)
        names = subscriber_names(args.subscribers)
        flat_ends = commit_ends(db, sizes)
        ends = sorted(set(flat_ends) | set(commit_ends(db, small)))
        workers = args.agent_workers or master_cores(args.master)
        progress(f"the agent on {workers} packing workers: the first batch, then again")
        startup_folder = work / "runs" / "workers-startup"
        cold_s = timed(lambda: send_with_agent(db, keys, names, ends[0], startup_folder / "cold", workers))[0]
        warm_s = timed(lambda: send_with_agent(db, keys, names, ends[0], startup_folder / "warm", workers))[0]
        shutil.rmtree(startup_folder)
        progress(f"starting Spark ({args.master})")
        spark_session_s, spark = timed(lambda: start_spark(args.master))
        # The first job of a session starts its Python workers: part of the
        # startup measured below, not of the figures.
        warm = work / "runs" / "warm-up"
        export_batch(db, [BatchSend(name, 0, ends[0], 0) for name in names], warm / "export",
                     max_size=MAX_SIZE)
        run_job(spark, warm / "export", warm / "spark", keys=keys)
        points: list[Point] = []
        agent_digests: dict[str, tuple[int, str]] = {}
        for end in ends:
            progress(f"backlog {end:,}: agent, then export + job")
            folder = work / "runs" / str(end)
            point = measure_point(db, keys, names, end, spark, folder, args.rounds, workers)
            points.append(point)
            progress(f"  agent {point.agent_s:.1f} s ({point.agent_one_s:.1f} s in one process), "
                     f"spark {point.export_s:.1f} + {point.job_s:.1f} s, "
                     f"{point.files} files")
            if end == ends[-1]:
                verify_same_files(folder / "agent", folder / "spark" / "files")
                verify_same_files(folder / "agent-1", folder / "spark" / "files")
                agent_digests = file_digests(folder / "agent")
            if end == ends[0]:
                continue  # spark-submit runs on its export below
            if keep is None or end != ends[-1]:
                shutil.rmtree(folder)
        spark.stop()
        spark = None
        progress(f"backlog {ends[-1]:,}: the job on local[1]")
        spark = start_spark("local[1]")
        single_s = measure_single(db, keys, names, ends[-1], spark, work / "runs" / "local-1", args.rounds,
                                  agent_digests, ends[0])
        spark.stop()
        # The master again, right after: the two sides of local_scaling
        # a few minutes apart at most, on a machine whose load may change.
        progress(f"backlog {ends[-1]:,}: the job on {args.master} again")
        spark = start_spark(args.master)
        again_s = measure_single(db, keys, names, ends[-1], spark, work / "runs" / "again", args.rounds,
                                 agent_digests, ends[0])
        spark.stop()
        spark = None
        progress("spark-submit of the smallest backlog's job")
        smallest = work / "runs" / str(ends[0])
        submit_s = spark_submit(args.master, smallest / "export", smallest / "spark-submit", key_path(db.path))
        if count_files(smallest / "spark-submit" / "files") != (points[0].files, points[0].bytes):
            raise SystemExit("spark-submit made other files than the same job in a started session")
        shutil.rmtree(smallest)
        shutil.rmtree(warm)
        db.close()
        return figures(args, points, flat_ends, world_build_s, spark_session_s, submit_s - points[0].job_s,
                       single_s, min(again_s, points[-1].job_s), workers, cold_s - warm_s)
    finally:
        if spark is not None:
            spark.stop()
        if keep is None:
            shutil.rmtree(work, ignore_errors=True)


def open_world(work: Path, args: argparse.Namespace, progress: Callable[[str], None]
               ) -> tuple[float | None, SiteDatabase]:
    """Build the world in ``work``; a world kept by ``--keep`` with the same
    parameters is opened again (world_build_s is then None)."""
    wanted = {"operations": args.operations, "subscribers": args.subscribers, "seed": args.seed}
    recorded = work / "world.json"
    if recorded.exists() and json.loads(recorded.read_text(encoding="utf-8")) == wanted:
        progress(f"reusing the world in {work}")
        shutil.rmtree(work / "runs", ignore_errors=True)
        return None, SiteDatabase.open(work / "hq.db")
    work.mkdir(parents=True, exist_ok=True)
    if any(work.iterdir()):
        raise SystemExit(f"--keep {work}: the folder holds something other than a world built with "
                         f"{wanted}; give an empty or new folder")
    progress(f"building a world of {args.operations:,} operations for {args.subscribers} subscribers")
    seconds, db = timed(lambda: build_world(work, args.operations, args.subscribers, seed=args.seed))
    recorded.write_text(json.dumps(wanted) + "\n", encoding="utf-8")
    progress(f"  {seconds:.0f} s, log end {db.log_end():,}")
    return seconds, db


def figures(args: argparse.Namespace, points: list[Point], flat_ends: list[int], world_build_s: float | None,
            spark_session_s: float, startup: float, single_s: float, master_job_s: float, workers: int,
            workers_startup_s: float) -> dict:
    by_end = {point.operations: point for point in points}
    flat = [by_end[end] for end in flat_ends]
    largest = flat[-1]
    spark_us = [point.spark_s / point.operations * 1e6 for point in flat]
    agent_us = [point.agent_s / point.operations * 1e6 for point in flat]
    at, method = crossover(points, startup)
    cores = master_cores(args.master)
    agent_us_per_op = largest.agent_s / largest.operations * 1e6
    one_core_us_per_op = largest.agent_one_s / largest.operations * 1e6
    spark_core_us_per_op = (largest.export_s + largest.job_s * cores) / largest.operations * 1e6
    return {
        "benchmark": "spark_batches",
        "master": args.master,
        "rounds": args.rounds,
        "cpus": os.cpu_count(),
        "subscribers": args.subscribers,
        "world_operations": args.operations,
        "world_build_s": None if world_build_s is None else round(world_build_s, 1),
        "operations": largest.operations,
        "spark_ops_per_s": round(largest.operations / largest.spark_s),
        "agent_ops_per_s": round(largest.operations / largest.agent_s),
        "ratio": round(largest.agent_s / largest.spark_s, 3),
        "ratio_with_startup": round(largest.agent_s / (largest.spark_s + startup), 3),
        "spark_startup_s": round(startup, 2),
        "spark_session_s": round(spark_session_s, 2),
        "cores": cores,
        "agent_workers": workers,
        "agent_workers_startup_s": round(workers_startup_s, 3),
        "agent_us_per_op": round(agent_us_per_op, 3),
        "agent_one_core_us_per_op": round(one_core_us_per_op, 3),
        "agent_workers_speedup": round(largest.agent_one_s / largest.agent_s, 3),
        "spark_core_us_per_op": round(spark_core_us_per_op, 3),
        "efficiency": round(one_core_us_per_op / spark_core_us_per_op, 3),
        "export_us_per_op": round(largest.export_s / largest.operations * 1e6, 3),
        "job_us_per_op": round(largest.job_s / largest.operations * 1e6, 3),
        "local_1_job_s": round(single_s, 3),
        "master_job_s": round(master_job_s, 3),
        "local_scaling": round(single_s / master_job_s, 3),
        "load_average": [round(value, 2) for value in os.getloadavg()],
        "sizes": flat_ends,
        "efficiency_by_size": [round(point.agent_one_s / (point.export_s + point.job_s * cores), 3)
                               for point in flat],
        "spark_us_per_op_by_size": [round(value, 3) for value in spark_us],
        "agent_us_per_op_by_size": [round(value, 3) for value in agent_us],
        "spark_flatness": round(max(spark_us) / min(spark_us), 3),
        "agent_flatness": round(max(agent_us) / min(agent_us), 3),
        "crossover_operations": at,
        "crossover_backlog": None if at is None else at * args.subscribers,
        "crossover_method": method,
        "points": [{"operations": point.operations, "agent_s": round(point.agent_s, 3),
                    "agent_one_core_s": round(point.agent_one_s, 3),
                    "spark_export_s": round(point.export_s, 3), "spark_job_s": round(point.job_s, 3),
                    "files": point.files, "bytes": point.bytes} for point in points],
        "files": largest.files,
        "bytes": largest.bytes,
        "verified": "same file names, sizes and SHA-256 from the agent (on its workers and in one process) and "
                    "the job (on the master and on local[1]) at the largest backlog",
        "targets": {"ratio": TARGET_RATIO, "spark_flatness": TARGET_FLATNESS, "efficiency": TARGET_EFFICIENCY,
                    "local_scaling": TARGET_SCALING},
    }


def sizes_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated operation counts, got {text!r}") from None
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"expected positive operation counts, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.spark_batches", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--operations", type=int, default=2_000_000, help="capture rows in the world's log")
    parser.add_argument("--subscribers", type=int, default=50)
    parser.add_argument("--sizes", type=sizes_list, default=[500_000, 1_000_000, 2_000_000],
                        help="backlogs for the per-operation figures; the largest gives the ratio")
    parser.add_argument("--crossover-sizes", type=sizes_list, default=[20_000, 50_000, 100_000, 200_000],
                        help="small backlogs, measured too, to place the crossover")
    parser.add_argument("--master", default="local[2]", help="Spark master of the job")
    parser.add_argument("--agent-workers", type=int, default=0, metavar="N",
                        help="the agent's packing workers (default: the master's cores; 1: in one process)")
    parser.add_argument("--rounds", type=int, default=2,
                        help="rounds per backlog, order alternating; the best of each path is kept")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", metavar="DIR", help="build the world (and keep the largest outputs) in DIR; "
                        "a world kept there with the same parameters is used again")
    args = parser.parse_args(argv)
    if max(args.sizes + args.crossover_sizes) > args.operations:
        parser.error(f"sizes must not exceed --operations ({args.operations})")
    if args.agent_workers < 0:
        parser.error("--agent-workers must be at least 1")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    progress = (lambda text: None) if args.json else (lambda text: print(text, file=sys.stderr, flush=True))
    result = run(args, progress)
    if args.json:
        print(json.dumps(result))
        return 0
    built = "reused" if result["world_build_s"] is None else f"built in {result['world_build_s']} s"
    print(f"{result['subscribers']} subscribers, Spark {result['master']} on {result['cpus']} CPUs, "
          f"world of {result['world_operations']:,} operations {built}, best of {result['rounds']} rounds")
    print(f"  at {result['operations']:,} operations: Spark {result['spark_ops_per_s']:,} ops/s, "
          f"agent {result['agent_ops_per_s']:,} ops/s")
    print(f"  ratio              {result['ratio']:>8}   (target >= {TARGET_RATIO}); "
          f"with startup {result['ratio_with_startup']}")
    print(f"  spark startup      {result['spark_startup_s']:>8} s (spark-submit; session alone "
          f"{result['spark_session_s']} s)")
    print(f"  agent              {result['agent_us_per_op']:>8} us/op on {result['agent_workers']} packing workers "
          f"({result['agent_one_core_us_per_op']} in one process; the workers' start "
          f"{result['agent_workers_startup_s']} s)")
    print(f"  efficiency         {result['efficiency']:>8}   (target >= {TARGET_EFFICIENCY}): agent "
          f"{result['agent_one_core_us_per_op']} us/op on one core, Spark {result['spark_core_us_per_op']} "
          f"core-us/op on {result['cores']} cores")
    print(f"  local_scaling      {result['local_scaling']:>8}   (target >= {TARGET_SCALING}): job on local[1] "
          f"{result['local_1_job_s']} s")
    print(f"  us per operation   spark {result['spark_us_per_op_by_size']}, agent "
          f"{result['agent_us_per_op_by_size']} at {result['sizes']}")
    print(f"  spark_flatness     {result['spark_flatness']:>8}   (target <= {TARGET_FLATNESS})")
    print(f"  crossover          {result['crossover_operations']} operations "
          f"(backlog {result['crossover_backlog']}): {result['crossover_method']}")
    for point in result["points"]:
        print(f"    {point['operations']:>10,}: agent {point['agent_s']:8.2f} s, "
              f"export {point['spark_export_s']:7.2f} s, job {point['spark_job_s']:7.2f} s, "
              f"{point['files']} files, {point['bytes']:,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
