"""``apex-dask-sweep``: K trials at once against the same K trials one after the other.

    .venv/bin/python benchmarks/sweep.py                    # both cases, ~10 min on 2 cores
    .venv/bin/python benchmarks/sweep.py --cases cartpole --time-s 20

Each case runs the real command twice on an embedded cluster of the same size
(K x W worker processes): ``--concurrent K`` and ``--concurrent 1`` (the one
slot then has every worker). The K trials are a grid over ``seed`` (K values),
so every trial has the same config but its seed, a time budget each
(``--time-s``), no pruning. Per mode: the command's wall time (cluster start
to exit), the sum of the trials' env steps, and their ratio (env steps per
second of sweep). Cases:

- ``cartpole``: the ``cartpole`` preset, K = 2, W = 2: CPU-bound on 2 cores;
- ``sleepy``: ``ApexSleepy-v0`` (each step sleeps 2 ms, as a slow simulator),
  4 env workers per trial running free (``learner.min_replay_ratio`` off),
  K = 4, W = 3: env-bound, so trials at once overlap their waits.

Prints a table and writes ``benchmarks/results/sweep.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
SLEEPY = "apex_dask.algo.envs.benchmark:ApexSleepy-v0"

CASES = {
    "cartpole": {
        "k": 2,
        "w": 2,
        "set": {"report.timesteps_per_iteration": 500, "eval.episodes": 5},
    },
    "sleepy": {
        "k": 4,
        "w": 3,
        "set": {
            "env.env_id": SLEEPY,
            "env.env_kwargs": {"step_s": 0.002, "max_steps": 200},
            "workers.num_workers": 4,
            "learner.min_replay_ratio": None,
            "eval.episodes": 2,
            "eval.animation": False,
            "report.timesteps_per_iteration": 1000,
        },
    },
}


def sweep_file(case: dict, time_s: float) -> str:
    import yaml

    base_set = {"checkpoint.interval_s": 0, "eval.interval_s": 2.0, **case["set"]}
    doc = {
        "base": {"preset": "cartpole", "set": base_set},
        "space": {"seed": {"grid": list(range(case["k"]))}},
        "budget": {"time_s": time_s},
        "pruner": {"name": "none"},
    }
    return yaml.safe_dump(doc, sort_keys=False)


def run_mode(case: dict, time_s: float, concurrent: int, work: Path) -> dict:
    k, w = case["k"], case["w"]
    space = work / f"space-{concurrent}.yaml"
    space.write_text(sweep_file(case, time_s))
    out = work / f"sweep-{concurrent}"
    per_trial = w if concurrent == k else k * w  # the same cluster size both ways
    cmd = [
        str(BIN / "apex-dask-sweep"),
        str(space),
        "--concurrent",
        str(concurrent),
        "--workers-per-trial",
        str(per_trial),
        "--out",
        str(out),
        "--quiet",
    ]
    t0 = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    wall = time.monotonic() - t0
    if done.returncode != 0:
        raise SystemExit(f"sweep failed ({done.returncode}): {done.stdout[-2000:]}{done.stderr}")
    rows = json.loads((out / "trials.json").read_text())["trials"]
    steps = sum(r["steps"] for r in rows)
    trained = [
        json.loads((out / r["folder"] / "final.json").read_text()).get("time_s", 0.0) for r in rows
    ]
    return {
        "concurrent": concurrent,
        "workers": k * w,
        "trials": len(rows),
        "wall_s": round(wall, 1),
        "trial_wall_s": [round(r["wall_s"], 1) for r in rows],
        # a trial's wall time less its training time: making its actors (and, on cold
        # workers, importing torch there)
        "trial_start_s": [round(r["wall_s"] - t, 1) for r, t in zip(rows, trained, strict=True)],
        "steps_sum": steps,
        "steps_per_wall_s": round(steps / wall, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="cartpole,sleepy")
    ap.add_argument("--time-s", type=float, default=20.0, help="budget of each trial")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "sweep.json"))
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    results = {"time_s": args.time_s, "cpus": os.cpu_count(), "cases": {}}
    with tempfile.TemporaryDirectory(prefix="apex-sweep-bench-") as tmp:
        for name in args.cases.split(","):
            case = CASES[name]
            modes = {}
            for concurrent in (case["k"], 1):
                work = Path(tmp) / name
                work.mkdir(exist_ok=True)
                modes[concurrent] = run_mode(case, args.time_s, concurrent, work)
                print(f"{name} concurrent {concurrent}: {modes[concurrent]}", flush=True)
            at_once, serial = modes[case["k"]], modes[1]
            results["cases"][name] = {
                "k": case["k"],
                "workers_per_trial": case["w"],
                "at_once": at_once,
                "one_after_another": serial,
                "wall_ratio": round(serial["wall_s"] / at_once["wall_s"], 2),
                "steps_ratio": round(at_once["steps_sum"] / serial["steps_sum"], 2),
                "throughput_ratio": round(
                    at_once["steps_per_wall_s"] / serial["steps_per_wall_s"], 2
                ),
            }
    print()
    head = (
        "| case | K | workers | mode | wall s | trial start s | sum of trial env steps "
        "| env steps / wall s |"
    )
    print(head)
    print("| --- | ---: | ---: | --- | ---: | --- | ---: | ---: |")
    for name, r in results["cases"].items():
        for label, m in (
            ("K at once", r["at_once"]),
            ("one after another", r["one_after_another"]),
        ):
            print(
                f"| {name} | {r['k']} | {m['workers']} | {label} | {m['wall_s']:.0f} | "
                f"{', '.join(f'{x:.0f}' for x in m['trial_start_s'])} | "
                f"{m['steps_sum']:,} | {m['steps_per_wall_s']:,.0f} |"
            )
    print()
    for name, r in results["cases"].items():
        print(
            f"{name}: at once / one after another: wall {1 / r['wall_ratio']:.2f}x "
            f"(serial takes {r['wall_ratio']:.2f}x as long), steps {r['steps_ratio']:.2f}x, "
            f"env steps per wall second {r['throughput_ratio']:.2f}x"
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
