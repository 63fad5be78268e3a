"""R2D2 against DQN without frame stacking on CartPole with the velocities hidden.

Both run as a user runs them, ``apex-dask-submit`` on its embedded LocalCluster,
for the same wall budget (``--budget-s``, start-up included), stopping early at a
greedy evaluation mean of 475:

* ``r2d2``: ``--preset cartpole_pomdp`` (the LSTM agent, sequences of 10 burn-in +
  20 trained steps);
* ``dqn``: ``--preset cartpole --set env.env_id=<the POMDP id>``: the DQN preset, one
  observation (cart position, pole angle) per decision, no frame stack;
* ``r2d2_worker`` (on request): ``r2d2`` with ``r2d2.initial_priority=worker`` (the env
  workers score new sequences; ``r2d2`` leaves them the shard's max priority).

Each run's greedy evaluations (10 episodes, ``eval.interval_s`` 2 s) are read from
its ``results.jsonl``. The table gives per run the best and the last evaluation,
the env steps and whether (and when) it reached 475; the JSON
(``benchmarks/results/r2d2_pomdp.json``, merged by method and seed) keeps every
evaluation. Runs go one after
the other, methods alternating seed by seed, so machine load meets both alike.

    python benchmarks/r2d2_pomdp.py                            # 3 seeds x 2 methods x 300 s
    python benchmarks/r2d2_pomdp.py --seeds 0 --budget-s 180 --methods r2d2
    python benchmarks/r2d2_pomdp.py --plot-only --plot docs/img/r2d2_pomdp.png
    python benchmarks/r2d2_pomdp.py --seeds 0 --budget-s 180 --methods r2d2 r2d2_worker \
        --out benchmarks/results/r2d2_initial_priority.json
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

POMDP_ID = "apex_dask.algo.envs.pomdp:CartPolePositions-v1"
SOLVED_AT = 475.0
RESULTS = Path(__file__).resolve().parent / "results" / "r2d2_pomdp.json"
METHODS = {
    "r2d2": ["--preset", "cartpole_pomdp"],
    "dqn": ["--preset", "cartpole", "--set", f"env.env_id={POMDP_ID}"],
    # R2D2 with the env worker's own initial priorities (``r2d2`` leaves new sequences
    # the shard's max priority, the default)
    "r2d2_worker": ["--preset", "cartpole_pomdp", "--set", "r2d2.initial_priority=worker"],
}


def run_one(method: str, seed: int, budget_s: float, workdir: Path) -> dict[str, Any]:
    """One apex-dask-submit run; its evaluations from results.jsonl."""
    out = workdir / f"{method}-{seed}"
    cmd = [
        str(Path(sys.executable).parent / "apex-dask-submit"),
        *METHODS[method],
        "--set", f"seed={seed}",
        "--set", "eval.interval_s=2",
        "--set", "eval.animation=false",
        "--set", "checkpoint.interval_s=0",
        "--stop-time", str(budget_s),
        "--stop-eval-return", str(SOLVED_AT),
        "--out", str(out),
        "--quiet",
    ]  # fmt: skip
    t0 = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if done.returncode != 0:
        raise SystemExit(f"{method} seed {seed} failed: {done.stderr.strip()[-500:]}")
    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines() if x]
    evals = [
        {"time_s": r["time_s"], "steps": r["timesteps_total"], "return": r["eval/return_mean"]}
        for r in rows
        if r.get("eval/return_mean") == r.get("eval/return_mean") and "eval/return_mean" in r
    ]
    solved = next((e for e in evals if e["return"] >= SOLVED_AT), None)
    return {
        "method": method,
        "seed": seed,
        "budget_s": budget_s,
        "wall_s": round(wall, 1),
        "steps": rows[-1]["timesteps_total"] if rows else 0,
        "best_eval": max((e["return"] for e in evals), default=float("nan")),
        "last_eval": evals[-1]["return"] if evals else float("nan"),
        "solved": solved is not None,
        "time_to_solve_s": solved["time_s"] if solved else None,
        "evals": evals,
    }


def print_table(records: list[dict[str, Any]]) -> None:
    head = f"{'method':<6} {'seed':>4} {'steps':>8} {'best':>7} {'last':>7} {'475 at (s)':>11}"
    print(head)
    print("-" * len(head))
    for r in records:
        at = f"{r['time_to_solve_s']:.0f}" if r["solved"] else "-"
        print(
            f"{r['method']:<6} {r['seed']:>4} {int(r['steps']):>8,} {r['best_eval']:>7.1f} "
            f"{r['last_eval']:>7.1f} {at:>11}"
        )
    for m in sorted({r["method"] for r in records}):
        mine = [r for r in records if r["method"] == m]
        solved = sum(r["solved"] for r in mine)
        best = sum(r["best_eval"] for r in mine) / len(mine)
        print(f"{m}: {solved}/{len(mine)} reached {SOLVED_AT:g}; mean best eval {best:.1f}")


def plot(records: list[dict[str, Any]], path: Path) -> None:
    """Greedy evaluation return against the run's wall seconds, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    colours = {"r2d2": "tab:blue", "dqn": "tab:orange"}
    for r in records:
        xs = [e["time_s"] for e in r["evals"]]
        ys = [e["return"] for e in r["evals"]]
        label = f"{r['method']} seed {r['seed']}"
        ax.plot(xs, ys, color=colours[r["method"]], alpha=0.5 + 0.15 * r["seed"], label=label)
    ax.axhline(SOLVED_AT, color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel("seconds since training started")
    ax.set_ylabel("greedy eval return (10 episodes)")
    ax.set_title("CartPole, velocities hidden: R2D2 vs DQN without frame stacking")
    ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--budget-s", type=float, default=300.0)
    p.add_argument("--methods", nargs="+", default=["r2d2", "dqn"], choices=list(METHODS))
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--plot", type=Path, default=None, help="draw the evaluations to this PNG")
    p.add_argument("--plot-only", action="store_true", help="redraw from the JSON, run nothing")
    a = p.parse_args(argv)
    if a.plot_only:
        records = json.loads(a.out.read_text())["runs"]
        print_table(records)
        plot(records, a.plot or Path("docs/img/r2d2_pomdp.png"))
        return 0
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in a.seeds:
            for method in a.methods:
                records.append(run_one(method, seed, a.budget_s, Path(tmp)))
                print(f"done: {method} seed {seed}", flush=True)
    new = {(r["method"], r["seed"]) for r in records}
    if a.out.exists():  # runs of other seeds or methods stay
        kept = json.loads(a.out.read_text()).get("runs", [])
        records = [r for r in kept if (r["method"], r["seed"]) not in new] + records
    records.sort(key=lambda r: (r["seed"], r["method"] != "r2d2"))
    print_table(records)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"machine": platform.platform(), "budget_s": a.budget_s, "runs": records}
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {a.out}")
    if a.plot is not None:
        plot(records, a.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
