"""Greedy return of each value head on MinAtar games in N minutes: plain, C51, noisy nets,
HL-Gauss and LayerNorm, ``apex-dask-submit --preset minatar`` as a user runs it.

Each run is one ``apex-dask-submit`` (its embedded LocalCluster, the clock started at
launch, SIGINT at N minutes, a greedy evaluation of 5 episodes every
``--eval-interval`` seconds on its own actor), exactly as the ``apex`` runs of
``benchmarks/minatar_vs_dqn.py`` (whose ``run_apex`` this script calls), with the
head's overrides on top of the preset. Runs go one after the other, never two at
once: each gets the whole machine.

Heads (everything else is the ``minatar`` preset: dueling, double Q, 3-step, Adam 2.5e-4,
batch 128, 8 env workers with Ape-X epsilons):

* ``plain``: the preset;
* ``c51``: ``dqn.num_atoms=51`` on [-10, 40] (MinAtar's rewards are unclipped and
  >= 0: a discounted return of a good Breakout or Space Invaders agent passes the C51
  paper's 10; 1.0 per atom);
* ``noisy``: ``dqn.noisy=true`` (sigma0 0.5; every worker's epsilon 0, the noise
  explores);
* ``hl_gauss``: ``dqn.loss=hl_gauss``, 51 bins on [-10, 40], sigma 0.75 bin widths;
* ``layer_norm``: ``dqn.layer_norm=true``;
* ``c51_noisy``: C51 as above with noisy nets (both options of Rainbow's head).

The default is the full benchmark: two games (Breakout, Space Invaders) x six heads x
20 minutes x seed 0 = 240 minutes. ``--games``, ``--heads``, ``--minutes`` and
``--seeds`` shorten it (the JSON records what ran).

    python benchmarks/minatar_heads.py                                   # 240 minutes
    python benchmarks/minatar_heads.py --games Breakout --minutes 5      # 25 minutes
    python benchmarks/minatar_heads.py --plot-only

Prints a table (env steps, updates, the greedy return at N minutes and the mean of
the last 3 evaluations, and each against ``plain`` of the same game and seed), merges
each run into ``benchmarks/results/minatar_heads.json`` as it finishes, and draws
``docs/img/minatar_heads.png`` (greedy return against wall minutes, a panel per game).
Needs ``pip install 'apex_dask[minatar,bench]'``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from minatar_vs_dqn import APEX_DEFAULTS, apex_config, at_minutes, run_apex, write_json  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "minatar_heads.json"
PLOT = ROOT / "docs" / "img" / "minatar_heads.png"
GAMES = ["Breakout", "SpaceInvaders"]
SUPPORT = ["dqn.v_min=-10", "dqn.v_max=40"]
HEADS: dict[str, list[str]] = {
    "plain": [],
    "c51": ["dqn.num_atoms=51", *SUPPORT],
    "noisy": ["dqn.noisy=true"],
    "hl_gauss": ["dqn.loss=hl_gauss", "dqn.num_bins=51", *SUPPORT],
    "layer_norm": ["dqn.layer_norm=true"],
    "c51_noisy": ["dqn.num_atoms=51", *SUPPORT, "dqn.noisy=true"],
}
COLORS = {
    "plain": "tab:blue",
    "c51": "tab:orange",
    "noisy": "tab:green",
    "hl_gauss": "tab:red",
    "layer_norm": "tab:purple",
    "c51_noisy": "tab:brown",
}


def run_one(game: str, head: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    env_id = f"MinAtar/{game}-v1"
    sets = [f"env.env_id={env_id}", *HEADS[head], *args.sets]
    out = args.out_dir / f"{game}_{head}"
    rec = run_apex(seed, args.minutes, args.eval_interval, sets, out)
    rec |= {"method": head, "game": game, "env_id": env_id, "overrides": HEADS[head]}
    rec["load_1m_end"] = round(os.getloadavg()[0], 2)
    return rec


def print_table(runs: dict[str, dict]) -> dict[str, Any]:
    print(
        f"\n{'game':14s} {'head':10s} {'seed':>4s} {'min':>5s} {'env steps':>10s} "
        f"{'updates':>8s} {'evals':>5s} {'ret@N':>7s} {'last3':>7s} {'/plain':>7s} "
        f"{'per 1k upd':>10s} {'per 1M st':>9s}"
    )
    summary: dict[str, Any] = {}
    for key in sorted(runs, key=lambda k: (runs[k]["game"], list(HEADS).index(runs[k]["method"]))):
        r = runs[key]
        ret, last3 = at_minutes(r)
        plain = runs.get(f"{r['game']}/plain/{r['seed']}")
        ratio = math.nan
        if plain is not None:
            base = at_minutes(plain)[1]
            ratio = last3 / base if base else math.nan
        # the return bought by each update and by each env step: a head that loses in wall
        # time may lose by making fewer of them, or by learning less from each
        per_update = 1000 * last3 / r["updates"] if r["updates"] else math.nan
        per_step = 1e6 * last3 / r["steps"] if r["steps"] else math.nan
        summary[key] = {
            "return_at_n": ret,
            "last3": last3,
            "last3_over_plain": ratio,
            "last3_per_1k_updates": per_update,
            "last3_per_1m_env_steps": per_step,
        }
        print(
            f"{r['game']:14s} {r['method']:10s} {r['seed']:>4d} {r['minutes']:5.1f} "
            f"{r['steps']:>10d} {r['updates']:>8d} {len(r['curve']):>5d} {ret:7.2f} "
            f"{last3:7.2f} {ratio:7.2f} {per_update:10.3f} {per_step:9.2f}"
        )
    return summary


def plot(runs: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    games = sorted({r["game"] for r in runs.values()})
    fig, axes = plt.subplots(1, len(games), figsize=(5.5 * len(games), 4), squeeze=False)
    for ax, game in zip(axes[0], games, strict=True):
        for r in runs.values():
            if r["game"] != game or not r["curve"]:
                continue
            x = [p["wall_s"] / 60 for p in r["curve"]]
            y = [p["return_mean"] for p in r["curve"]]
            ax.plot(x, y, color=COLORS.get(r["method"]), label=f"{r['method']} (seed {r['seed']})")
        ax.set_title(f"MinAtar/{game}-v1")
        ax.set_xlabel("wall time (min)")
        ax.set_ylabel("greedy return (5 episodes)")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=8)
    minutes = max((r["minutes"] for r in runs.values()), default=0)
    fig.suptitle(f"apex-dask-submit --preset minatar, {minutes:g} min per run, by value head")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--games", nargs="+", default=GAMES, help="MinAtar games (their short names)")
    p.add_argument("--heads", nargs="+", default=list(HEADS), choices=list(HEADS))
    p.add_argument("--minutes", type=float, default=20.0, help="wall time per run")
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--eval-interval", type=float, default=60.0, help="seconds between evals")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--out-dir", type=Path, default=Path("/tmp/apex_minatar_heads"))
    p.add_argument("--json", type=Path, default=RESULTS)
    p.add_argument("--plot", type=Path, default=PLOT)
    p.add_argument("--plot-only", action="store_true", help="redraw plot + table from --json")
    args = p.parse_args(argv)
    if not args.plot_only:
        import torch

        meta = {
            "command": "python benchmarks/minatar_heads.py "
            + " ".join(sys.argv[1:] if argv is None else argv),
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "eval_interval_s": args.eval_interval,
            "config": apex_config([*APEX_DEFAULTS, *args.sets]).to_dict(),
            "heads": {h: HEADS[h] for h in args.heads},
            "machine": {
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "torch": torch.__version__,
                "load_1m": round(os.getloadavg()[0], 2),
            },
        }
        for game in args.games:
            for seed in args.seeds:
                for head in args.heads:
                    rec = run_one(game, head, seed, args)
                    doc = json.loads(args.json.read_text()) if args.json.exists() else {}
                    doc.setdefault("runs", {})[f"{game}/{head}/{seed}"] = rec
                    doc.setdefault("meta", {})[f"{game}/{head}/{seed}"] = meta
                    write_json(args.json, doc)
                    last = rec["curve"][-1]["return_mean"] if rec["curve"] else math.nan
                    print(f"{game} {head} seed {seed}: {rec['steps']} steps, last eval {last}")
    doc = json.loads(args.json.read_text())
    doc["summary"] = print_table(doc["runs"])
    write_json(args.json, doc)
    plot(doc["runs"], args.plot)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
