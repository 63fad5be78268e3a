"""The learner's cost per update of each value head, torso and encoder against the plain head.

For a preset's observation shape, network and batch size, one process builds a
CPU learner per setting and times ``Learner.update`` on one fixed random batch
each, in interleaved windows of ``--window`` seconds of the thread's own CPU time
(so the settings share whatever else the machine does alike): one torch thread
and denormals flushed, as the learner thread runs. The median CPU time per update
over the windows, and its ratio to the plain head's, measured in the same run.

Settings (``--preset minatar``: the 16x3x3 conv on 10x10x4 bool frames, 256 units,
batch 128; ``--preset cartpole``: the 128x128 MLP, batch 64):

* ``plain``: the preset (dueling, double Q, Huber);
* ``c51``: ``dqn.num_atoms=51``;
* ``noisy``: ``dqn.noisy=true``;
* ``c51_noisy``: both;
* ``hl_gauss``: ``dqn.loss=hl_gauss`` (51 bins);
* ``layer_norm``: ``dqn.layer_norm=true``;
* ``impala`` (images only): ``dqn.encoder=impala`` (scale 1).

``--baseline REV`` builds every setting a second time from the package as it was at
commit ``REV`` (unpacked as ``apex_dask_base``, as ``benchmarks/version_ab.py`` does), so
the table gives each head's cost before and after a change, in one process, taking turns.

``--agents`` adds each agent's update on its own preset, on a batch its own env worker
collected (real data, fixed): DQN (``minatar``), R2D2 (``minatar`` with ``algo=r2d2``:
its sequence batch of ``r2d2.batch_size`` items, burn-in and unroll included) and DPG
(``pendulum``), each against DQN's.

``--encoders-atari`` adds the IMPALA encoder against the Nature CNN on Atari's
4x84x84 uint8 stacks (256 units, batch ``--atari-batch``, default 64: the IMPALA
ResNet at batch 512 takes seconds per update on one core).

    python benchmarks/head_cost.py --preset minatar --seconds 60
    python benchmarks/head_cost.py --preset cartpole --seconds 30
    python benchmarks/head_cost.py --preset minatar --encoders-atari --seconds 120
    python benchmarks/head_cost.py --preset minatar --only c51 hl_gauss c51_noisy --baseline 00dbff7
    python benchmarks/head_cost.py --preset minatar --only plain --agents --seconds 30

Prints a table and writes ``benchmarks/results/head_cost.json`` (runs kept by preset).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from gymnasium import spaces  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "head_cost.json"
SETTINGS = {
    "plain": {},
    "c51": {"dqn.num_atoms": 51},
    "noisy": {"dqn.noisy": True},
    "c51_noisy": {"dqn.num_atoms": 51, "dqn.noisy": True},
    "hl_gauss": {"dqn.loss": "hl_gauss"},
    "layer_norm": {"dqn.layer_norm": True},
    "impala": {"dqn.encoder": "impala"},
}
SPACES = {
    "minatar": (spaces.Box(0, 1, (10, 10, 4), bool), spaces.Discrete(6)),
    "cartpole": (spaces.Box(-5, 5, (4,), np.float32), spaces.Discrete(2)),
    "atari": (spaces.Box(0, 255, (4, 84, 84), np.uint8), spaces.Discrete(6)),
}


def batch(space: spaces.Box, n: int, n_actions: int, rng: np.random.Generator) -> dict:
    def obs() -> np.ndarray:
        if space.dtype == bool:
            return rng.random((n, *space.shape)) < 0.1
        if space.dtype == np.uint8:
            return rng.integers(0, 256, (n, *space.shape), dtype=np.uint8)
        return rng.normal(size=(n, *space.shape)).astype(np.float32)

    return {
        "obs": obs(),
        "next_obs": obs(),
        "action": rng.integers(0, n_actions, n),
        "reward": rng.normal(size=n).astype(np.float32),
        "discount": np.full(n, 0.97, np.float32),
    }


def make(
    preset: str, overrides: dict, shape_key: str, batch_size: int | None, pkg: str = "apex_dask"
) -> tuple:
    registry = importlib.import_module(f"{pkg}.algo.agents.registry")
    config = importlib.import_module(f"{pkg}.config")
    builder = importlib.import_module(f"{pkg}.experiment.builder")
    cfg = config.ApexConfig.preset(preset).override({"learner.device": "cpu", **overrides})
    obs_space, act_space = SPACES[shape_key]
    learner = registry.make_learner(builder.agent_spec(cfg), obs_space, act_space, seed=0)
    n = batch_size or cfg.learner.batch_size
    data = batch(obs_space, n, int(act_space.n), np.random.default_rng(0))
    return learner, data, np.ones(n, np.float32), n


AGENTS = {
    "dqn": ("minatar", {}),
    "r2d2": ("minatar", {"algo": "r2d2"}),
    "dpg": ("pendulum", {}),
}
"""``--agents``: each agent's update on a preset it runs."""


def make_agent(algo: str) -> tuple:
    """The agent's learner and one batch of ``batch_size`` items from its own env worker."""
    from apex_dask.algo.agents.registry import make_env_worker, make_learner
    from apex_dask.algo.envs.probe import probe_spaces
    from apex_dask.config import ApexConfig
    from apex_dask.experiment.builder import agent_spec, env_factory, worker_spec

    preset, over = AGENTS[algo]
    cfg = ApexConfig.preset(preset).override({"learner.device": "cpu", **over})
    factory = env_factory(cfg)
    obs_space, act_space = probe_spaces(factory)
    learner = make_learner(agent_spec(cfg), obs_space, act_space, seed=0)
    worker = make_env_worker(worker_spec(cfg), factory, exploration=0.5, seed=0)
    n = cfg.learner.batch_size  # items: transitions, or R2D2's sequences
    parts: list[dict] = []
    have = 0
    while have < n:
        out = worker.sample()
        if len(out):
            parts.append(out.batch)
            have += len(out)
    worker.close()
    keys = parts[0].keys()
    data = {k: np.concatenate([p[k] for p in parts])[:n] for k in keys}
    return learner, data, np.ones(n, np.float32), n


def measure(learners: dict, seconds: float, window: float) -> dict[str, dict]:
    """Interleaved windows of thread CPU time; the median CPU seconds per update."""
    per: dict[str, list[float]] = {k: [] for k in learners}
    for lr, data, w, _ in learners.values():  # warm up (allocations, first-call costs)
        for _ in range(3):
            lr.update(data, w)
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        for name, (lr, data, w, _) in learners.items():
            n, t0 = 0, time.thread_time()
            while time.thread_time() - t0 < window or n == 0:
                lr.update(data, w)
                n += 1
            per[name].append((time.thread_time() - t0) / n)
    return {
        name: {
            "cpu_s_per_update": statistics.median(v),
            "windows": len(v),
            "batch_size": learners[name][3],
            "params": _params(learners[name][0]),
        }
        for name, v in per.items()
    }


def _params(learner) -> int:
    nets = [getattr(learner, k) for k in ("online", "actor", "critic") if hasattr(learner, k)]
    return sum(p.numel() for net in nets for p in net.parameters())


def table(title: str, rows: dict[str, dict], base: str) -> None:
    print(f"\n{title}")
    print(f"{'setting':12s} {'params':>10s} {'batch':>5s} {'ms/update':>10s} "
          f"{'updates/s':>10s} {'x ' + base:>10s}")  # fmt: skip
    ref = rows[base]["cpu_s_per_update"]
    for name, r in rows.items():
        s = r["cpu_s_per_update"]
        r["ratio"] = s / ref
        print(f"{name:12s} {r['params']:>10,d} {r['batch_size']:>5d} {s * 1e3:10.2f} "
              f"{1 / s:10.1f} {s / ref:10.2f}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", choices=["minatar", "cartpole"], default="minatar")
    p.add_argument("--seconds", type=float, default=60.0, help="interleaved timing per group")
    p.add_argument("--window", type=float, default=0.5, help="CPU seconds per window")
    p.add_argument("--only", nargs="+", choices=list(SETTINGS), help="a subset of the settings")
    p.add_argument("--encoders-atari", action="store_true", help="IMPALA vs Nature on 4x84x84")
    p.add_argument("--atari-batch", type=int, default=64)
    p.add_argument("--baseline", default=None, help="a commit: each setting before and after")
    p.add_argument("--agents", action="store_true", help="each agent's update on its preset")
    p.add_argument("--json", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)  # as the learner thread
    names = args.only or list(SETTINGS)
    if args.preset == "cartpole":
        names = [n for n in names if n != "impala"]
    if "plain" not in names:
        names.insert(0, "plain")
    heads = {n: make(args.preset, SETTINGS[n], args.preset, None) for n in names}
    base = None
    if args.baseline:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from version_ab import BASE, unpack_baseline

        tmp = tempfile.mkdtemp(prefix="head_cost_base_")
        base = unpack_baseline(args.baseline, Path(tmp))
        # each setting of the baseline right after its own: before / after side by side
        heads = {
            key: value
            for n in names
            for key, value in (
                (f"{n}@{base}", make(args.preset, SETTINGS[n], args.preset, None, BASE)),
                (n, heads[n]),
            )
        }
    doc = {
        "command": "python benchmarks/head_cost.py " + " ".join(argv or sys.argv[1:]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "load_1m": round(os.getloadavg()[0], 2),
        },
    }
    doc["heads"] = measure(heads, args.seconds, args.window)
    table(f"{args.preset}: CPU time per update, one thread", doc["heads"], "plain")
    if base is not None:
        doc["baseline"] = base
        print(f"\nbefore ({base}) / after (this tree), CPU time per update")
        for n in names:
            before = doc["heads"][f"{n}@{base}"]["cpu_s_per_update"]
            after = doc["heads"][n]["cpu_s_per_update"]
            doc["heads"][n]["x_baseline"] = after / before
            print(
                f"{n:12s} {before * 1e3:8.2f} ms -> {after * 1e3:8.2f} ms  ({after / before:.2f}x)"
            )
    if args.agents:
        doc["agents"] = measure({a: make_agent(a) for a in AGENTS}, args.seconds, args.window)
        for a, (preset, over) in AGENTS.items():
            doc["agents"][a].update(preset=preset, overrides=over)
        table("each agent's update on its preset's batch, one thread", doc["agents"], "dqn")
    if args.encoders_atari:
        enc = {
            "nature": make("atari", {}, "atari", args.atari_batch),
            "impala": make("atari", SETTINGS["impala"], "atari", args.atari_batch),
        }
        doc["atari_encoders"] = measure(enc, args.seconds, args.window)
        table("atari 4x84x84: IMPALA against the Nature CNN", doc["atari_encoders"], "nature")
    doc["machine"]["load_1m_end"] = round(os.getloadavg()[0], 2)
    old = json.loads(args.json.read_text()) if args.json.exists() else {"runs": {}}
    old.setdefault("runs", {})[args.preset] = doc
    args.json.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.json.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(old, indent=2) + "\n")
    tmp.replace(args.json)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
