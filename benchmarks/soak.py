"""A soak: a long run with a fault every few minutes, watched for leaks and slow-downs.

    python benchmarks/soak.py --minutes 30 --fault-every 180      # the full soak
    python benchmarks/soak.py --minutes 5 --fault-every 60 --warmup 60   # a smoke

Starts its own cluster (a `dask scheduler` and ``--workers`` nanny-managed `dask
worker` processes on loopback) and trains the ``cartpole`` preset with
``apex-dask-submit --elastic`` (2 shards spread over the workers, periodic
checkpoints, the laws checked and counted, not strict). Every ``--fault-every``
seconds one fault of the chaos matrix, in turn:

1. kill -9 the process holding a shard (not the learner's),
2. kill -9 the learner's process,
3. kill -9 the learner's and a shard's processes together,
4. kill -9 an env worker's process,
5. SIGKILL the driver (``apex-dask-submit``), then ``--resume`` the run,
6. retire a shard's worker gracefully (a new worker joins in its place).

Every ``--sample-every`` seconds it records, per process (scheduler, nannies,
workers, the driver): resident memory (RSS), open file descriptors and threads;
and from the run's newest result: the learner's queue sizes (inqueue, outbox,
priority updates in flight), ``learner/updates_per_s``,
``health/invariant_violations`` and ``health/task_failures``.

It reports the least-squares slope of each process's RSS (MB/h), fds and threads
(per hour) over its life past its own ``--warmup`` seconds (a worker restarted
by a fault starts a new series: its start-up is not a leak; a process is judged
when that part spans ``--judge-min`` seconds), and updates/s at the end against
the start (medians of the first and last fifth of the samples past the soak's
``--warmup``).
Goals: 0 invariant violations; RSS growth under 20 MB/h for every process;
updates/s at the end at least 0.9x the start. Prints a table and writes JSON
(``--out``, default ``benchmarks/results/soak.json``); exit 1 when a goal is missed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

BIN = Path(sys.executable).parent
OUT = Path(__file__).parent / "results" / "soak.json"
FAULTS = ("shard", "learner", "learner+shard", "env_worker", "driver", "retire")
QUEUES = (
    "flow/batches_in_queue",
    "learner/outbox_size",
    "learner/priority_sends_in_flight",
    "learner/updates_per_s",
    "health/invariant_violations",
    "health/task_failures",
)


def broken(row: dict) -> dict:
    """The laws and tasks that failed so far in a result row, each with its count."""
    heads = ("health/invariant_violations/", "health/task_failures/")
    return {k: v for k, v in row.items() if k.startswith(heads) and v}


class Soak:
    """The cluster, the run, the faults and the samples (see the module docstring)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.tmp = Path(tempfile.mkdtemp(prefix="apex-soak-"))
        self.run_dir = self.tmp / "run"
        self.sched_file = self.tmp / "scheduler.json"
        self.procs: list[subprocess.Popen] = []  # scheduler and nannies
        self.driver: subprocess.Popen | None = None
        self.client: Any = None
        self.samples: list[dict[str, Any]] = []
        self.faults: list[dict[str, Any]] = []
        self.sessions: list[dict[str, float]] = []  # each driver session's last health counts
        self.exits: list[int] = []
        self.names = 0

    # ------------------------------------------------------------ the cluster
    def _spawn(self, args: list[str], log: str) -> subprocess.Popen:
        out = (self.tmp / log).open("a")
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def add_worker(self) -> None:
        self.names += 1
        self.procs.append(
            self._spawn(
                [str(BIN / "dask"), "worker", "--scheduler-file", str(self.sched_file)]
                + ["--nthreads", "1", "--no-dashboard", "--host", "127.0.0.1"]
                + ["--name", f"w{self.names}", "--memory-limit", "3GiB"],
                f"w{self.names}.log",
            )
        )

    def start(self) -> None:
        from distributed import Client

        self.procs.append(
            self._spawn(
                [str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", "0"]
                + ["--dashboard-address", ":0", "--scheduler-file", str(self.sched_file)]
                + ["--preload", "apex_dask.runtime.preload"],
                "scheduler.log",
            )
        )
        deadline = time.monotonic() + 60
        while not self.sched_file.exists():
            if time.monotonic() > deadline:
                raise SystemExit("soak: the scheduler did not start (see its log)")
            time.sleep(0.2)
        for _ in range(self.args.workers):
            self.add_worker()
        self.client = Client(scheduler_file=str(self.sched_file), timeout=60)
        self.client.wait_for_workers(self.args.workers, timeout=120)
        self.submit(resume=False)

    def submit(self, resume: bool) -> None:
        # the soak ends the run itself (Ctrl-C at its end); --stop-time only bounds a run
        # left behind (a resumed run counts its time from the checkpoint's)
        left = 10 * 60 * self.args.minutes + 600
        where = ["--resume", str(self.run_dir)] if resume else ["--out", str(self.run_dir)]
        keys = [] if resume else [
            "--preset", "cartpole", "--elastic",
            "--set", "replay.num_shards=2", "--set", "replay.placement=spread",
            "--set", f"workers.num_workers={self.args.env_workers}",
            "--set", "workers.per_process=1",
            "--set", f"checkpoint.interval_s={self.args.checkpoint_every}",
            "--set", "eval.episodes=3", "--set", f"seed={self.args.seed}",
        ]  # fmt: skip
        cmd = [str(BIN / "apex-dask-submit"), "--scheduler-file", str(self.sched_file), *where]
        cmd += [*keys, "--stop-time", f"{left:.0f}", "--quiet", "--no-tensorboard"]
        self.driver = self._spawn(cmd, "driver.log")

    def close(self) -> None:
        if self.driver is not None and self.driver.poll() is None:
            self.driver.send_signal(signal.SIGINT)
            try:
                self.driver.wait(120)
            except subprocess.TimeoutExpired:
                self.driver.kill()
        if self.client is not None:
            self.client.close()
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()

    # ------------------------------------------------------------------ faults
    def placement(self) -> dict[str, Any]:
        try:
            return json.loads((self.run_dir / "placement.json").read_text())
        except (OSError, ValueError):
            return {}

    def kill(self, *addresses: str) -> None:
        pids = self.client.run(os.getpid, workers=list(addresses))
        for a in addresses:
            os.kill(pids[a], signal.SIGKILL)

    def fault(self, kind: str) -> dict[str, Any]:
        p = self.placement()
        alive = set(self.client.scheduler_info(n_workers=-1)["workers"])
        learner = p.get("learner", {}).get("address")
        shards = [w["address"] for w in p.get("shards", []) if w["address"] != learner]
        shards = [a for a in shards if a in alive]
        envs = [w["address"] for w in p.get("env_workers", []) if w and w["address"] in alive]
        envs = [a for a in envs if a != learner and a not in shards] or envs
        if kind == "driver":
            assert self.driver is not None
            self.driver.send_signal(signal.SIGKILL)
            self.exits.append(self.driver.wait())
            self._session_done()
            time.sleep(3.0)
            self.submit(resume=True)
            return {"fault": kind}
        if kind == "retire":
            if not shards:
                return {"fault": kind, "skipped": "no shard off the learner's worker"}
            self.add_worker()  # its replacement joins first
            self.client.retire_workers(workers=[shards[0]], close_workers=True)
            return {"fault": kind, "address": shards[0]}
        targets = {
            "shard": shards[:1],
            "learner": [learner] if learner in alive else [],
            "learner+shard": ([learner] if learner in alive else []) + shards[:1],
            "env_worker": envs[:1],
        }[kind]
        if not targets:
            return {"fault": kind, "skipped": "nothing of that kind alive"}
        self.kill(*targets)
        return {"fault": kind, "addresses": targets}

    # ----------------------------------------------------------------- samples
    def _session_done(self) -> None:
        rows = self.rows()
        if rows:
            self.sessions.append(
                {**{k: rows[-1].get(k, math.nan) for k in QUEUES}, **broken(rows[-1])}
            )

    def rows(self) -> list[dict[str, Any]]:
        try:
            text = (self.run_dir / "results.jsonl").read_text()
        except OSError:
            return []
        out = []
        for line in text.splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out

    def processes(self) -> dict[str, psutil.Process]:
        """Every process of the soak by ``role:pid`` (scheduler, nanny, worker, driver)."""
        found: dict[str, psutil.Process] = {}
        roots = [(p, "scheduler" if i == 0 else "nanny") for i, p in enumerate(self.procs)]
        if self.driver is not None:
            roots.append((self.driver, "driver"))
        for popen, role in roots:
            if popen.poll() is not None:
                continue
            try:
                proc = psutil.Process(popen.pid)
                found[f"{role}:{proc.pid}"] = proc
                if role == "nanny":
                    for child in proc.children():
                        if "resource_tracker" not in " ".join(child.cmdline()):
                            found[f"worker:{child.pid}"] = child
            except psutil.Error:
                continue
        return found

    def sample(self, t: float) -> None:
        procs: dict[str, dict[str, float]] = {}
        for name, proc in self.processes().items():
            try:
                with proc.oneshot():
                    procs[name] = {
                        "age_s": time.time() - proc.create_time(),
                        "rss_mb": proc.memory_info().rss / 2**20,
                        "fds": float(proc.num_fds()),
                        "threads": float(proc.num_threads()),
                    }
            except psutil.Error:
                continue
        rows = self.rows()
        last = rows[-1] if rows else {}
        self.samples.append(
            {
                "t": t,
                "procs": procs,
                "run": {**{k: last.get(k) for k in QUEUES}, **broken(last)},
                "rows": len(rows),
            }
        )

    # --------------------------------------------------------------------- run
    def run(self) -> None:
        a = self.args
        self.t0 = time.monotonic()
        self.end = self.t0 + a.minutes * 60
        self.start()
        next_fault, next_sample, n = self.t0 + a.fault_every, self.t0, 0
        while time.monotonic() < self.end:
            now = time.monotonic()
            if self.driver is not None and self.driver.poll() is not None:
                self.exits.append(self.driver.returncode)
                self._session_done()
                raise SystemExit(f"soak: the run ended early (exit {self.driver.returncode})")
            if now >= next_sample:
                self.sample(now - self.t0)
                next_sample = now + a.sample_every
            if now >= next_fault:
                kind = FAULTS[n % len(FAULTS)]
                got = self.fault(kind)
                got["t"] = round(time.monotonic() - self.t0, 1)
                self.faults.append(got)
                print(f"soak: {got['t']:7.1f} s  fault {kind} {got}", flush=True)
                n += 1
                next_fault = now + a.fault_every
            time.sleep(0.5)
        self.sample(time.monotonic() - self.t0)
        self._session_done()


def slope_per_hour(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of ``(seconds, value)`` points, per hour."""
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    if var == 0:
        return 0.0
    return sum((t - mt) * (v - mv) for t, v in points) / var * 3600.0


def report(soak: Soak, args: argparse.Namespace) -> dict[str, Any]:
    after = [s for s in soak.samples if s["t"] >= args.warmup]
    series: dict[str, list[tuple[float, dict[str, float]]]] = {}
    for s in soak.samples:  # each process from its own warm-up on (a restarted worker's start-up
        for name, values in s["procs"].items():  # is not a leak)
            if values["age_s"] >= args.warmup:
                series.setdefault(name, []).append((s["t"], values))
    procs = []
    for name, pts in sorted(series.items()):
        lived = pts[-1][0] - pts[0][0]
        row = {"process": name, "samples": len(pts), "span_s": lived}
        for key in ("rss_mb", "fds", "threads"):
            row[f"{key}_start"] = pts[0][1][key]
            row[f"{key}_end"] = pts[-1][1][key]
            row[f"{key}_per_h"] = (
                slope_per_hour([(t, v[key]) for t, v in pts]) if len(pts) > 2 else math.nan
            )
        row["judged"] = lived >= args.judge_min and len(pts) > 2
        procs.append(row)
    rates = [
        s["run"]["learner/updates_per_s"] for s in after if s["run"].get("learner/updates_per_s")
    ]
    fifth = max(1, len(rates) // 5)
    start = statistics.median(rates[:fifth]) if rates else math.nan
    end = statistics.median(rates[-fifth:]) if rates else math.nan
    violations = sum(float(x.get("health/invariant_violations") or 0) for x in soak.sessions)
    failures = sum(float(x.get("health/task_failures") or 0) for x in soak.sessions)
    worst = max((p["rss_mb_per_h"] for p in procs if p["judged"]), default=math.nan)
    queues = {
        k: max((float(s["run"][k]) for s in after if s["run"].get(k) is not None), default=math.nan)
        for k in QUEUES[:3]
    }
    goals = {
        "no_invariant_violations": violations == 0,
        "rss_growth_under_20_mb_per_h": bool(worst < 20.0),
        "updates_per_s_end_at_least_0.9x_start": bool(end >= 0.9 * start),
    }
    return {
        "command": "python benchmarks/soak.py " + " ".join(sys.argv[1:]),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "minutes": args.minutes,
        "warmup_s": args.warmup,
        "faults": soak.faults,
        "driver_exits": soak.exits,
        "sessions": soak.sessions,
        "invariant_violations": violations,
        "task_failures": failures,
        "processes": procs,
        "updates_per_s": {"start": start, "end": end, "ratio": end / start if start else math.nan},
        "max_queues_after_warmup": queues,
        "worst_rss_mb_per_h": worst,
        "goals": goals,
        "samples": soak.samples,
    }


def print_table(out: dict[str, Any]) -> None:
    print(
        f"\nsoak: {out['minutes']:g} min, {len(out['faults'])} faults, warm-up {out['warmup_s']:g} s"
    )
    print(
        f"{'process':<22} {'span s':>7} {'RSS MB':>15} {'MB/h':>8} {'fds':>9} {'fds/h':>7} "
        f"{'threads':>9} {'thr/h':>7}"
    )
    for p in out["processes"]:
        mark = "" if p["judged"] else "  (short-lived: not judged)"
        print(
            f"{p['process']:<22} {p['span_s']:>7.0f} "
            f"{p['rss_mb_start']:>7.0f}->{p['rss_mb_end']:<7.0f} {p['rss_mb_per_h']:>8.1f} "
            f"{p['fds_start']:>4.0f}->{p['fds_end']:<4.0f} {p['fds_per_h']:>7.1f} "
            f"{p['threads_start']:>4.0f}->{p['threads_end']:<4.0f} {p['threads_per_h']:>7.1f}{mark}"
        )
    u = out["updates_per_s"]
    print(f"\nupdates/s: start {u['start']:.1f}, end {u['end']:.1f} (x{u['ratio']:.2f})")
    print(f"largest after warm-up: {out['max_queues_after_warmup']}")
    print(
        f"invariant violations {out['invariant_violations']:.0f}, task failures "
        f"{out['task_failures']:.0f}, worst RSS slope {out['worst_rss_mb_per_h']:.1f} MB/h"
    )
    for goal, met in out["goals"].items():
        print(f"  {'met   ' if met else 'MISSED'} {goal}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30.0, help="length of the soak")
    ap.add_argument("--fault-every", type=float, default=180.0, help="seconds between faults")
    ap.add_argument("--sample-every", type=float, default=5.0, help="seconds between samples")
    ap.add_argument("--warmup", type=float, default=300.0, help="seconds before slopes count")
    ap.add_argument(
        "--judge-min",
        type=float,
        default=600.0,
        help="a process's slopes are judged if it lived this long past its own warm-up",
    )
    ap.add_argument("--workers", type=int, default=3, help="Dask worker processes")
    ap.add_argument("--env-workers", type=int, default=2)
    ap.add_argument("--checkpoint-every", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--keep", action="store_true", help="keep the run's folder and logs")
    args = ap.parse_args()
    soak = Soak(args)
    print(f"soak: {args.minutes:g} min in {soak.tmp} (logs there)", flush=True)
    try:
        soak.run()
    finally:
        soak.close()
    out = report(soak, args)
    print_table(out)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")
    if not args.keep:
        shutil.rmtree(soak.tmp, ignore_errors=True)
    return 0 if all(out["goals"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
