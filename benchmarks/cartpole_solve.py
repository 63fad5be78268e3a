"""Time to solve CartPole-v1: apex-dask-submit (Dask), the in-process runner and SB3 DQN.

"Solved" = the first greedy evaluation (epsilon 0, 10 episodes on a separate
env) with mean return >= 475. Every runner is evaluated the same way:
an evaluation starts once ``--eval-interval-s`` seconds of wall time have
passed since the previous one ended (the first one that long after the
start), and the reported time to solve is the wall time from the start
(building included) to the end of the solving evaluation **minus the time
spent in evaluations**, so each runner's evaluation speed does not count.

Runners (each a function ``(seed, budget_s) -> record``, see ``RUNNERS``):

* ``dask``: ``apex-dask-submit --preset cartpole`` on its embedded LocalCluster;
  the clock includes process start, the cluster start and actor creation.
* ``local``: ``apex_dask.local.LocalApex`` with the ``cartpole`` preset.
* ``sb3``: Stable-Baselines3 DQN with the rl-zoo CartPole-v1 hyperparameters
  (lr 2.3e-3, batch 64, buffer 100k, learning_starts 1000, gamma 0.99,
  target_update_interval 10, train_freq 256, gradient_steps 128,
  exploration_fraction 0.16, exploration_final_eps 0.04, net_arch [256, 256],
  50k steps). Needs ``pip install stable-baselines3``.

A record is ``{"runner", "seed", "solved", "time_to_solve_s" (None if not
solved), "wall_s" (incl. evaluations), "eval_s", "steps", "evals",
"best_eval", "last_eval"}``. Runs alternate between runners seed by seed so
machine load affects them alike; torch uses one thread everywhere.

    python benchmarks/cartpole_solve.py                     # 3 seeds, dask + local + sb3
    python benchmarks/cartpole_solve.py --runners local --seeds 0 1 2 3 4
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

SOLVED_AT = 475.0
EVAL_EPISODES = 10
SB3_STEPS = 50_000
RESULTS = Path(__file__).resolve().parent / "results" / "cartpole_solve.json"

Record = dict[str, Any]


class EvalClock:
    """Wall clock with evaluation time kept apart, and the shared eval cadence."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.start = time.perf_counter()
        self.eval_s = 0.0
        self.evals = 0
        self.best = -np.inf
        self.last = float("nan")
        self._last_end = self.start
        self.solved_at: float | None = None
        self.solved_steps: int | None = None

    def due(self) -> bool:
        return time.perf_counter() - self._last_end >= self.interval_s

    def record(self, mean_return: float, t0: float, steps: int) -> bool:
        """Book an evaluation that started at ``t0``; True when it solved."""
        t1 = time.perf_counter()
        self.eval_s += t1 - t0
        self._last_end = t1
        self.evals += 1
        self.last = mean_return
        self.best = max(self.best, mean_return)
        if mean_return >= SOLVED_AT and self.solved_at is None:
            self.solved_at = t1 - self.start - self.eval_s
            self.solved_steps = steps
            return True
        return False

    def train_s(self) -> float:
        return time.perf_counter() - self.start - self.eval_s

    def as_record(self, runner: str, seed: int, steps: int) -> Record:
        return {
            "runner": runner,
            "seed": seed,
            "solved": self.solved_at is not None,
            "time_to_solve_s": self.solved_at,
            "wall_s": time.perf_counter() - self.start,
            "eval_s": self.eval_s,
            "steps": self.solved_steps if self.solved_steps is not None else steps,
            "evals": self.evals,
            "best_eval": float(self.best) if self.evals else None,
            "last_eval": float(self.last) if self.evals else None,
        }


def run_apex_local(seed: int, budget_s: float, eval_interval_s: float) -> Record:
    """apex_dask.local with the ``cartpole`` preset; its own evaluator, at the shared cadence."""
    from apex_dask.config import ApexConfig
    from apex_dask.local import LocalApex

    t_start = time.perf_counter()
    cfg = ApexConfig.preset("cartpole").override(
        {"seed": seed, "eval.episodes": EVAL_EPISODES, "eval.interval_s": eval_interval_s}
    )
    apex = LocalApex(cfg)  # evaluates once eval_interval_s passed since the last one ended
    seen, evals, best, solved_at, steps = None, 0, -np.inf, None, None
    try:
        while time.perf_counter() - t_start - apex.eval_time_s < budget_s:
            apex.step()
            ev = apex.last_eval
            if ev is None or ev is seen:
                continue
            seen, evals, best = ev, evals + 1, max(best, ev["return_mean"])
            if ev["return_mean"] >= SOLVED_AT:
                end = apex.start_time + ev["time_s"]
                solved_at, steps = end - t_start - ev["eval_time_s"], ev["timesteps"]
                break
    finally:
        apex.close()
    return {
        "runner": "local",
        "seed": seed,
        "solved": solved_at is not None,
        "time_to_solve_s": solved_at,
        "wall_s": time.perf_counter() - t_start,
        "eval_s": apex.eval_time_s,
        "steps": steps if steps is not None else apex.steps_sampled,
        "evals": evals,
        "best_eval": float(best) if seen else None,
        "last_eval": float(seen["return_mean"]) if seen else None,
    }


def run_apex_dask(seed: int, budget_s: float, eval_interval_s: float) -> Record:
    """``apex-dask-submit --preset cartpole`` on its embedded LocalCluster, as a user runs it.

    The clock starts when the command is launched, so interpreter start-up,
    the LocalCluster start and the workers' imports all count. The driver's
    greedy evaluations run on their own actor beside training, so no
    evaluation time is subtracted. A result is seen when the CLI appends it
    to ``results.jsonl`` (polled every 20 ms).
    """
    import subprocess
    import tempfile

    submit = Path(sys.executable).parent / "apex-dask-submit"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        cmd = [
            str(submit),
            "--preset",
            "cartpole",
            "--quiet",
            "--out",
            str(out),
            "--stop-eval-return",
            str(SOLVED_AT),
            "--stop-time",
            str(budget_s),
            "--set",
            f"seed={seed}",
            "--set",
            f"eval.episodes={EVAL_EPISODES}",
            "--set",
            f"eval.interval_s={eval_interval_s}",
        ]
        t_start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        results, seen_lines, solved_at, steps, evals, best, last = (
            out / "results.jsonl",
            0,
            None,
            0,
            0,
            -np.inf,
            None,
        )
        while True:
            done = proc.poll() is not None
            if results.exists():
                lines = results.read_text().splitlines()
                now = time.perf_counter() - t_start
                for line in lines[seen_lines:]:
                    try:
                        r = json.loads(line)
                    except ValueError:
                        break  # a line being written; read it next time
                    seen_lines += 1
                    steps = int(r.get("timesteps_total", steps))
                    ev = r.get("eval/return_mean")
                    if ev is not None and np.isfinite(ev):
                        evals, best, last = evals + 1, max(best, ev), ev
                        if ev >= SOLVED_AT and solved_at is None:
                            solved_at = now
            if done:
                break
            time.sleep(0.02)
        wall = time.perf_counter() - t_start
        if proc.returncode != 0:
            print(
                f"dask seed {seed}: apex-dask-submit exited {proc.returncode}: "
                f"{proc.stderr.read()[-500:]}",
                file=sys.stderr,
            )
    return {
        "runner": "dask",
        "seed": seed,
        "solved": solved_at is not None,
        "time_to_solve_s": solved_at,
        "wall_s": wall,
        "eval_s": 0.0,
        "steps": steps,
        "evals": evals,
        "best_eval": float(best) if evals else None,
        "last_eval": float(last) if evals else None,
    }


def run_sb3(seed: int, budget_s: float, eval_interval_s: float) -> Record:
    """Stable-Baselines3 DQN, rl-zoo CartPole-v1 hyperparameters, 50k steps at most."""
    import gymnasium as gym
    from stable_baselines3 import DQN
    from stable_baselines3.common.callbacks import BaseCallback

    clock = EvalClock(eval_interval_s)
    eval_env = gym.make("CartPole-v1")
    eval_rng = np.random.default_rng([seed, 1])

    def greedy_return(model: DQN) -> float:
        q_net = model.policy.q_net
        total = 0.0
        for _ in range(EVAL_EPISODES):
            obs, _ = eval_env.reset(seed=int(eval_rng.integers(2**31)))
            done = False
            while not done:
                with torch.no_grad():
                    q = q_net(torch.as_tensor(obs[None], dtype=torch.float32))
                obs, reward, terminated, truncated, _ = eval_env.step(int(q.argmax()))
                total += float(reward)
                done = terminated or truncated
        return total / EVAL_EPISODES

    class Evaluate(BaseCallback):
        def _on_step(self) -> bool:
            if clock.train_s() >= budget_s:
                return False
            if not clock.due():
                return True
            t0 = time.perf_counter()
            score = greedy_return(self.model)
            return not clock.record(score, t0, self.num_timesteps)

    model = DQN(
        "MlpPolicy",
        gym.make("CartPole-v1"),
        learning_rate=2.3e-3,
        batch_size=64,
        buffer_size=100_000,
        learning_starts=1000,
        gamma=0.99,
        target_update_interval=10,
        train_freq=256,
        gradient_steps=128,
        exploration_fraction=0.16,
        exploration_final_eps=0.04,
        policy_kwargs={"net_arch": [256, 256]},
        seed=seed,
        device="cpu",
        verbose=0,
    )
    model.learn(total_timesteps=SB3_STEPS, callback=Evaluate())
    return clock.as_record("sb3", seed, int(model.num_timesteps))


RUNNERS: dict[str, Callable[[int, float, float], Record]] = {
    "dask": run_apex_dask,
    "local": run_apex_local,
    "sb3": run_sb3,
}
"""Runner name -> ``(seed, budget_s, eval_interval_s) -> record``. A Dask runner
plugs in as another entry (e.g. ``"dask"``) measured the same way."""


def summarize(records: list[Record]) -> dict[str, dict[str, Any]]:
    """Per runner: seeds solved, median time to solve (unsolved count as +inf), median steps."""
    out: dict[str, dict[str, Any]] = {}
    for runner in dict.fromkeys(r["runner"] for r in records):
        rs = [r for r in records if r["runner"] == runner]
        times = [r["time_to_solve_s"] if r["solved"] else float("inf") for r in rs]
        med = statistics.median(times)
        out[runner] = {
            "runs": len(rs),
            "solved": sum(r["solved"] for r in rs),
            "median_time_to_solve_s": med if np.isfinite(med) else None,
            "times_s": [r["time_to_solve_s"] for r in rs],
            "median_steps": statistics.median(r["steps"] for r in rs),
        }
    return out


def print_table(summary: dict[str, dict[str, Any]], base: str) -> None:
    base_med = summary.get(base, {}).get("median_time_to_solve_s")
    print(
        f"\n{'runner':8s} {'solved':>7s} {'median s':>9s} {'vs ' + base:>8s}  per seed (s)      median steps"
    )
    for runner, s in summary.items():
        med = s["median_time_to_solve_s"]
        ratio = med / base_med if med is not None and base_med else None
        seeds = " ".join("-" if t is None else f"{t:.1f}" for t in s["times_s"])
        print(
            f"{runner:8s} {s['solved']:>3d}/{s['runs']:<3d} "
            f"{'-' if med is None else f'{med:9.1f}':>9s} "
            f"{'-' if ratio is None else f'{ratio:7.2f}x':>8s}  {seeds:16s}  {s['median_steps']:.0f}"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runners", nargs="+", default=list(RUNNERS), choices=list(RUNNERS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--budget-s", type=float, default=120.0, help="training wall time per run")
    p.add_argument(
        "--eval-interval-s",
        type=float,
        default=None,
        help="seconds between evaluations (default: the cartpole preset's eval.interval_s)",
    )
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    if args.eval_interval_s is None:
        from apex_dask.config import ApexConfig

        args.eval_interval_s = ApexConfig.preset("cartpole").eval.interval_s
    records: list[Record] = []
    load_before = os.getloadavg()
    for seed in args.seeds:
        for name in args.runners:
            rec = RUNNERS[name](seed, args.budget_s, args.eval_interval_s)
            records.append(rec)
            t = rec["time_to_solve_s"]
            outcome = f"solved in {t:.1f} s" if rec["solved"] else "NOT solved"
            print(
                f"{name:6s} seed {seed}: {outcome} ({rec['steps']} steps, "
                f"{rec['evals']} evals, best {rec['best_eval']})",
                flush=True,
            )
    summary = summarize(records)
    base = "sb3" if "sb3" in summary else args.runners[0]
    print_table(summary, base)
    from apex_dask.config import ApexConfig

    doc = {
        "benchmark": "cartpole_solve",
        "command": "python benchmarks/cartpole_solve.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "load_avg_1m_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        },
        "criterion": {
            "solved_at": SOLVED_AT,
            "eval_episodes": EVAL_EPISODES,
            "eval_interval_s": args.eval_interval_s,
            "budget_s": args.budget_s,
        },
        "cartpole_preset": ApexConfig.preset("cartpole").to_dict(),
        "records": records,
        "summary": summary,
    }
    med = {k: v["median_time_to_solve_s"] for k, v in summary.items()}
    if med.get(base):
        doc["ratio_to_" + base] = {k: (v / med[base] if v else None) for k, v in med.items()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(args.out)
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
