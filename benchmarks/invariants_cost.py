"""What checking the run's laws costs the driver, per result and as a share of its CPU.

    python benchmarks/invariants_cost.py [--seconds 60] [--repeats 2000]

Two measurements, in one run of this script:

1. **Per check, at scale.** The driver's work per result for its health
   (``Report._check``: the task failures added up and every law of
   ``runtime/orchestration/invariants.py`` checked) on result dicts of a run
   with K shards and W env workers, timed with ``time.thread_time`` over
   ``--repeats`` checks each.
2. **In a run.** CartPole (the preset, 2 shards, 2 env workers) for ``--seconds``
   on a `dask scheduler` and 2 `dask worker` processes started here (so the
   driver's process is only the driver): the CPU seconds the checks took against
   the CPU seconds of the driver's whole process (``time.process_time``) over
   the same time. The goal: under 1%.

Prints a table and writes ``benchmarks/results/invariants_cost.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OUT = Path(__file__).parent / "results" / "invariants_cost.json"


def synthetic(shards: int, envs: int) -> tuple[dict[str, float], object]:
    """A result dict and an ``Observed`` of a run with ``shards`` shards and ``envs`` env
    workers, every law holding."""
    from apex_dask.runtime.orchestration.invariants import Observed

    r: dict[str, float] = {
        "learner/steps_trained": 1e6,
        "learner/version": 2e4,
        "flow/batches_in_queue": 3.0,
        "learner/outbox_size": 1.0,
        "learner/priority_sends_in_flight": 4.0,
    }
    for k in range(shards):
        r.update(
            {
                f"replay/{k}/size": 5e4,
                f"replay/{k}/rollouts_stored": 1e4,
                f"replay/{k}/batches_sampled": 3e4,
                f"replay/{k}/priority_updates_applied": 3e4,
                f"replay/{k}/priority_updates_stale": 10.0,
            }
        )
    obs = Observed(
        now=0.0,
        learner_key="learner",
        ledger=[(f"shard-{k}", 30_000, 0, 2) for k in range(shards)],
        shard_keys=[f"shard-{k}" for k in range(shards)],
        env_keys={i: f"env-{i}" for i in range(envs)},
        rollouts=[(f"shard-{k}", 9_990, 0) for k in range(shards)],
        rollouts_in_flight=dict.fromkeys(range(envs), 2),
        env_versions=dict.fromkeys(range(envs), 1.9e4),
    )
    return r, obs


def per_check(repeats: int) -> list[dict[str, float]]:
    from apex_dask.config import ApexConfig
    from apex_dask.runtime.actors.supervision import TaskFailures
    from apex_dask.runtime.orchestration.health import TaskHealth
    from apex_dask.runtime.orchestration.invariants import Invariants

    rows = []
    for shards, envs in ((2, 2), (8, 32), (32, 256)):
        cfg = ApexConfig.preset("cartpole").override(
            {"replay.num_shards": shards, "workers.num_workers": envs}
        )
        check, health = Invariants(cfg), TaskHealth(TaskFailures("bench"))
        result, obs = synthetic(shards, envs)
        learner = {"health/task_failures/learner.prefetch": 0.0}
        t0 = time.thread_time()
        obs.evaluated = True  # the clock stands still: every law holds, every one is computed
        for _ in range(repeats):
            out = dict(result)
            health.see("learner", "the learner", learner)
            check.check(out, obs)
            out.update(check.metrics())
            out.update(health.metrics())
        us = (time.thread_time() - t0) / repeats * 1e6
        assert check.metrics()["health/invariant_violations"] == 0
        rows.append({"shards": shards, "env_workers": envs, "us_per_check": us})
    return rows


def in_a_run(seconds: float) -> dict[str, float]:
    """CartPole on a scheduler and 2 workers of their own; the checks' share of the
    driver process's CPU."""
    from distributed import Client

    from apex_dask.config import ApexConfig
    from apex_dask.runtime.orchestration import report
    from apex_dask.runtime.orchestration.driver import ApexDriver

    spent = [0.0, 0]
    original = report.Report._check

    def timed(self, *args, **kwargs):  # the checks run on the client's loop thread
        t0 = time.thread_time()
        try:
            return original(self, *args, **kwargs)
        finally:
            spent[0] += time.thread_time() - t0
            spent[1] += 1

    report.Report._check = timed
    tmp = Path(tempfile.mkdtemp(prefix="apex-invariants-"))
    bin_dir = Path(sys.executable).parent
    sched_file = tmp / "scheduler.json"
    procs = [
        subprocess.Popen(
            [str(bin_dir / "dask"), "scheduler", "--host", "127.0.0.1", "--port", "0"]
            + ["--dashboard-address", ":0", "--scheduler-file", str(sched_file)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    ]
    try:
        while not sched_file.exists():
            time.sleep(0.2)
        for i in range(2):
            procs.append(
                subprocess.Popen(
                    [str(bin_dir / "dask"), "worker", "--scheduler-file", str(sched_file)]
                    + ["--nthreads", "1", "--no-dashboard", "--host", "127.0.0.1"]
                    + ["--name", f"w{i}"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
        client = Client(scheduler_file=str(sched_file), timeout=60)
        client.wait_for_workers(2, timeout=120)
        cfg = ApexConfig.preset("cartpole")
        with ApexDriver(cfg, client) as driver:
            it = driver.iterate()
            next(it)  # started: measure from here
            spent[:] = [0.0, 0]
            c0, t0 = time.process_time(), time.monotonic()
            results, last = 0, {}
            for result in it:
                results, last = results + 1, result
                if time.monotonic() - t0 >= seconds:
                    break
            cpu, wall = time.process_time() - c0, time.monotonic() - t0
        client.close()
    finally:
        report.Report._check = original
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    return {
        "wall_s": wall,
        "results": results,
        "checks": spent[1],
        "check_cpu_s": spent[0],
        "driver_cpu_s": cpu,
        "share_of_driver_cpu": spent[0] / cpu,
        "us_per_check": spent[0] / max(1, spent[1]) * 1e6,
        "violations": last.get("health/invariant_violations"),
        "task_failures": last.get("health/task_failures"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--repeats", type=int, default=2000)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    rows = per_check(args.repeats)
    run = in_a_run(args.seconds)
    print("per check (Report._check: task failures added up + every law)")
    print(f"{'shards':>7} {'env workers':>12} {'us per check':>13}")
    for r in rows:
        print(f"{r['shards']:>7} {r['env_workers']:>12} {r['us_per_check']:>13.1f}")
    print(
        f"\nin a CartPole run of {run['wall_s']:.0f} s ({run['results']} results, "
        f"{run['checks']} checks incl. probes):"
    )
    print(
        f"  checks      {run['check_cpu_s'] * 1e3:8.1f} ms CPU ({run['us_per_check']:.0f} us each)"
    )
    print(f"  driver      {run['driver_cpu_s'] * 1e3:8.1f} ms CPU (its whole process)")
    print(f"  share       {run['share_of_driver_cpu']:8.3%}   (goal: under 1%)")
    print(f"  violations  {run['violations']:.0f}, task failures {run['task_failures']:.0f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "command": "python benchmarks/invariants_cost.py " + " ".join(sys.argv[1:]),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "per_check": rows,
        "in_a_run": run,
    }
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
