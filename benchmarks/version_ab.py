"""This tree against another commit, in one process: the replay cycle, acting and the update.

The other commit's ``apex_dask`` is unpacked (``git archive``) into a temporary folder
as the package ``apex_dask_base`` (its imports renamed), so both versions live in this
process and take turns in short windows of **thread CPU time**: load from other
processes on the machine falls on both alike and cancels out of the ratio.

* **replay cycle**: ``ReplayShard`` with the vector workload of ``benchmarks/replay.py``
  (capacity 2^17, prefilled): sample(512) + update(512) + 10 x add(50);
* **acting**: the DQN ``EnvWorker.sample()`` of a preset (its env, network and
  ``envs_per_worker``), env steps per CPU second;
* **update**: the DQN ``Learner.update`` on one fixed random batch of the preset.

Each version builds its parts with its own config and builder functions, as its own
runs do.

    python benchmarks/version_ab.py --baseline 30e1d41
    python benchmarks/version_ab.py --baseline 30e1d41 --preset cartpole --seconds 60

Prints a table (ratios: this tree / baseline; above 1 is faster for rates, below 1 for
seconds) and writes ``benchmarks/results/version_ab.json``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
BASE = "apex_dask_base"


def unpack_baseline(rev: str, into: Path) -> str:
    """``apex_dask`` of ``rev`` as the package ``apex_dask_base`` under ``into``."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", rev, "apex_dask"],
        capture_output=True,
        check=False,
    )
    if archive.returncode != 0:
        sys.exit(f"version_ab: git archive {rev} failed: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    (into / "apex_dask").rename(into / BASE)
    word = re.compile(r"\bapex_dask\b")
    for path in (into / BASE).rglob("*.py"):
        path.write_text(word.sub(BASE, path.read_text()))
    sha = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", rev], capture_output=True, text=True
    )
    sys.path.insert(0, str(into))
    return sha.stdout.strip()


def _first(pkg: str, *names: str):
    """The first of ``names`` (``module:attr``) that ``pkg`` has: the two layouts differ."""
    for name in names:
        mod, attr = name.split(":")
        try:
            return getattr(importlib.import_module(f"{pkg}.{mod}"), attr)
        except (ImportError, AttributeError):
            continue
    raise ImportError(f"{pkg} has none of {names}")


# -- the three workloads, built by each version's own code ------------------------------

CAPACITY, BATCH, ADD = 2**17, 512, 50


def _vector_batch(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "obs": rng.standard_normal((n, 8)).astype(np.float32),
        "next_obs": rng.standard_normal((n, 8)).astype(np.float32),
        "action": rng.integers(0, 4, n),
        "reward": rng.standard_normal(n).astype(np.float32),
        "done": rng.random(n) < 0.01,
    }


def replay_cycle(pkg: str) -> Callable[[], int]:
    shard_cls = _first(pkg, "algo.replay.shard:ReplayShard", "algo.replay:ReplayShard")
    rng = np.random.default_rng(0)
    shard = shard_cls(CAPACITY, alpha=0.6, eps=1e-6, seed=1)
    for _ in range(CAPACITY // 4096):
        shard.add(_vector_batch(4096, rng), priorities=rng.random(4096) + 0.1)
    adds = [_vector_batch(ADD, rng) for _ in range(10)]
    prios = rng.random(BATCH) + 0.1
    holder: dict = {}

    def cycle() -> int:
        holder["last"] = sample = shard.sample(BATCH, 0.4)
        generations = getattr(sample, "generations", None)
        if generations is not None:
            shard.update_priorities(sample.indices, prios, generations)
        else:
            shard.update_priorities(sample.indices, prios)
        for batch in adds:
            shard.add(batch)
        return 1

    return cycle


def _config(pkg: str, preset: str):
    return importlib.import_module(f"{pkg}.config").ApexConfig.preset(preset)


def acting(pkg: str, preset: str) -> Callable[[], int]:
    builder = importlib.import_module(f"{pkg}.experiment.builder")
    cfg = _config(pkg, preset)
    if hasattr(builder, "worker_spec"):  # the agent-unit layout: one typed spec
        cls = _first(pkg, "algo.agents.dqn.worker:EnvWorker")
        spec = builder.worker_spec(cfg)
        if hasattr(spec.agent, "config"):  # each agent's own config section
            kwargs = {"rollout": spec.rollout, "config": spec.agent.config}
        else:  # an options object mirroring the learner section
            kwargs = {"rollout": spec.rollout, "options": spec.agent.options}
    else:  # the flat layout: keyword arguments through make_env_worker
        cls = _first(pkg, "algo.agents:make_env_worker")
        kwargs = builder.env_worker_kwargs(cfg)
    worker = cls(builder.env_factory(cfg), epsilon=0.05, seed=0, **kwargs)
    worker.sample()

    def sample() -> int:
        out = worker.sample()
        return out["steps"] if isinstance(out, dict) else out.steps

    return sample


def update(pkg: str, preset: str) -> Callable[[], int]:
    builder = importlib.import_module(f"{pkg}.experiment.builder")
    cfg = _config(pkg, preset)
    probe = _first(pkg, "algo.envs.probe:probe_spaces", "algo.env_worker:probe_spaces")
    obs_space, act_space = probe(builder.env_factory(cfg))
    if hasattr(builder, "agent_spec"):
        cls = _first(pkg, "algo.agents.dqn.learner:Learner")
        spec, seed = builder.agent_spec(cfg), builder.learner_seed(cfg)
        if hasattr(spec, "config"):  # the agent's own section and the shared learner section
            learner = cls(obs_space, act_space, spec.config, spec.learner, seed=seed)
        else:
            learner = cls(obs_space, act_space, spec.options, seed=seed)
    else:
        cls = _first(pkg, "algo.agents:make_learner")
        learner = cls(obs_space, act_space, **builder.learner_kwargs(cfg))
    rng = np.random.default_rng(0)
    n = cfg.learner.batch_size
    high = 2 if obs_space.dtype == bool else int(min(obs_space.high.max(), 255)) + 1
    obs = rng.integers(0, high, (2 * n, *obs_space.shape)).astype(obs_space.dtype)
    batch = {
        "obs": obs[:n],
        "next_obs": obs[n:],
        "action": rng.integers(0, act_space.n, n),
        "reward": rng.normal(size=n).astype(np.float32),
        "discount": np.full(n, 0.97, np.float32),
    }
    weights = np.ones(n, np.float32)
    for _ in range(3):
        learner.update(batch, weights)

    def one() -> int:
        learner.update(batch, weights)
        return 1

    return one


# -- measuring ----------------------------------------------------------------------------


def interleaved(work: dict[str, Callable[[], int]], seconds: float, window: float) -> dict:
    """Units per CPU second of each version, in alternating windows of thread CPU time."""
    per: dict[str, list[float]] = {k: [] for k in work}
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        for name, fn in work.items():
            c0, done = time.thread_time(), 0
            while (cpu := time.thread_time() - c0) < window or done == 0:
                done += fn()
            per[name].append(done / cpu)
    ratios = [c / b for b, c in zip(per["baseline"], per["current"], strict=True)]
    return {
        "baseline_per_cpu_s": statistics.median(per["baseline"]),
        "current_per_cpu_s": statistics.median(per["current"]),
        "ratio_current_over_baseline": statistics.median(ratios),
        "ratio_quartiles": [float(q) for q in np.percentile(ratios, [25, 75])],
        "windows": len(ratios),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", required=True, help="a commit (anything git rev-parse takes)")
    ap.add_argument("--preset", default="minatar", choices=["minatar", "cartpole", "atari"])
    ap.add_argument("--seconds", type=float, default=40.0, help="per workload, both versions")
    ap.add_argument("--window", type=float, default=0.5, help="CPU seconds per turn")
    ap.add_argument("--only", nargs="+", default=["replay", "acting", "update"])
    ap.add_argument("--out", type=Path, default=RESULTS / "version_ab.json")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="version_ab-") as tmp:
        sha = unpack_baseline(args.baseline, Path(tmp))
        makers = {
            "replay": ("replay cycle (cycles/s)", lambda pkg: replay_cycle(pkg)),
            "acting": ("acting (env steps/s)", lambda pkg: acting(pkg, args.preset)),
            "update": ("learner update (updates/s)", lambda pkg: update(pkg, args.preset)),
        }
        rows = {}
        for key in args.only:
            label, make = makers[key]
            work = {"baseline": make(BASE), "current": make("apex_dask")}
            rows[key] = {"label": label, **interleaved(work, args.seconds, args.window)}
            r = rows[key]
            print(
                f"{label:<30} baseline {r['baseline_per_cpu_s']:>10.1f}  "
                f"current {r['current_per_cpu_s']:>10.1f}  ratio {r['ratio_current_over_baseline']:.3f}"
                f"  (quartiles {r['ratio_quartiles'][0]:.3f}-{r['ratio_quartiles'][1]:.3f},"
                f" {r['windows']} windows)",
                flush=True,
            )
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "baseline": sha,
        "current": head,
        "preset": args.preset,
        "seconds": args.seconds,
        "python": platform.python_version(),
        "load_avg": os.getloadavg(),
        "rows": rows,
    }
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
