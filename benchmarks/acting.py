"""Batched acting: one env worker's env steps per second with 1 vs N envs.

One :class:`~apex_dask.algo.env_worker.EnvWorker` (the class every env worker
actor wraps) on a MinAtar game with the ``minatar`` preset's network, one
torch thread, runs ``sample()`` (env steps, action selection, n-step adder,
initial priorities) for ``--seconds`` per setting, the settings taking turns in
``--rounds`` windows; the rate is env steps of all its envs per second of
wall time (median window). With ``num_envs = N`` every step makes
one forward pass for the N envs instead of N batch-1 passes.

    python benchmarks/acting.py                       # 1 vs 16 envs, epsilon 0.05
    python benchmarks/acting.py --envs 1 4 8 16 --epsilon 0.4

Prints a table and writes ``benchmarks/results/acting.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import torch  # noqa: E402

from apex_dask.algo.env_worker import EnvWorker  # noqa: E402
from apex_dask.config import ApexConfig  # noqa: E402
from apex_dask.experiment.builder import env_factory, env_worker_kwargs  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "acting.json"


def measure(cfg: ApexConfig, envs: list[int], epsilon: float, seconds: float, rounds: int) -> list:
    """Steps/s of one worker per setting; the settings take turns in ``rounds`` windows
    (so load from other processes drifts over all of them alike); the median window."""
    workers = {}
    for n in envs:
        kwargs = {**env_worker_kwargs(cfg), "num_envs": n}
        workers[n] = EnvWorker(env_factory(cfg), epsilon=epsilon, seed=0, **kwargs)
        workers[n].sample()  # warm-up: makes the other envs, first torch calls
    rates: dict[int, list[float]] = {n: [] for n in envs}
    for _ in range(rounds):
        for n, worker in workers.items():
            steps, t0 = 0, time.perf_counter()
            while (wall := time.perf_counter() - t0) < seconds / rounds:
                steps += worker.sample()["steps"]
            rates[n].append(steps / wall)
    for worker in workers.values():
        worker.close()
    return [
        {"num_envs": n, "steps_per_s": statistics.median(r), "windows": r} for n, r in rates.items()
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", default="MinAtar/Breakout-v1")
    ap.add_argument("--envs", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--epsilon", type=float, default=0.05)
    ap.add_argument("--fragment", type=int, default=50, help="steps of each env per sample()")
    ap.add_argument("--seconds", type=float, default=30.0, help="per setting, all rounds")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = ApexConfig.preset("minatar").override(
        {"env.env_id": args.env, "workers.rollout_fragment_length": args.fragment}
    )
    rows = measure(cfg, args.envs, args.epsilon, args.seconds, args.rounds)
    base = rows[0]["steps_per_s"]
    print(f"{args.env}, epsilon {args.epsilon}, {args.fragment} steps per env per rollout")
    print(f"{'envs':>5} {'steps/s':>9} {'x 1st':>6}")
    for row in rows:
        row["speedup"] = row["steps_per_s"] / base
        print(f"{row['num_envs']:>5} {row['steps_per_s']:>9.0f} {row['speedup']:>6.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "env": args.env,
                "epsilon": args.epsilon,
                "fragment": args.fragment,
                "seconds": args.seconds,
                "rounds": args.rounds,
                "load_avg": os.getloadavg()[0],
                "machine": f"{platform.machine()}, {os.cpu_count()} cores",
                "torch": torch.__version__,
                "rows": rows,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
