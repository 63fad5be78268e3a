"""Ape-X DPG on continuous control: apex-dask-submit against Stable-Baselines3 TD3.

Two tasks, both runners in the same run, runs alternating seed by seed so
machine load falls on both alike:

* ``pendulum``: wall time to the first greedy evaluation (10 episodes, no
  noise) with mean return >= -200 on ``Pendulum-v1``.
* ``halfcheetah``: the greedy return (5 episodes) at ``--minutes`` of wall
  time on ``HalfCheetah-v5`` (20 by default; needs ``apex_dask[mujoco]``).

Runners:

* ``dask``: ``apex-dask-submit --preset pendulum|halfcheetah`` on its embedded
  LocalCluster, as a user runs it. The clock starts when the command is
  launched (interpreter, cluster and actor start-up count); its evaluations
  run on their own actor beside training, so none is subtracted. Results are
  read from ``results.jsonl`` as the CLI appends them. ``run_s`` is the same
  moment on the run's own clock (``time_s``: from the driver's start).
* ``sb3``: Stable-Baselines3 ``TD3`` with rl-zoo's hyperparameters: Pendulum-v1
  ``gamma 0.98, buffer 200k, lr 1e-3, learning_starts 10k, normal noise std 0.1,
  net_arch [400, 300], train_freq (1, episode), gradient_steps -1`` (rl-zoo stops
  at 20k steps; here the wall-time budget stops it); HalfCheetah ``learning_starts
  10k, normal noise std 0.1, train_freq 1, gradient_steps 1``, SB3's defaults
  otherwise (lr 1e-3, batch 256, net_arch [400, 300]). One torch thread. It is
  evaluated every ``--eval-interval-s`` seconds of its wall time, with the
  deterministic actor; evaluation time is kept off its clock.

A record holds ``runner, seed, reached, time_to_target_s, run_s, wall_s, steps,
final_eval, best_eval, curve`` (``[wall s, greedy return]`` pairs).

    python benchmarks/continuous.py pendulum                       # 3 seeds, dask + sb3
    python benchmarks/continuous.py halfcheetah --seeds 0 1 --minutes 20
    python benchmarks/continuous.py pendulum --plot docs/img/continuous_pendulum.png

Prints a table and writes ``benchmarks/results/continuous_<task>.json``.
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

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
TASKS: dict[str, dict[str, Any]] = {
    "pendulum": {"env": "Pendulum-v1", "target": -200.0, "episodes": 10, "eval_s": 2.0},
    "halfcheetah": {"env": "HalfCheetah-v5", "target": None, "episodes": 5, "eval_s": 60.0},
}
Record = dict[str, Any]


def run_dask(task: str, seed: int, budget_s: float, eval_s: float) -> Record:
    """``apex-dask-submit --preset <task>``; see the module docstring."""
    spec = TASKS[task]
    submit = Path(sys.executable).parent / "apex-dask-submit"
    curve: list[list[float]] = []
    reached = run_at = None
    steps, wall = 0, 0.0
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        cmd = [str(submit), "--preset", task, "--quiet", "--no-tensorboard", "--out", str(out)]
        cmd += ["--stop-time", str(budget_s), "--set", f"seed={seed}"]
        cmd += ["--set", f"eval.episodes={spec['episodes']}", "--set", f"eval.interval_s={eval_s}"]
        if spec["target"] is not None:
            cmd += ["--stop-eval-return", str(spec["target"])]
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        seen = 0
        while True:
            done = proc.poll() is not None
            results = out / "results.jsonl"
            if results.exists():
                now = time.perf_counter() - t0
                for line in results.read_text().splitlines()[seen:]:
                    try:
                        r = json.loads(line)
                    except ValueError:
                        break  # being written: read it next time
                    seen += 1
                    steps = int(r.get("timesteps_total", steps))
                    ev = r.get("eval/return_mean")
                    if ev is None or not np.isfinite(ev):
                        continue
                    curve.append([now, float(ev)])
                    target = spec["target"]
                    if target is not None and ev >= target and reached is None:
                        reached, run_at = now, float(r["time_s"])
            if done:
                break
            time.sleep(0.02)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            print(f"dask seed {seed}: exit {proc.returncode}: {proc.stderr.read()[-400:]}")
    return _record("dask", seed, reached, run_at, wall, steps, curve)


def run_sb3(task: str, seed: int, budget_s: float, eval_s: float) -> Record:
    """Stable-Baselines3 TD3 with rl-zoo's hyperparameters; see the module docstring."""
    import gymnasium as gym
    from stable_baselines3 import TD3
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.noise import NormalActionNoise

    spec = TASKS[task]
    env, eval_env = gym.make(spec["env"]), gym.make(spec["env"])
    rng = np.random.default_rng([seed, 1])
    state = {"start": time.perf_counter(), "eval_s": 0.0, "last": time.perf_counter()}
    curve: list[list[float]] = []
    out: dict[str, Any] = {"reached": None}

    def train_s() -> float:
        return time.perf_counter() - state["start"] - state["eval_s"]

    def greedy(model: TD3) -> float:
        total = 0.0
        for _ in range(spec["episodes"]):
            obs, _ = eval_env.reset(seed=int(rng.integers(2**31)))
            done = False
            while not done:
                action, _ = model.predict(obs, deterministic=True)
                obs, reward, terminated, truncated, _ = eval_env.step(action)
                total += float(reward)
                done = terminated or truncated
        return total / spec["episodes"]

    class Evaluate(BaseCallback):
        def _on_step(self) -> bool:
            if train_s() >= budget_s:
                return False
            if time.perf_counter() - state["last"] < eval_s:
                return True
            t0 = time.perf_counter()
            score = greedy(self.model)
            state["last"] = t1 = time.perf_counter()
            state["eval_s"] += t1 - t0
            curve.append([train_s(), score])
            if spec["target"] is not None and score >= spec["target"]:
                out["reached"] = train_s()
                return False
            return True

    n = env.action_space.shape[0]
    noise = NormalActionNoise(np.zeros(n), 0.1 * np.ones(n))
    if task == "pendulum":
        kw = {"gamma": 0.98, "buffer_size": 200_000, "learning_starts": 10_000}
        kw |= {"train_freq": (1, "episode"), "gradient_steps": -1}
    else:
        kw = {"learning_starts": 10_000, "train_freq": 1, "gradient_steps": 1}
    model = TD3(
        "MlpPolicy",
        env,
        learning_rate=1e-3,
        action_noise=noise,
        policy_kwargs={"net_arch": [400, 300]},
        seed=seed,
        device="cpu",
        verbose=0,
        **kw,
    )
    model.learn(total_timesteps=10**7, callback=Evaluate())
    if spec["target"] is None:  # the return at the window's end
        t0 = time.perf_counter()
        curve.append([train_s(), greedy(model)])
        state["eval_s"] += time.perf_counter() - t0
    wall = time.perf_counter() - state["start"]
    steps = int(model.num_timesteps)
    return _record("sb3", seed, out["reached"], out["reached"], wall, steps, curve)


def _record(runner, seed, reached, run_at, wall, steps, curve) -> Record:
    evals = [e for _, e in curve]
    return {
        "runner": runner,
        "seed": seed,
        "reached": reached is not None,
        "time_to_target_s": reached,
        "run_s": run_at,
        "wall_s": wall,
        "steps": steps,
        "final_eval": evals[-1] if evals else None,
        "best_eval": max(evals) if evals else None,
        "curve": curve,
    }


RUNNERS = {"dask": run_dask, "sb3": run_sb3}


def summarize(task: str, records: list[Record]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for runner in dict.fromkeys(r["runner"] for r in records):
        rs = [r for r in records if r["runner"] == runner]
        if TASKS[task]["target"] is not None:
            times = [r["time_to_target_s"] if r["reached"] else float("inf") for r in rs]
            med = statistics.median(times)
            out[runner] = {
                "runs": len(rs),
                "reached": sum(r["reached"] for r in rs),
                "median_time_to_target_s": med if np.isfinite(med) else None,
                "times_s": [r["time_to_target_s"] for r in rs],
                "run_s": [r["run_s"] for r in rs],
                "median_steps": statistics.median(r["steps"] for r in rs),
            }
        else:
            finals = [r["final_eval"] for r in rs if r["final_eval"] is not None]
            out[runner] = {
                "runs": len(rs),
                "median_final_eval": statistics.median(finals) if finals else None,
                "final_evals": [r["final_eval"] for r in rs],
                "median_steps": statistics.median(r["steps"] for r in rs),
            }
    return out


def print_table(task: str, summary: dict[str, dict[str, Any]]) -> None:
    key = "median_time_to_target_s" if TASKS[task]["target"] is not None else "median_final_eval"
    base = summary.get("sb3", {}).get(key)
    print(f"\n{'runner':6s} {key:>24s} {'vs sb3':>7s}  per seed               median steps")
    for runner, s in summary.items():
        med = s[key]
        ratio = f"{med / base:6.2f}x" if med is not None and base and base > 0 else "     -"
        per = s.get("times_s", s.get("final_evals"))
        seeds = " / ".join("-" if v is None else f"{v:.1f}" for v in per)
        shown = "-" if med is None else f"{med:.1f}"
        print(f"{runner:6s} {shown:>24s} {ratio:>7s}  {seeds:22s} {s['median_steps']:.0f}")


def plot(task: str, records: list[Record], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    colors = {"dask": "tab:blue", "sb3": "tab:orange"}
    for r in records:
        if r["curve"]:
            xs, ys = zip(*r["curve"], strict=True)
            label = f"{r['runner']} seed {r['seed']}"
            ax.plot(xs, ys, marker=".", color=colors[r["runner"]], alpha=0.8, label=label)
    if TASKS[task]["target"] is not None:
        ax.axhline(TASKS[task]["target"], color="gray", linestyle="--", linewidth=1)
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel(f"greedy return ({TASKS[task]['episodes']} episodes)")
    ax.set_title(f"{TASKS[task]['env']}: apex-dask-submit (Ape-X DPG) vs SB3 TD3")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("task", choices=list(TASKS))
    p.add_argument("--runners", nargs="+", default=list(RUNNERS), choices=list(RUNNERS))
    p.add_argument("--seeds", nargs="+", type=int, default=None, help="default 0 1 2 / 0 1")
    p.add_argument("--budget-s", type=float, default=300.0, help="pendulum: wall time per run")
    p.add_argument("--minutes", type=float, default=20.0, help="halfcheetah: the window")
    p.add_argument("--eval-interval-s", type=float, default=None)
    p.add_argument("--plot", type=Path, default=None, help="write a PNG of the curves here")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    spec = TASKS[args.task]
    seeds = args.seeds or ([0, 1, 2] if args.task == "pendulum" else [0, 1])
    budget = args.budget_s if spec["target"] is not None else 60.0 * args.minutes
    eval_s = args.eval_interval_s or spec["eval_s"]
    load_before = os.getloadavg()
    records: list[Record] = []
    for seed in seeds:
        for name in args.runners:
            rec = RUNNERS[name](args.task, seed, budget, eval_s)
            records.append(rec)
            t = rec["time_to_target_s"]
            what = f"target in {t:.1f} s" if t is not None else f"final {rec['final_eval']}"
            print(f"{name:5s} seed {seed}: {what} ({rec['steps']} steps, best {rec['best_eval']})")
    summary = summarize(args.task, records)
    print_table(args.task, summary)
    doc = {
        "benchmark": f"continuous_{args.task}",
        "command": "python benchmarks/continuous.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "load_avg_1m_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        },
        "criterion": {**spec, "budget_s": budget, "eval_interval_s": eval_s},
        "records": records,
        "summary": summary,
    }
    out = args.out or RESULTS / f"continuous_{args.task}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"\nwrote {out}")
    if args.plot is not None:
        plot(args.task, records, args.plot)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
