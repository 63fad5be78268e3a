"""Acting at the env's own speed: one env worker against the limits of its env and network.

For a preset (``--preset atari|minatar|cartpole``, its env and network) and
each ``envs_per_worker`` setting N, in one process with one torch thread:

* **env**: the worker's N envs stepped alone with random actions (episode ends
  and resets included): the env's limit, env steps/s;
* **forward**: a bare batched forward pass of the preset's network at batch N
  (``EnvWorker.q_values``): the network's limit, N states per pass, states/s;
* **combined**: 1 / (1/env + 1/forward), the best an actor that steps and
  then acts in turn can do;
* **worker**: :class:`~apex_dask.algo.env_worker.EnvWorker` ``sample()`` (acting,
  n-step transitions, initial priorities, the compact frame form), env steps/s;
* per CPU-second: the same counts over the CPU time of the process (all its
  threads, ale-py's too), in the JSON (``per_cpu_s``): what a core does when
  other processes take turns on it;
* **double**: the same worker with double buffering (``workers.double_buffer``:
  two lanes of native envs, one stepping while the network acts for the other),
  for settings where it applies (``--double-buffer both``, the default; ``on`` or
  ``off`` measure only that one as **worker**). ``double / worker`` is the median
  of the per-round ratios (adjacent windows: load from other processes falls on
  both alike).

Every measurement of every setting takes turns in ``--rounds`` windows (so
load from other processes falls on all alike); a rate is the median window.

    python benchmarks/acting.py --preset atari --envs 1 8
    python benchmarks/acting.py --preset minatar --envs 1 16
    python benchmarks/acting.py --preset atari --vector-mode sync --out /tmp/sync.json
    taskset -c 0 python benchmarks/acting.py --preset atari --envs 8 --seconds 12 --rounds 12

Prints a table and writes ``benchmarks/results/acting_<preset>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from apex_dask.algo.env_worker import EnvWorker  # noqa: E402
from apex_dask.config import ApexConfig  # noqa: E402
from apex_dask.experiment.builder import env_factory, env_worker_kwargs  # noqa: E402

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
        return worker.sample()["steps"]

    return {"env": env_only, "forward": forward, "worker": sample}


def measure(
    cfg: ApexConfig, envs: list[int], epsilon: float, seconds: float, rounds: int, double: str
) -> list:
    """Rates per setting and measurement, all taking turns in ``rounds`` windows."""
    rng = np.random.default_rng(0)
    kinds: dict[tuple[int, str], Callable[[], int]] = {}
    workers = []
    for n in envs:
        kwargs = {**env_worker_kwargs(cfg), "num_envs": n, "double_buffer": double == "on"}
        worker = EnvWorker(env_factory(cfg), epsilon=epsilon, seed=0, **kwargs)
        worker.sample()  # warm-up: makes the other envs, first torch calls
        # the env-alone probe steps a twin, so the worker's own episodes stay whole
        twin_kwargs = {**kwargs, "double_buffer": False}  # one vector env of all n
        twin = EnvWorker(env_factory(cfg), epsilon=epsilon, seed=1, **twin_kwargs)
        probes = _probes(twin, rng)
        kinds[(n, "env")], kinds[(n, "forward")] = probes["env"], probes["forward"]
        kinds[(n, "worker")] = _probes(worker, rng)["worker"]
        workers += [worker, twin]
        if double == "both":
            lanes = EnvWorker(
                env_factory(cfg), epsilon=epsilon, seed=0, **{**kwargs, "double_buffer": True}
            )
            workers.append(lanes)
            if lanes.double_buffer:  # native envs, n >= 2
                lanes.sample()
                kinds[(n, "double")] = _probes(lanes, rng)["worker"]
    window = seconds / rounds
    rates: dict[tuple[int, str], list[float]] = {key: [] for key in kinds}
    per_cpu: dict[tuple[int, str], list[float]] = {key: [] for key in kinds}
    for _ in range(rounds):
        for key, work in kinds.items():
            done, t0, c0 = 0, time.perf_counter(), time.process_time()
            while (wall := time.perf_counter() - t0) < window:
                done += work()
            rates[key].append(done / wall)
            per_cpu[key].append(done / max(time.process_time() - c0, 1e-9))  # all threads
    for worker in workers:
        worker.close()
    rows = []
    for n in envs:
        env, fwd, act = (statistics.median(rates[(n, k)]) for k in ("env", "forward", "worker"))
        combined = 1.0 / (1.0 / env + 1.0 / fwd)
        row = {
            "num_envs": n,
            "env_steps_per_s": env,
            "forward_states_per_s": fwd,
            "combined_limit": combined,
            "worker_steps_per_s": act,
            "worker_of_combined": act / combined,
            "windows": {k: r for (m, k), r in rates.items() if m == n},
            "per_cpu_s": {k: statistics.median(r) for (m, k), r in per_cpu.items() if m == n},
        }
        if (n, "double") in rates:
            dbl = rates[(n, "double")]
            pairs = [d / w for d, w in zip(dbl, rates[(n, "worker")], strict=True)]
            row["double_steps_per_s"] = statistics.median(dbl)
            row["double_of_combined"] = row["double_steps_per_s"] / combined
            row["double_over_worker"] = statistics.median(pairs)
            row["double_over_worker_rounds"] = pairs
        rows.append(row)
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
    ap.add_argument(
        "--double-buffer",
        choices=["both", "on", "off"],
        default="both",
        help="both: measure the worker with and without it (native envs, >= 2 of them)",
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
    load = os.getloadavg()[0]
    rows = measure(cfg, envs, args.epsilon, args.seconds, args.rounds, args.double_buffer)
    mode, cores = cfg.workers.vector_mode, len(os.sched_getaffinity(0))
    print(
        f"{cfg.env.env_id} ({args.preset}, {mode}), epsilon {args.epsilon}, one torch thread, "
        f"{cores} cores allowed, load average {load:.1f} -> {os.getloadavg()[0]:.1f}"
    )
    head = f"{'envs':>5} {'env':>8} {'forward':>9} {'combined':>9} {'worker':>8}"
    print(f"{head} {'of comb.':>8} {'x 1st':>6} {'double':>8} {'dbl/wkr':>8}")
    for r in rows:
        dbl = (
            f"{r['double_steps_per_s']:>8.0f} {r['double_over_worker']:>8.2f}"
            if "double_steps_per_s" in r
            else f"{'-':>8} {'-':>8}"
        )
        print(
            f"{r['num_envs']:>5} {r['env_steps_per_s']:>8.0f} {r['forward_states_per_s']:>9.0f} "
            f"{r['combined_limit']:>9.0f} {r['worker_steps_per_s']:>8.0f} "
            f"{r['worker_of_combined']:>8.2f} {r['worker_x_first']:>6.2f} {dbl}"
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
        "double_buffer": args.double_buffer,
        "cores_allowed": cores,
        "load_avg": [load, os.getloadavg()[0]],
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "torch": torch.__version__,
    }
    out.write_text(json.dumps({**meta, "rows": rows}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
