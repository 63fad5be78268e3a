"""What TLS costs an embedded run against plain TCP, measured in the same run of this script.

Both workloads run ``apex-dask-submit`` on its embedded LocalCluster as a user runs
it, once with the default (TLS with credentials made for the cluster) and once with
``--no-tls`` (plain TCP), the two modes taken in turn, the first mode swapped every
repetition, with the same seed in both modes of a repetition:

* ``cartpole``: ``--preset cartpole --stop-eval-return 475``: the wall time from launching
  the command to the first greedy evaluation (10 episodes) with mean return >= 475
  (interpreter and cluster start included), and the time to its first result;
* ``minatar``: ``--preset minatar --stop-time S`` (Breakout): the learner's updates/s
  and the env steps/s, medians over the results after ``--warmup-s`` seconds.

    python benchmarks/tls_cost.py                          # 3 repetitions of each
    python benchmarks/tls_cost.py --reps 2 --minatar-s 90 --only minatar

Prints a table and writes ``benchmarks/results/tls_cost.json`` (every run, and the
medians by mode).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "tls_cost.json"
SUBMIT = Path(sys.executable).parent / "apex-dask-submit"
SOLVED_AT = 475.0
MODES = ("tls", "tcp")


def submit(mode: str, args: list[str], out: Path) -> tuple[subprocess.Popen, float]:
    cmd = [str(SUBMIT), *args, "--quiet", "--no-tensorboard", "--out", str(out)]
    cmd += ["--no-tls"] if mode == "tcp" else []
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True), time.perf_counter()  # fmt: skip


def follow(proc: subprocess.Popen, t0: float, results: Path) -> list[tuple[float, dict]]:
    """Every result line with the time (s since launch) it was first seen, until exit."""
    seen: list[tuple[float, dict]] = []
    while True:
        done = proc.poll() is not None
        if results.exists():
            for line in results.read_text().splitlines()[len(seen) :]:
                try:
                    seen.append((time.perf_counter() - t0, json.loads(line)))
                except ValueError:
                    break  # a line being written: read it next time
        if done:
            return seen
        time.sleep(0.02)


def cartpole(mode: str, seed: int, budget_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        args = ["--preset", "cartpole", "--stop-eval-return", str(SOLVED_AT), "--stop-time",
                str(budget_s), "--set", f"seed={seed}", "--set", "eval.episodes=10"]  # fmt: skip
        proc, t0 = submit(mode, args, Path(tmp) / "run")
        seen = follow(proc, t0, Path(tmp) / "run" / "results.jsonl")
    solved = [t for t, r in seen if (r.get("eval/return_mean") or 0.0) >= SOLVED_AT]
    return {
        "workload": "cartpole", "mode": mode, "seed": seed, "exit": proc.returncode,
        "time_to_475_s": solved[0] if solved else None,
        "first_result_s": seen[0][0] if seen else None,
        "steps": seen[-1][1].get("timesteps_total") if seen else None,
        "error": proc.stderr.read()[-300:] if proc.returncode else "",
    }  # fmt: skip


def minatar(mode: str, seed: int, run_s: float, warmup_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        args = ["--preset", "minatar", "--stop-time", str(run_s), "--set", f"seed={seed}"]
        proc, t0 = submit(mode, args, Path(tmp) / "run")
        seen = follow(proc, t0, Path(tmp) / "run" / "results.jsonl")
    steady = [r for _, r in seen if r.get("time_s", 0.0) >= warmup_s]

    def median(key: str) -> float | None:
        values = [r[key] for r in steady if isinstance(r.get(key), int | float)]
        return statistics.median(values) if values else None

    return {
        "workload": "minatar", "mode": mode, "seed": seed, "exit": proc.returncode,
        "updates_per_s": median("learner/updates_per_s"),
        "env_steps_per_s": median("env/steps_per_s"),
        "results": len(steady),
        "error": proc.stderr.read()[-300:] if proc.returncode else "",
    }  # fmt: skip


def medians(runs: list[dict[str, Any]], workload: str, key: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mode in MODES:
        values = [r[key] for r in runs if r["workload"] == workload and r["mode"] == mode]
        got = [v for v in values if v is not None]
        out[mode] = {"median": statistics.median(got) if got else None, "runs": values}
    tls, tcp = out["tls"]["median"], out["tcp"]["median"]
    out["tls_over_tcp"] = tls / tcp if tls and tcp else None
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=3, help="repetitions of each mode (default 3)")
    p.add_argument("--only", choices=["cartpole", "minatar"], help="one workload only")
    p.add_argument("--cartpole-budget-s", type=float, default=400.0)
    p.add_argument("--minatar-s", type=float, default=120.0, help="MinAtar run length")
    p.add_argument("--warmup-s", type=float, default=45.0, help="MinAtar results before: skipped")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    runs: list[dict[str, Any]] = []
    for rep in range(args.reps):
        order = MODES if rep % 2 == 0 else MODES[::-1]
        for workload in ("cartpole", "minatar"):
            if args.only not in (None, workload):
                continue
            for mode in order:
                load = os.getloadavg()[0]
                if workload == "cartpole":
                    run = cartpole(mode, rep, args.cartpole_budget_s)
                else:
                    run = minatar(mode, rep, args.minatar_s, args.warmup_s)
                run.update(rep=rep, load_before=round(load, 1))
                runs.append(run)
                print(json.dumps(run), flush=True)
    summary = {
        "cartpole_time_to_475_s": medians(runs, "cartpole", "time_to_475_s"),
        "cartpole_first_result_s": medians(runs, "cartpole", "first_result_s"),
        "minatar_updates_per_s": medians(runs, "minatar", "updates_per_s"),
        "minatar_env_steps_per_s": medians(runs, "minatar", "env_steps_per_s"),
    }
    print(f"\n{'measure':<28} {'TLS (median)':>14} {'plain TCP':>12} {'TLS / TCP':>10}")
    for name, row in summary.items():
        tls, tcp, ratio = row["tls"]["median"], row["tcp"]["median"], row["tls_over_tcp"]
        if tls is None and tcp is None:
            continue
        fmt = lambda v: "-" if v is None else f"{v:,.1f}"  # noqa: E731
        print(
            f"{name:<28} {fmt(tls):>14} {fmt(tcp):>12} {'-' if ratio is None else f'{ratio:.3f}':>10}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "benchmark": "tls_cost",
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "settings": vars(args) | {"out": str(args.out)},
        "summary": summary,
        "runs": runs,
    }
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
