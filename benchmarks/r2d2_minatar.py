"""R2D2 against the DQN preset on MinAtar Breakout in N minutes of wall time.

Both run as a user runs them, ``apex-dask-submit`` on its embedded LocalCluster, with
the clock started at launch (interpreter, cluster start and imports count) and SIGINT
at N minutes, exactly as the ``apex`` runs of ``benchmarks/minatar_vs_dqn.py`` (whose
``run_apex`` this script calls):

* ``dqn``: ``--preset minatar`` (dueling double DQN, 3-step, batch 128 transitions,
  8 env workers with Ape-X epsilons, no frame stack);
* ``r2d2``: ``--preset minatar_r2d2`` (the same conv torso and 256 units, then an LSTM
  of 128; sequences of 10 burn-in + 20 trained steps every 10 steps, batch 32
  sequences, 3-step double Q with h, 8 env workers with the same epsilons).

A greedy evaluation of 5 episodes every ``--eval-interval`` seconds runs on its own
actor beside training. Runs go one after the other, methods alternating seed by seed,
so each has the whole machine and load meets both alike. Prints a table (env steps,
updates, steps trained, the greedy return at N minutes and the mean of the last 3
evaluations), merges each run into ``benchmarks/results/r2d2_minatar.json`` as it
finishes and draws ``docs/img/r2d2_minatar.png``. Needs ``pip install
'apex_dask[minatar,bench]'``.

    python benchmarks/r2d2_minatar.py                                 # 2 x 20 min, seed 0
    python benchmarks/r2d2_minatar.py --minutes 3 --seeds 0 1         # 12 min
    python benchmarks/r2d2_minatar.py --plot-only
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from minatar_vs_dqn import at_minutes, run_apex, write_json  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "r2d2_minatar.json"
PLOT = ROOT / "docs" / "img" / "r2d2_minatar.png"
PRESETS = {"dqn": "minatar", "r2d2": "minatar_r2d2"}
COLORS = {"dqn": "tab:orange", "r2d2": "tab:blue"}


def run_one(method: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    out = args.out_dir / method
    sets = ["eval.animation=false", *args.sets]
    rec = run_apex(seed, args.minutes, args.eval_interval, sets, out, preset=PRESETS[method])
    rec |= {"method": method, "preset": PRESETS[method], "overrides": sets}
    rec["load_1m_end"] = round(os.getloadavg()[0], 2)
    return rec


def print_table(runs: dict[str, dict]) -> None:
    head = (
        f"{'method':6s} {'seed':>4s} {'min':>5s} {'env steps':>10s} {'updates':>8s} "
        f"{'trained':>10s} {'evals':>5s} {'ret@N':>7s} {'last3':>7s}"
    )
    print("\n" + head + "\n" + "-" * len(head))
    means: dict[str, list[float]] = {}
    for key in sorted(runs, key=lambda k: (runs[k]["seed"], runs[k]["method"])):
        r = runs[key]
        ret, last3 = at_minutes(r)
        means.setdefault(r["method"], []).append(last3)
        print(
            f"{r['method']:6s} {r['seed']:>4d} {r['minutes']:5.1f} {r['steps']:>10,d} "
            f"{r['updates']:>8,d} {r.get('steps_trained', 0):>10,d} {len(r['curve']):>5d} "
            f"{ret:7.2f} {last3:7.2f}"
        )
    if "dqn" in means and "r2d2" in means:
        d = sum(means["dqn"]) / len(means["dqn"])
        q = sum(means["r2d2"]) / len(means["r2d2"])
        ratio = q / d if d else math.nan
        print(f"last-3 means: r2d2 {q:.2f}, dqn {d:.2f}: r2d2 / dqn {ratio:.2f}x")


def plot(runs: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in runs.values():
        x = [p["wall_s"] / 60 for p in r["curve"]]
        y = [p["return_mean"] for p in r["curve"]]
        style = ("-", "--", ":", "-.")[r["seed"] % 4]
        label = f"{r['method']} (seed {r['seed']})"
        ax.plot(x, y, color=COLORS[r["method"]], linestyle=style, label=label)
    minutes = max((r["minutes"] for r in runs.values()), default=0)
    ax.set_title(f"MinAtar/Breakout-v1: R2D2 vs the DQN preset, {minutes:g} min per run")
    ax.set_xlabel("wall time since launch (min)")
    ax.set_ylabel("greedy return (5 episodes)")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--methods", nargs="+", default=list(PRESETS), choices=list(PRESETS))
    p.add_argument("--minutes", type=float, default=20.0, help="wall time per run")
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--eval-interval", type=float, default=60.0, help="seconds between evals")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--out-dir", type=Path, default=Path("/tmp/apex_r2d2_minatar"))
    p.add_argument("--json", type=Path, default=RESULTS)
    p.add_argument("--plot", type=Path, default=PLOT)
    p.add_argument("--plot-only", action="store_true", help="redraw plot + table from --json")
    args = p.parse_args(argv)
    doc = json.loads(args.json.read_text()) if args.json.exists() else {"runs": {}}
    if not args.plot_only:
        for seed in args.seeds:
            for method in args.methods:
                rec = run_one(method, seed, args)
                doc["runs"][f"{method}/{seed}"] = rec
                doc["machine"] = {"platform": platform.platform(), "cpus": os.cpu_count()}
                write_json(args.json, doc)
                print(f"done: {method} seed {seed} (exit {rec['exit_code']})", flush=True)
    print_table(doc["runs"])
    plot(doc["runs"], args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
