"""Acting at the env's own speed: one env worker against the limits of its env and network.

For a preset (``--preset atari|minatar|cartpole``, its env and network) and
each ``envs_per_worker`` setting N, in one process with one torch thread:

* **env**: the worker's N envs stepped alone with random actions (episode ends
  and resets included): the env's limit, env steps/s;
* **forward**: a bare batched forward pass of the preset's network at batch N
  (``EnvWorker.q_values``): the network's limit, N states per pass, states/s;
* **combined**: 1 / (1/env + 1/forward), the best an actor that steps and
  then acts in turn can do;
* **worker**: :class:`~apex_dask.algo.agents.dqn.worker.EnvWorker` ``sample()`` (acting,
  n-step transitions, initial priorities, the compact frame form), env steps/s.

Every measurement of every setting takes turns in ``--rounds`` windows (so
load from other processes falls on all alike); a rate is the median window.

    python benchmarks/acting.py --preset atari --envs 1 8
    python benchmarks/acting.py --preset minatar --envs 1 16
    python benchmarks/acting.py --preset atari --vector-mode sync --out /tmp/sync.json

Prints a table and writes ``benchmarks/results/acting_<preset>.json``.
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
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from apex_dask.algo.agents.dqn.worker import EnvWorker  # noqa: E402
from apex_dask.config import ApexConfig  # noqa: E402
from apex_dask.experiment.builder import env_factory, worker_spec  # noqa: E402

RESULTS = Path(__file__).parent / "results"
DEFAULT_ENVS = {"atari": [1, 8], "minatar": [1, 16], "cartpole": [1, 8]}


def _probes(worker: EnvWorker, rng: np.random.Generator) -> dict[str, Callable[[], int]]:
    """One unit of work per measurement; each returns the env steps (or states) it made."""
    n = worker.num_envs
    envs = worker._envs  # the worker's own envs, stepped without acting
    obs = envs.reset()

    def env_only() -> int:
        for _ in range(10):
            envs.step(rng.integers(worker.num_actions, size=n))
        return 10 * n

    def forward() -> int:
        for _ in range(10):
            worker.q_values(obs)
        return 10 * n

    def sample() -> int:
        return worker.sample().steps

    return {"env": env_only, "forward": forward, "worker": sample}


def measure(cfg: ApexConfig, envs: list[int], epsilon: float, seconds: float, rounds: int) -> list:
    """Rates per setting and measurement, all taking turns in ``rounds`` windows."""
    rng = np.random.default_rng(0)
    kinds: dict[tuple[int, str], Callable[[], int]] = {}
    workers = []
    for n in envs:
        spec = worker_spec(cfg)
        kwargs = {"rollout": replace(spec.rollout, num_envs=n), "config": spec.agent.config}
        worker = EnvWorker(env_factory(cfg), epsilon=epsilon, seed=0, **kwargs)
        worker.sample()  # warm-up: makes the other envs, first torch calls
        # the env-alone probe steps a twin, so the worker's own episodes stay whole
        twin = EnvWorker(env_factory(cfg), epsilon=epsilon, seed=1, **kwargs)
        probes = _probes(twin, rng)
        kinds[(n, "env")], kinds[(n, "forward")] = probes["env"], probes["forward"]
        kinds[(n, "worker")] = _probes(worker, rng)["worker"]
        workers += [worker, twin]
    window = seconds / rounds
    rates: dict[tuple[int, str], list[float]] = {key: [] for key in kinds}
    for _ in range(rounds):
        for key, work in kinds.items():
            done, t0 = 0, time.perf_counter()
            while (wall := time.perf_counter() - t0) < window:
                done += work()
            rates[key].append(done / wall)
    for worker in workers:
        worker.close()
    rows = []
    for n in envs:
        env, fwd, act = (statistics.median(rates[(n, k)]) for k in ("env", "forward", "worker"))
        combined = 1.0 / (1.0 / env + 1.0 / fwd)
        rows.append(
            {
                "num_envs": n,
                "env_steps_per_s": env,
                "forward_states_per_s": fwd,
                "combined_limit": combined,
                "worker_steps_per_s": act,
                "worker_of_combined": act / combined,
                "windows": {k: rates[(n, k)] for k in ("env", "forward", "worker")},
            }
        )
    base = rows[0]["worker_steps_per_s"]
    for row in rows:
        row["worker_x_first"] = row["worker_steps_per_s"] / base
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=sorted(DEFAULT_ENVS), default="minatar")
    ap.add_argument("--env", default=None, help="env id (default: the preset's)")
    ap.add_argument("--envs", type=int, nargs="+", default=None, help="envs_per_worker settings")
    ap.add_argument("--epsilon", type=float, default=0.05)
    ap.add_argument("--fragment", type=int, default=50, help="steps of each env per sample()")
    ap.add_argument("--seconds", type=float, default=30.0, help="per measurement, all rounds")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument(
        "--vector-mode", choices=["native", "sync"], default=None, help="default: the preset's"
    )
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    over = {"workers.rollout_fragment_length": args.fragment}
    if args.env:
        over["env.env_id"] = args.env
    if args.vector_mode:
        over["workers.vector_mode"] = args.vector_mode
    cfg = ApexConfig.preset(args.preset).override(over)
    envs = args.envs or DEFAULT_ENVS[args.preset]
    rows = measure(cfg, envs, args.epsilon, args.seconds, args.rounds)
    mode = cfg.workers.vector_mode
    print(f"{cfg.env.env_id} ({args.preset}, {mode}), epsilon {args.epsilon}, one torch thread")
    head = f"{'envs':>5} {'env':>8} {'forward':>9} {'combined':>9} {'worker':>8}"
    print(f"{head} {'of comb.':>8} {'x 1st':>6}")
    for r in rows:
        print(
            f"{r['num_envs']:>5} {r['env_steps_per_s']:>8.0f} {r['forward_states_per_s']:>9.0f} "
            f"{r['combined_limit']:>9.0f} {r['worker_steps_per_s']:>8.0f} "
            f"{r['worker_of_combined']:>8.2f} {r['worker_x_first']:>6.2f}"
        )
    out = args.out or RESULTS / f"acting_{args.preset}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "preset": args.preset,
        "env": cfg.env.env_id,
        "vector_mode": mode,
        "epsilon": args.epsilon,
        "fragment": args.fragment,
        "seconds": args.seconds,
        "rounds": args.rounds,
        "load_avg": os.getloadavg()[0],
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "cpus_allowed": sorted(os.sched_getaffinity(0)),  # [0]: pinned, e.g. taskset -c 0
        "command": " ".join(["python", *sys.argv]),
        "torch": torch.__version__,
    }
    out.write_text(json.dumps({**meta, "rows": rows}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
