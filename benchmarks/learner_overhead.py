"""How much slower the learner's update is inside a Dask run than in a plain loop.

For a preset's network and batch size (``minatar``: the 16x3x3 CNN on 10x10x4
bool frames, batch 128; ``atari``: the Nature CNN on 4x84x84 uint8 stacks,
batch 512):

1. **plain**: ``Learner.update`` on one fixed random batch, in a loop, one
   torch thread, nothing else in the process: seconds per update (median of
   windows).
2. **dask**: ``train()`` on a ``LocalCluster`` (one worker process
   per core, one thread each) for ``--seconds``, env workers paced by
   ``learner.min_replay_ratio`` so they do not flood the machine; the
   ``learner/grad_s`` of the last result dicts (the same update, timed by the
   learner thread inside the run), with ``learner/busy_frac`` and
   ``learner/updates_per_s``.

Then the plain loop once more beside a CPU-bound process, and
``learner/grad_cpu_s`` (the learner thread's CPU time per update in the run):
together they split the in-run time into waiting for a core (grad_s minus
grad_cpu_s) and each op running slower on a shared machine (grad_cpu_s
against plain).

The ratio dask / plain is the runtime's overhead on the update itself
(target <= 1.3). ``--placement`` moves the shards (``learner_process`` |
``learner_host`` | ``spread``) to compare where they should live;
``--switch-interval`` sets ``sys.setswitchinterval`` in every worker process
(how long a thread may hold the GIL before another that waits gets it).

    python benchmarks/learner_overhead.py --preset minatar --seconds 120
    python benchmarks/learner_overhead.py --preset minatar --placement spread
    python benchmarks/learner_overhead.py --preset atari --seconds 300 --skip-dask
    git show REV:apex_dask/algo/agents/dqn/learner.py > /tmp/learner_rev.py
    python benchmarks/learner_overhead.py --preset minatar --baseline-learner /tmp/learner_rev.py

``--baseline-learner`` times another version's ``Learner.update`` against this
tree's in one process, in interleaved 0.5 s windows of thread CPU time, for
``--plain-seconds``, and prints the ratio (current / baseline).

Prints a table and writes ``benchmarks/results/learner_overhead.json``
(runs append by preset and placement).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402

from apex_dask.algo.agents.dqn.learner import Learner  # noqa: E402
from apex_dask.algo.envs.probe import probe_spaces  # noqa: E402
from apex_dask.config import ApexConfig  # noqa: E402
from apex_dask.experiment.builder import agent_spec, env_factory, learner_seed  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "learner_overhead.json"

# Scaled to one machine: a small replay, few env workers, paced to the learner.
DASK_OVERRIDES = {
    "minatar": {
        "replay.capacity": 100_000,
        "replay.learning_starts": 2_000,
        "workers.num_workers": 2,
        "learner.min_replay_ratio": 2.0,
        "eval.episodes": 0,
        "report.min_iter_time_s": 10.0,
        "report.timesteps_per_iteration": 1,
        "checkpoint.interval_s": 0.0,
    },
    "atari": {
        "replay.capacity": 50_000,
        "replay.num_shards": 2,
        "replay.learning_starts": 5_000,
        "workers.num_workers": 2,
        "workers.envs_per_worker": 4,
        "learner.min_replay_ratio": 4.0,
        "eval.episodes": 0,
        "report.min_iter_time_s": 15.0,
        "report.timesteps_per_iteration": 1,
        "checkpoint.interval_s": 0.0,
    },
}


def random_batch(obs_space, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    high = 2 if obs_space.dtype == bool else int(min(obs_space.high.max(), 255)) + 1
    obs = rng.integers(0, high, (2 * n, *obs_space.shape)).astype(obs_space.dtype)
    return {
        "obs": obs[:n],
        "next_obs": obs[n:],
        "action": rng.integers(0, 3, n),
        "reward": rng.normal(size=n).astype(np.float32),
        "discount": np.full(n, 0.97, np.float32),
    }


def plain_update_s(cfg: ApexConfig, seconds: float) -> dict[str, float]:
    torch.set_num_threads(1)
    obs_space, act_space = probe_spaces(env_factory(cfg))
    spec = agent_spec(cfg)
    learner = Learner(obs_space, act_space, spec.config, spec.learner, seed=learner_seed(cfg))
    batch = random_batch(obs_space, cfg.learner.batch_size, np.random.default_rng(0))
    weights = np.ones(cfg.learner.batch_size, np.float32)
    for _ in range(3):
        learner.update(batch, weights)
    windows: list[float] = []
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        t0, k = time.perf_counter(), 0
        while k < 5 or time.perf_counter() - t0 < 0.5:
            learner.update(batch, weights)
            k += 1
        windows.append((time.perf_counter() - t0) / k)
    return {"update_s": statistics.median(windows), "min_update_s": min(windows)}


def load_learner_class(path: Path) -> type:
    """``Learner`` from another version's ``algo/agents/dqn/learner.py`` (its imports resolve to this tree)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("baseline_learner", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Learner


def against_baseline(cfg: ApexConfig, path: Path, seconds: float) -> dict[str, float]:
    """CPU seconds per ``update`` of this tree's ``Learner`` and of the one in ``path``, in
    interleaved windows of 0.5 s on the same batch, in this process (thread CPU time:
    what other load on the machine does to wall time cancels out of the ratio)."""
    torch.set_num_threads(1)
    obs_space, act_space = probe_spaces(env_factory(cfg))
    spec, seed = agent_spec(cfg), learner_seed(cfg)
    learners = {
        "baseline": load_learner_class(path)(obs_space, act_space, spec.config, seed=seed),
        "current": Learner(obs_space, act_space, spec.config, spec.learner, seed=seed),
    }
    batch = random_batch(obs_space, cfg.learner.batch_size, np.random.default_rng(0))
    weights = np.ones(cfg.learner.batch_size, np.float32)
    per: dict[str, list[float]] = {k: [] for k in learners}
    for lr in learners.values():
        for _ in range(3):
            lr.update(batch, weights)
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        for name, lr in learners.items():
            c0, k = time.thread_time(), 0
            while k < 3 or time.thread_time() - c0 < 0.5:
                lr.update(batch, weights)
                k += 1
            per[name].append((time.thread_time() - c0) / k)
    ratios = [c / b for b, c in zip(per["baseline"], per["current"], strict=True)]
    return {
        "baseline_cpu_s": statistics.median(per["baseline"]),
        "current_cpu_s": statistics.median(per["current"]),
        "ratio_current_over_baseline": statistics.median(ratios),
        "windows": len(ratios),
    }


def plain_beside_a_busy_core(cfg: ApexConfig, seconds: float) -> dict[str, float]:
    """The plain loop again while a CPU-bound process (``while True: pass``) runs:
    what sharing the machine costs the update with no Dask in the process."""
    import subprocess
    import sys

    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        return plain_update_s(cfg, seconds)
    finally:
        hog.kill()
        hog.wait()


def _set_switch_interval(seconds: float) -> float:
    import sys

    sys.setswitchinterval(seconds)
    return sys.getswitchinterval()


def dask_grad_s(cfg: ApexConfig, seconds: float, switch_interval: float | None) -> dict:
    from distributed import Client, LocalCluster

    from apex_dask.runtime.orchestration.driver import train

    n = os.cpu_count() or 2
    with LocalCluster(n_workers=n, threads_per_worker=1, dashboard_address=":0") as cluster:
        with Client(cluster, direct_to_workers=True) as client:
            if switch_interval is not None:  # every worker process, the learner's included
                client.run(_set_switch_interval, switch_interval)
            results = train(cfg, client, stop={"time_s": seconds})
    last = [r for r in results if r["learner/updates"] > 0][-3:]
    if not last:
        return {"grad_s": math.nan}
    keys = (
        "learner/grad_s",
        "learner/grad_cpu_s",
        "learner/busy_frac",
        "learner/updates_per_s",
        "env/steps_per_s",
    )
    return {k.split("/")[-1]: statistics.mean(r[k] for r in last) for k in keys}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=sorted(DASK_OVERRIDES), default="minatar")
    ap.add_argument("--seconds", type=float, default=120.0, help="wall time of the Dask run")
    ap.add_argument("--plain-seconds", type=float, default=20.0)
    ap.add_argument("--placement", default="learner_process")
    ap.add_argument("--skip-dask", action="store_true")
    ap.add_argument(
        "--switch-interval",
        type=float,
        default=None,
        help="sys.setswitchinterval in the worker processes (CPython's default: 0.005)",
    )
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--label", default="", help="appended to this run's key in the JSON file")
    ap.add_argument(
        "--baseline-learner",
        type=Path,
        default=None,
        help="another version's algo/agents/dqn/learner.py (e.g. from git show REV:...): its update's "
        "CPU time against this tree's, interleaved, then exit",
    )
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    extra = {k: yaml.safe_load(v) for k, v in (kv.split("=", 1) for kv in args.set)}
    cfg = ApexConfig.preset(args.preset).override(
        {**DASK_OVERRIDES[args.preset], "replay.placement": args.placement, **extra}
    )
    if args.baseline_learner is not None:
        res = against_baseline(cfg, args.baseline_learner, args.plain_seconds)
        print(f"{'preset':<8} {'batch':>5} {'baseline CPU ms':>16} {'current CPU ms':>15} "
              f"{'ratio':>6} {'windows':>7}")  # fmt: skip
        print(f"{args.preset:<8} {cfg.learner.batch_size:>5} {1e3 * res['baseline_cpu_s']:>16.2f} "
              f"{1e3 * res['current_cpu_s']:>15.2f} {res['ratio_current_over_baseline']:>6.3f} "
              f"{res['windows']:>7}")  # fmt: skip
        runs = json.loads(args.out.read_text()) if args.out.exists() else {}
        res["load_avg"] = os.getloadavg()[0]
        runs[f"{args.preset}/against-baseline{args.label}"] = res
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(runs, indent=2) + "\n")
        print(f"wrote {args.out}")
        return
    row: dict[str, object] = {
        "preset": args.preset,
        "placement": args.placement,
        "switch_interval": args.switch_interval,
        "overrides": extra,
        "batch_size": cfg.learner.batch_size,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "load_avg_before": os.getloadavg()[0],
        "plain": plain_update_s(cfg, args.plain_seconds),
        "plain_beside_busy_core": plain_beside_a_busy_core(cfg, args.plain_seconds),
    }
    if not args.skip_dask:
        row["dask"] = dask_grad_s(cfg, args.seconds, args.switch_interval)
        row["ratio"] = row["dask"]["grad_s"] / row["plain"]["update_s"]
    plain_ms = 1e3 * row["plain"]["update_s"]
    busy_ms = 1e3 * row["plain_beside_busy_core"]["update_s"]
    print(f"plain loop beside a busy core: {busy_ms:.1f} ms per update")
    print(
        f"{'preset':<8} {'placement':<16} {'batch':>5} {'plain ms':>9} {'dask ms':>8} {'ratio':>6}"
    )
    dask_ms = 1e3 * row["dask"]["grad_s"] if "dask" in row else math.nan
    ratio = row.get("ratio", math.nan)
    print(
        f"{args.preset:<8} {args.placement:<16} {row['batch_size']:>5} {plain_ms:>9.1f} "
        f"{dask_ms:>8.1f} {ratio:>6.2f}"
    )
    if "dask" in row:
        d = row["dask"]
        print(
            f"update CPU {1e3 * d['grad_cpu_s']:.1f} ms, busy {d['busy_frac']:.2f}, "
            f"{d['updates_per_s']:.1f} updates/s, {d['steps_per_s']:.0f} env steps/s"
        )
    runs = json.loads(args.out.read_text()) if args.out.exists() else {}
    runs[f"{args.preset}/{args.placement}/switch={args.switch_interval}{args.label}"] = row
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(runs, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
