"""Greedy return on MinAtar Breakout in N minutes: apex-dask-submit vs a single-process DQN.

* ``apex``: ``apex-dask-submit --preset minatar`` on ``MinAtar/Breakout-v1`` with
  its embedded LocalCluster, as a user runs it, seed ``--set seed=S``. The clock
  starts when the command is launched (interpreter, cluster start and imports
  count); at N minutes the command gets SIGINT (``--stop-time`` is a backstop).
  Greedy evaluations (``eval.interval_s = --eval-interval``, the preset's 5
  episodes, ``eval.max_episode_steps`` cap) run on their own actor beside
  training; an evaluation is timed when its line appears in ``results.jsonl``
  (polled every 0.5 s), with ``timesteps_total`` of that result. Periodic
  checkpoints are off (``checkpoint.interval_s=0``: the reference writes none);
  ``--set KEY=VALUE`` passes further overrides.
* ``ref``: Stable-Baselines3 DQN with the MinAtar paper's DQN settings (Young &
  Tian 2019): batch 32, replay 100k, target update every 1,000 steps, lr 2.5e-4,
  epsilon 1 -> 0.1 over the first 100k steps, learning starts 5,000, one update
  per env step, gamma 0.99; the network is the apex ``minatar`` one: conv
  16x3x3/1 + ReLU, linear to ``dqn.hiddens`` (256) + ReLU, linear Q head.
  It trains for N minutes of wall time, checked by a callback; every
  ``--eval-interval`` seconds, and at N minutes, it plays 5 greedy episodes
  (separate env, the same step cap) and the time spent evaluating is left out
  of its clock -- which favours the reference.

What differs (apex -> ref): dueling head -> plain linear head; double DQN ->
plain max target; 3-step -> 1-step returns; prioritized (alpha 0.6, beta 0.4)
-> uniform replay; 400k -> 100k items; batch 128 -> 32; learning starts 10k ->
5k; target copy every 20k transitions trained (~156 updates) -> every 1,000 env
steps (= 1,000 updates); gradient clip 40 -> 10; per-worker Ape-X epsilons over
8 env workers -> one env with a decaying epsilon; updates as fast as the
learner goes -> one per env step. Both use Adam (eps 1e-8; the paper used
RMSProp) at lr 2.5e-4 and the Huber loss. Torch threads: 1 in apex's learner and,
by default, in the reference (``--ref-threads N``, 0: torch's default of one per
core, 25x slower on a 2-core machine whose cores other work kept busy);
``--parallel-ref`` runs the reference's seeds side by side, each pinned to its
own core. Env steps at the end: apex's last result dict (one per 10 s) before N
minutes; the reference's at N minutes of its clock.

Needs ``pip install 'apex_dask[minatar,bench]'`` (stable-baselines3, matplotlib).

    python benchmarks/minatar_vs_dqn.py                          # 20 min x 2 seeds x 2 methods
    python benchmarks/minatar_vs_dqn.py --only apex --minutes 20 --seeds 0 1
    python benchmarks/minatar_vs_dqn.py --only ref --parallel-ref
    python benchmarks/minatar_vs_dqn.py --plot-only              # redraw plot + table from the JSON

Prints a table (return at N minutes, the mean of the last 3 evaluations, and
apex / ref of the seed means; the target is >= 1.5x), merges each run into
``benchmarks/results/minatar.json`` by method and seed as it finishes, and draws
``docs/img/minatar_breakout.png`` (greedy return vs wall minutes and vs env steps).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import signal
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

ENV_ID = "MinAtar/Breakout-v1"
ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "minatar.json"
PLOT = ROOT / "docs" / "img" / "minatar_breakout.png"
# The MinAtar paper's DQN; epsilon 1 -> 0.1 over the first REF_EPS_STEPS env steps.
REF = dict(batch_size=32, buffer_size=100_000, target_update_interval=1_000, learning_rate=2.5e-4)
REF |= dict(learning_starts=5_000, gamma=0.99, train_freq=1, gradient_steps=1)
REF |= dict(exploration_initial_eps=1.0, exploration_final_eps=0.1)
REF_EPS_STEPS = 100_000
REF_TOTAL_STEPS = 10**9  # never reached: the wall clock stops it
APEX_DEFAULTS = ["checkpoint.interval_s=0"]

Record = dict[str, Any]


def apex_config(overrides: list[str], preset: str = "minatar"):
    from apex_dask.config import ApexConfig

    return ApexConfig.preset(preset).override(dict(s.split("=", 1) for s in overrides))


def run_apex(
    seed: int,
    minutes: float,
    eval_interval: float,
    sets: list[str],
    out: Path,
    preset: str = "minatar",
) -> Record:
    """One ``apex-dask-submit --preset <preset>`` run; its evaluations as they appear in
    results.jsonl."""
    out.mkdir(parents=True, exist_ok=True)
    run_dir = out / f"apex_seed{seed}_{time.strftime('%Y%m%d-%H%M%S')}"
    budget = minutes * 60.0
    sets = [f"env.env_id={ENV_ID}", *APEX_DEFAULTS, f"eval.interval_s={eval_interval}", *sets]
    sets.append(f"seed={seed}")
    cmd = [sys.executable, "-m", "apex_dask", "--preset", preset, "--quiet", "--no-tensorboard"]
    cmd += ["--out", str(run_dir), "--stop-time", str(budget)]
    cmd += [a for s in sets for a in ("--set", s)]
    results, pos, last, curve = run_dir / "results.jsonl", 0, {}, []
    stderr = open(run_dir.with_suffix(".stderr"), "w")  # noqa: SIM115
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True)
    startup, interrupted = None, False
    while True:
        done = proc.poll() is not None
        wall = time.perf_counter() - t0
        if results.exists():
            with results.open() as f:
                f.seek(pos)
                for line in f:
                    if not line.endswith("\n"):
                        break  # being written: read it next time
                    pos += len(line.encode())
                    r = json.loads(line)
                    if wall > budget:
                        continue
                    last = r
                    startup = wall - r["time_s"] if startup is None else startup
                    ev = r.get("eval/return_mean")
                    if ev is not None and np.isfinite(ev):
                        curve.append({"wall_s": wall, **_point(r), "return_mean": float(ev)})
        if done:
            break
        if wall >= budget and not interrupted:
            proc.send_signal(signal.SIGINT)  # the CLI saves and exits 130
            interrupted = True
        time.sleep(0.5)
    stderr.close()
    if proc.returncode not in (0, 130):
        print(f"apex seed {seed}: exit {proc.returncode}, see {stderr.name}", file=sys.stderr)
    return {
        "method": "apex",
        "seed": seed,
        "minutes": minutes,
        "command": " ".join(cmd),
        "exit_code": proc.returncode,
        "run_dir": str(run_dir),
        "startup_s": startup,
        **_point(last),
        "curve": curve,
    }


def _point(result: dict[str, Any]) -> dict[str, int]:
    return {
        "steps": int(result.get("timesteps_total", 0)),
        "updates": int(result.get("learner/updates", 0)),
        "steps_trained": int(result.get("learner/steps_trained", 0)),
    }


def run_ref(
    seed: int, minutes: float, eval_interval: float, threads: int, core: int | None = None
) -> Record:
    """SB3 DQN for ``minutes`` of wall time, evaluation time left out of its clock."""
    import torch

    if core is not None:
        os.sched_setaffinity(0, {core})
        threads = 1
    if threads:
        torch.set_num_threads(threads)
    import gymnasium as gym
    import minatar.gym
    from stable_baselines3 import DQN
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
    from torch import nn

    if ENV_ID not in gym.registry:
        minatar.gym.register_envs()
    cfg = apex_config([])
    episodes, cap, hidden = cfg.eval.episodes, cfg.eval.max_episode_steps, cfg.agent.hiddens[0]

    class MinAtarCNN(BaseFeaturesExtractor):
        """apex's small-grid ConvQNetwork trunk: HWC bool -> CHW float, conv 16x3x3/1, linear."""

        def __init__(self, observation_space: gym.spaces.Box, features_dim: int) -> None:
            super().__init__(observation_space, features_dim)
            h, w, c = observation_space.shape
            self.conv = nn.Sequential(nn.Conv2d(c, 16, 3, stride=1), nn.ReLU(), nn.Flatten())
            self.fc = nn.Sequential(nn.Linear(16 * (h - 2) * (w - 2), features_dim), nn.ReLU())

        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            return self.fc(self.conv(obs.float().permute(0, 3, 1, 2)))

    t0 = time.perf_counter()
    budget, eval_env = minutes * 60.0, gym.make(ENV_ID)
    eval_rng = np.random.default_rng([seed, 1])
    state = {"eval_s": 0.0, "next": eval_interval, "curve": []}

    def greedy_return(model: DQN) -> float:
        total = 0.0
        for _ in range(episodes):
            obs, _ = eval_env.reset(seed=int(eval_rng.integers(2**31)))
            for _ in range(cap or 2**62):
                with torch.no_grad():
                    q = model.policy.q_net(torch.as_tensor(obs[None]))
                obs, reward, terminated, truncated, _ = eval_env.step(int(q.argmax()))
                total += float(reward)
                if terminated or truncated:
                    break
        return total / episodes

    class WallClock(BaseCallback):
        def _on_step(self) -> bool:
            train_s = time.perf_counter() - t0 - state["eval_s"]
            if train_s < min(state["next"], budget):
                return True
            t_eval = time.perf_counter()
            point = {"wall_s": min(train_s, budget), "steps": self.num_timesteps}
            point["updates"] = int(self.model._n_updates)
            point["return_mean"] = greedy_return(self.model)
            state["curve"].append(point)
            state["eval_s"] += time.perf_counter() - t_eval
            while state["next"] <= train_s:
                state["next"] += eval_interval
            return train_s < budget

    model = DQN(
        "CnnPolicy",
        gym.make(ENV_ID),
        **REF,
        exploration_fraction=REF_EPS_STEPS / REF_TOTAL_STEPS,
        policy_kwargs={
            "features_extractor_class": MinAtarCNN,
            "features_extractor_kwargs": {"features_dim": hidden},
            "net_arch": [],
            "normalize_images": False,
        },
        seed=seed,
        device="cpu",
        verbose=0,
    )
    model.learn(total_timesteps=REF_TOTAL_STEPS, callback=WallClock())
    return {
        "method": "ref",
        "seed": seed,
        "minutes": minutes,
        "torch_threads": torch.get_num_threads(),
        "core": core,
        "eval_s": state["eval_s"],
        "wall_total_s": time.perf_counter() - t0,
        "steps": int(model.num_timesteps),
        "updates": int(model._n_updates),
        "curve": state["curve"],
    }


def merge(path: Path, records: list[Record], meta: dict[str, Any]) -> None:
    """Merge records into the JSON by ``method/seed`` (other entries kept); atomic write."""
    doc = json.loads(path.read_text()) if path.exists() else {"benchmark": "minatar", "runs": {}}
    doc.setdefault("runs", {}).update({f"{r['method']}/{r['seed']}": r for r in records})
    doc.setdefault("meta", {}).update({r["method"]: meta for r in records})
    write_json(path, doc)


def write_json(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(path)


def at_minutes(rec: Record) -> tuple[float, float]:
    """(return of the last evaluation at or before N minutes, mean of the last 3 of them)."""
    pts = [p["return_mean"] for p in rec["curve"] if p["wall_s"] <= rec["minutes"] * 60.0 + 1e-6]
    return (pts[-1], float(np.mean(pts[-3:]))) if pts else (math.nan, math.nan)


def print_table(runs: dict[str, Record]) -> dict[str, Any]:
    print(
        f"\n{'method':6s} {'seed':>4s} {'min':>5s} {'env steps':>10s} {'steps/s':>8s} "
        f"{'updates':>9s} {'evals':>5s} {'ret@N':>7s} {'last3':>7s}"
    )
    means: dict[str, list[tuple[float, float]]] = {}
    for key in sorted(runs):
        r = runs[key]
        ret, last3 = at_minutes(r)
        means.setdefault(r["method"], []).append((ret, last3))
        print(
            f"{r['method']:6s} {r['seed']:>4d} {r['minutes']:5.1f} {r['steps']:>10d} "
            f"{r['steps'] / (r['minutes'] * 60):8.0f} {r['updates']:>9d} "
            f"{len(r['curve']):>5d} {ret:7.2f} {last3:7.2f}"
        )
    summary = {m: np.nanmean(np.array(v), axis=0).tolist() for m, v in sorted(means.items())}
    for m, (ret, last3) in summary.items():
        print(f"{m:6s} mean {'':>44s} {ret:7.2f} {last3:7.2f}")
    if "apex" in summary and "ref" in summary:
        ratio = [a / b if b else math.nan for a, b in zip(*summary.values(), strict=True)]
        print(f"apex / ref: {ratio[0]:.2f}x at N minutes, {ratio[1]:.2f}x (last 3); target >= 1.5x")
        summary["ratio_apex_over_ref"] = ratio
    if len({r["minutes"] for r in runs.values()}) > 1:
        print("note: the runs differ in minutes")
    return summary


def _xy(curve: list[dict[str, Any]], x_key: str, scale: float) -> tuple[np.ndarray, np.ndarray]:
    return np.array([p[x_key] * scale for p in curve]), np.array([p["return_mean"] for p in curve])


def plot(runs: dict[str, Record], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    colors = {"apex": "tab:blue", "ref": "tab:orange"}
    labels = {"apex": "apex-dask-submit", "ref": "SB3 DQN (reference)"}
    panels = [
        ("wall_s", 1 / 60, "wall time (min)", np.linspace),
        ("steps", 1, "env steps", np.geomspace),
    ]
    for ax, (x_key, scale, xlabel, space) in zip(axes, panels, strict=True):
        for method in ("apex", "ref"):
            recs = [r for r in runs.values() if r["method"] == method and r["curve"]]
            curves = [_xy(r["curve"], x_key, scale) for r in recs]
            for x, y in curves:
                ax.plot(x, y, color=colors[method], alpha=0.35, lw=1)
            if curves:
                lo, hi = max(x[0] for x, _ in curves), min(x[-1] for x, _ in curves)
                grid = space(lo, hi, 200) if hi > lo else np.array([lo])
                mean = np.mean([np.interp(grid, x, y) for x, y in curves], axis=0)
                label = f"{labels[method]} (mean of {len(curves)} seeds)"
                ax.plot(grid, mean, color=colors[method], lw=2.5, label=label)
        ax.set_xlabel(xlabel)
        ax.set_xscale("log" if x_key == "steps" else "linear")  # apex samples ~10x more
        ax.set_ylabel("greedy return (5 episodes)")
        ax.grid(alpha=0.3)
    axes[0].legend(loc="upper left")
    minutes = max((r["minutes"] for r in runs.values()), default=0)
    fig.suptitle(f"{ENV_ID}: greedy return, {minutes:g} min of wall time per run")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=["apex", "ref"], help="run one method (default: both)")
    p.add_argument("--minutes", type=float, default=20.0, help="wall time per run")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    p.add_argument("--eval-interval", type=float, default=60.0, help="seconds between evals")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--ref-threads", type=int, default=1, help="torch threads; 0: torch's default")
    p.add_argument("--parallel-ref", action="store_true", help="ref seeds side by side, pinned")
    p.add_argument("--out-dir", type=Path, default=Path("/tmp/apex_minatar_runs"))
    p.add_argument("--json", type=Path, default=RESULTS)
    p.add_argument("--plot", type=Path, default=PLOT)
    p.add_argument("--plot-only", action="store_true", help="redraw plot + table from --json")
    args = p.parse_args(argv)
    if not args.plot_only:
        import torch

        meta = {
            "command": "python benchmarks/minatar_vs_dqn.py "
            + " ".join(sys.argv[1:] if argv is None else argv),
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "eval_interval_s": args.eval_interval,
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        }
        meta["machine"] |= {"torch": torch.__version__, "load_1m": round(os.getloadavg()[0], 2)}
        if args.only in (None, "apex"):
            meta_apex = {**meta, "config": apex_config([*APEX_DEFAULTS, *args.sets]).to_dict()}
            for seed in args.seeds:
                rec = run_apex(seed, args.minutes, args.eval_interval, args.sets, args.out_dir)
                merge(args.json, [rec], meta_apex)
                print(f"apex seed {seed}: {rec['steps']} steps, {len(rec['curve'])} evals")
        if args.only in (None, "ref"):
            meta_ref = {**meta, "ref": {**REF, "exploration_steps": REF_EPS_STEPS}}
            jobs = [(s, args.minutes, args.eval_interval, args.ref_threads) for s in args.seeds]

            def done(rec: Record) -> None:
                merge(args.json, [rec], meta_ref)
                print(f"ref seed {rec['seed']}: {rec['steps']} steps, {len(rec['curve'])} evals")

            if args.parallel_ref:  # one process per seed, each on its own core, 1 thread
                cores = sorted(os.sched_getaffinity(0))
                jobs = [(*j[:3], 1, cores[i % len(cores)]) for i, j in enumerate(jobs)]
                with ProcessPoolExecutor(len(jobs), mp_context=get_context("spawn")) as ex:
                    for fut in as_completed([ex.submit(run_ref, *j) for j in jobs]):
                        done(fut.result())
            else:
                for job in jobs:
                    done(run_ref(*job))
    doc = json.loads(args.json.read_text())
    doc["summary"] = print_table(doc["runs"])
    write_json(args.json, doc)
    plot(doc["runs"], args.plot)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
