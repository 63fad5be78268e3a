"""Atari on one machine: throughput, replay fill and memory of a whole CLI run.

Runs ``apex-dask-submit --preset atari`` (Pong, Nature CNN, batch 512, replay
frames stored once) on the embedded ``LocalCluster`` for ``--minutes`` of wall
time, scaled down: 2 env workers of 8 envs, a ``--capacity`` replay in 2
shards, no evaluation, a result every 15 s. Every ``--sample-s`` seconds it
reads the resident memory (RSS) of each process of the CLI's tree (the CLI
with its scheduler and nannies, the Dask worker processes) and the newest
``replay/size`` in ``results.jsonl``. It reports ``env/steps_per_s`` and
``learner/updates_per_s`` (mean over the results after the first update);
``replay/size`` over time; total RSS when the replay became full, at the stop
time and at its peak, and its least-squares slope once full (MB/min: a full
replay should hold memory flat); the flow counters of ``final.json``
(``flow/batches_lost`` = 0, ``flow/rollouts_sent`` = stored + lost).

Capacity: the default 40,000 transitions fills early in the 10 minutes,
leaving the rest to watch memory while the shards evict: 2 env workers make
about 585 env steps/s on a quiet 2-core machine (the replay is full after
~2 minutes) and 185 on 2 cores kept busy by other work (~4 minutes).

    python benchmarks/atari_smoke.py --minutes 10
    python benchmarks/atari_smoke.py --capacity 50000 --set learner.min_replay_ratio=4

Prints a table and writes ``benchmarks/results/atari_smoke.json`` (runs
append by minutes, capacity and ``--label``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

RESULTS = Path(__file__).parent / "results" / "atari_smoke.json"
FLOW = [f"flow/rollouts_{k}" for k in ("sent", "stored", "lost")]
FLOW += [f"flow/batches_{k}" for k in ("sampled", "trained", "lost")]


def overrides(args: argparse.Namespace) -> dict[str, object]:
    return {
        "workers.num_workers": args.workers,
        "replay.capacity": args.capacity,
        "replay.learning_starts": args.learning_starts,
        "replay.num_shards": 2,
        "eval.episodes": 0,
        "report.min_iter_time_s": 15.0,
        "report.timesteps_per_iteration": 1,
        "checkpoint.interval_s": 0.0,
    }


def cli_command(run_dir: Path, seconds: float, sets: dict[str, object]) -> list[str]:
    script = Path(sys.executable).parent / "apex-dask-submit"
    cmd = [str(script)] if script.exists() else [sys.executable, "-P", "-m", "apex_dask"]
    cmd += ["--preset", "atari", "--stop-time", f"{seconds:g}", "--out", str(run_dir)]
    return cmd + ["--no-tensorboard"] + [f"--set={k}={v}" for k, v in sets.items()]


def label(p: psutil.Process) -> str:
    """``"pid role"``: the CLI, a Dask worker process (spawned) or a helper process."""
    cmd = p.cmdline()
    code = cmd[cmd.index("-c") + 1] if "-c" in cmd[:-1] else ""
    role = next((r for r in ("resource_tracker", "forkserver") if r in code), None)
    return f"{p.pid} {role or ('worker' if 'spawn_main' in code else p.name())}"


def tree_rss_mb(pid: int) -> dict[str, float]:
    """RSS in MB of ``pid`` and all its descendants, keyed by :func:`label`."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return {}
    rss = {}
    for p in procs:
        with contextlib.suppress(psutil.Error):  # it exited since the listing
            rss[f"{pid} cli" if p.pid == pid else label(p)] = p.memory_info().rss / 2**20
    return rss


def read_results(path: Path) -> list[dict[str, float]]:
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines if line.strip()]


def slope_per_min(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (t seconds, MB) points, in MB per minute."""
    if len(points) < 2:
        return math.nan
    tm, ym = statistics.mean(t for t, _ in points), statistics.mean(y for _, y in points)
    var = sum((t - tm) ** 2 for t, _ in points)
    return 60.0 * sum((t - tm) * (y - ym) for t, y in points) / var if var else math.nan


def run(args: argparse.Namespace, sets: dict[str, object], work: Path) -> dict:
    """Run the CLI; every ``sample_s`` its tree's RSS and the newest result's replay size."""
    run_dir, samples = work / "run", []
    cmd = cli_command(run_dir, 60.0 * args.minutes, sets)
    with open(work / "console.log", "wb") as log:
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        deadline = t0 + 60.0 * args.minutes + args.grace_s
        try:
            while proc.poll() is None:
                rss = tree_rss_mb(proc.pid)
                last = (read_results(run_dir / "results.jsonl") or [{}])[-1]
                sample = {"t": time.monotonic() - t0, "rss_mb": sum(rss.values()), "procs": rss}
                sample["replay_size"] = last.get("replay/size", 0.0)
                samples.append(sample | {"iteration": last.get("iteration", 0.0)})
                if time.monotonic() > deadline:  # SIGINT: the CLI halts, saves what it has
                    proc.send_signal(signal.SIGINT)
                    deadline = math.inf
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=args.sample_s)
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGINT)
            proc.wait()
            raise
    final = run_dir / "final.json"
    rec = {"command": cmd, "returncode": proc.returncode, "wall_s": time.monotonic() - t0}
    rec |= {"run_dir": str(run_dir), "stop_s": 60.0 * args.minutes, "samples": samples}
    rec["results"] = read_results(run_dir / "results.jsonl")
    rec["final"] = json.loads(final.read_text()) if final.exists() else None
    return rec


def running(rec: dict) -> list[dict]:
    """The samples taken before the run's stop time (not its start-up's or halt's end).

    Result times count from the driver's start, sample times from the CLI's: the
    offset is at least the time of the last sample before the first result appeared
    minus that result's ``time_s``."""
    samples, results = rec["samples"], rec["results"]
    first = next((i for i, s in enumerate(samples) if s["iteration"] >= 1), None)
    if not results or not first:
        return samples
    offset = samples[first - 1]["t"] - results[0]["time_s"]
    return [s for s in samples if s["t"] <= rec["stop_s"] + offset]


def summarise(rec: dict, capacity: int) -> dict:
    results, samples = rec["results"], running(rec)
    learning = [
        r for r in results if r.get("learner/updates", 0) > 0 and r["time_s"] <= rec["stop_s"]
    ]
    keys = ("env/steps_per_s", "learner/updates_per_s", "learner/grad_s", "learner/grad_cpu_s")
    means = {
        k.split("/")[-1]: statistics.mean([r[k] for r in learning] or [math.nan]) for k in keys
    }
    full = [s for s in samples if s["replay_size"] >= 0.999 * capacity]
    end = rec["final"] or (results[-1] if results else {})
    flow = {k: end.get(k, math.nan) for k in FLOW}
    return {
        **means,
        "results_learning": len(learning),
        "replay_full_at_s": full[0]["t"] if full else None,
        "rss_full_mb": full[0]["rss_mb"] if full else None,
        "rss_end_mb": samples[-1]["rss_mb"] if samples else math.nan,
        "rss_end_procs_mb": samples[-1]["procs"] if samples else {},
        "rss_max_mb": max((s["rss_mb"] for s in rec["samples"]), default=math.nan),
        "rss_slope_after_full_mb_per_min": slope_per_min([(s["t"], s["rss_mb"]) for s in full]),
        "flow": flow,
        "batches_lost_ok": flow["flow/batches_lost"] == 0,
        "rollouts_balance_ok": flow["flow/rollouts_sent"]
        == flow["flow/rollouts_stored"] + flow["flow/rollouts_lost"],
    }


def print_report(rec: dict, s: dict, capacity: int) -> None:
    print(f"exit status {rec['returncode']}, {rec['wall_s']:.0f} s, run folder {rec['run_dir']}")
    print(f"{'time_s':>7} {'replay/size':>11} {'steps/s':>8} {'updates/s':>9} {'RSS MB':>7}")
    for r in rec["results"]:  # RSS: the first sample that saw this result
        rss = [f"{x['rss_mb']:.0f}" for x in rec["samples"] if x["iteration"] == r["iteration"]]
        print(
            f"{r['time_s']:>7.0f} {r['replay/size']:>11.0f} {r['env/steps_per_s']:>8.1f} "
            f"{r['learner/updates_per_s']:>9.2f} {(rss or ['-'])[0]:>7}"
        )
    print(
        f"after learning started ({s['results_learning']} results): "
        f"{s['steps_per_s']:.1f} env steps/s, {s['updates_per_s']:.2f} updates/s, "
        f"update {1e3 * s['grad_s']:.0f} ms ({1e3 * s['grad_cpu_s']:.0f} ms CPU)"
    )
    at = s["replay_full_at_s"]
    full = f"full ({capacity}) at {at:.0f} s" if at is not None else "never full"
    rss_full = f"{s['rss_full_mb']:.0f}" if s["rss_full_mb"] is not None else "-"
    print(
        f"replay {full}; total RSS MB: at full {rss_full}, end {s['rss_end_mb']:.0f}, "
        f"max {s['rss_max_mb']:.0f}; after full {s['rss_slope_after_full_mb_per_min']:+.1f} MB/min"
    )
    procs = ", ".join(f"{k} {mb:.0f}" for k, mb in s["rss_end_procs_mb"].items())
    print(f"RSS MB per process at the end: {procs}")
    print(", ".join(f"{k.split('/')[-1]} {v:.0f}" for k, v in s["flow"].items()))
    print(
        f"batches lost = 0: {'ok' if s['batches_lost_ok'] else 'FAIL'}; "
        f"rollouts sent = stored + lost: {'ok' if s['rollouts_balance_ok'] else 'FAIL'}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0, help="wall time of the run")
    ap.add_argument("--sample-s", type=float, default=10.0, help="seconds between RSS samples")
    ap.add_argument("--capacity", type=int, default=40_000, help="replay.capacity")
    ap.add_argument("--learning-starts", type=int, default=5_000, help="replay.learning_starts")
    ap.add_argument("--workers", type=int, default=2, help="workers.num_workers")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--grace-s", type=float, default=300.0, help="then SIGINT the CLI")
    ap.add_argument("--work-dir", type=Path, help="for the run and its console log (new or empty)")
    ap.add_argument("--label", default="", help="appended to this run's key in the JSON file")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    sets = {**overrides(args), **dict(kv.split("=", 1) for kv in args.set)}
    capacity = int(sets["replay.capacity"])
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="atari_smoke_"))
    work.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()[0]
    rec = run(args, sets, work)
    summary = summarise(rec, capacity)
    print_report(rec, summary, capacity)
    row = {"minutes": args.minutes, "overrides": sets, "load_avg_before": load_before}
    row["machine"] = f"{platform.machine()}, {os.cpu_count()} cores"
    row |= {k: rec[k] for k in ("returncode", "wall_s")} | {"summary": summary}
    row["replay_size"] = [[r["time_s"], r["replay/size"]] for r in rec["results"]]
    row["rss"] = [[s["t"], s["rss_mb"], s["procs"]] for s in rec["samples"]]
    runs = json.loads(args.out.read_text()) if args.out.exists() else {}
    runs[f"{args.minutes:g}min/capacity={capacity}{args.label}"] = row
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(runs, indent=2) + "\n")
    print(f"wrote {args.out}")
    sys.exit(0 if rec["returncode"] == 0 else 1)


if __name__ == "__main__":
    main()
