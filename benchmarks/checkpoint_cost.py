"""What a checkpoint costs: the learner's pause, the shard's pause, bytes and write rate.

    OPENBLAS_NUM_THREADS=1 python benchmarks/checkpoint_cost.py [--quick] [--dir PATH] [--out PATH]

For each workload a full replay shard and a learner are built in this
process, then checkpointed the way the Dask actors do it:

- learner pause: ``Learner.state_dict()`` under its model lock (the training
  thread waits only for this copy; the file is written after);
- shard pause: ``ReplayShard.state_dict()`` (a snapshot copy; the actor's
  event loop is busy for this long), then ``write_part`` from a thread while
  this thread keeps adding rollouts to the shard (adds/s measured during the
  write, against adds/s without a write);
- bytes written and the write rate, against ``dd`` writing as many bytes to
  the same folder (``conv=fsync``).

Workloads: ``minatar`` (the preset's replay: 400,000 items over 2 shards,
(10, 10, 4) uint8 observations; one shard of 200,000 here) and ``atari``
(2^17 items of (4, 84, 84) uint8 frame stacks with ``frame_stack=4``, each
frame stored once). ``--quick`` shrinks both 8x. Target: the learner pauses
at most 1 s per checkpoint whatever the replay size, and the write rate is
within 2x of dd.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch
from gymnasium import spaces

from apex_dask.algo.agents.config import LearnerConfig
from apex_dask.algo.agents.dqn.config import DQNConfig
from apex_dask.algo.agents.dqn.learner import Learner
from apex_dask.algo.replay.shard import ReplayShard
from apex_dask.experiment.checkpoints.store import write_part

OUT = Path(__file__).parent / "results" / "checkpoint_cost.json"


def minatar_batch(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    obs = rng.integers(0, 2, size=(n + 1, 10, 10, 4), dtype=np.uint8)
    return {
        "obs": obs[:-1],
        "action": rng.integers(0, 3, n).astype(np.int64),
        "reward": rng.normal(size=n).astype(np.float32),
        "next_obs": obs[1:],
        "done": np.zeros(n, bool),
        "discount": np.full(n, 0.97, np.float32),
    }


def atari_batch(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    frames = rng.integers(0, 255, size=(n + 6, 84, 84), dtype=np.uint8)
    stacks = np.stack([frames[i : i + 4] for i in range(n + 3)])
    return {
        "obs": stacks[:n],
        "action": rng.integers(0, 6, n).astype(np.int64),
        "reward": rng.normal(size=n).astype(np.float32),
        "next_obs": stacks[3 : n + 3],
        "done": np.zeros(n, bool),
        "discount": np.full(n, 0.97**3, np.float32),
    }


def dd_rate(directory: Path, nbytes: int) -> float:
    """Bytes/s of ``dd`` writing ``nbytes`` of zeros to ``directory`` with an fsync."""
    target = directory / "dd.bin"
    mb = max(1, nbytes // (1 << 20))
    t0 = time.perf_counter()
    subprocess.run(
        ["dd", "if=/dev/zero", f"of={target}", "bs=1M", f"count={mb}", "conv=fsync"],
        check=True,
        capture_output=True,
    )
    rate = mb * (1 << 20) / (time.perf_counter() - t0)
    target.unlink()
    return rate


def measure(name: str, capacity: int, make, obs_space, frame_stack, directory: Path) -> dict:
    rng = np.random.default_rng(0)
    shard = ReplayShard(capacity, seed=0, frame_stack=frame_stack)
    fragment = make(50, rng)
    while len(shard) < capacity:
        shard.add(make(50, rng), rng.random(50) + 0.1)
    learner = Learner(
        obs_space, spaces.Discrete(6), DQNConfig(hiddens=(256,)), LearnerConfig(device="cpu")
    )

    t0 = time.perf_counter()
    state = learner.state_dict()
    learner_pause = time.perf_counter() - t0
    learner_entry = write_part(directory, "learner", state)

    # adds/s with no checkpoint being written
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < 1.0:
        shard.add(fragment)
        n += 1
    adds_idle = n / (time.perf_counter() - t0)

    t0 = time.perf_counter()
    snapshot = shard.state_dict()
    shard_pause = time.perf_counter() - t0
    result: dict = {}

    def write() -> None:
        t = time.perf_counter()
        result["entry"] = write_part(directory, "shard_0", snapshot)
        result["write_s"] = time.perf_counter() - t

    writer = threading.Thread(target=write)
    t0, n = time.perf_counter(), 0
    writer.start()
    while writer.is_alive():
        shard.add(fragment)
        n += 1
    adds_during = n / max(time.perf_counter() - t0, 1e-9)
    writer.join()
    nbytes = result["entry"]["bytes"]
    rate = nbytes / result["write_s"]
    dd = dd_rate(directory, nbytes)
    return {
        "workload": name,
        "capacity": capacity,
        "learner_pause_s": learner_pause,
        "learner_bytes": learner_entry["bytes"],
        "shard_pause_s": shard_pause,
        "shard_bytes": nbytes,
        "bytes_per_item": nbytes / capacity,
        "write_s": result["write_s"],
        "write_MBps": rate / 1e6,
        "dd_MBps": dd / 1e6,
        "dd_over_write": dd / rate,
        "adds_per_s_idle": adds_idle,
        "adds_per_s_during_write": adds_during,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="8x smaller replays")
    p.add_argument("--dir", default=None, help="folder to write into (default: a temp folder)")
    p.add_argument("--out", default=str(OUT))
    args = p.parse_args()
    torch.set_num_threads(1)
    scale = 8 if args.quick else 1
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="apex-ckpt-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    rows = []
    workloads = [
        ("minatar", 200_000 // scale, minatar_batch, spaces.Box(0, 1, (10, 10, 4), np.uint8), None),
        ("atari", 2**17 // scale, atari_batch, spaces.Box(0, 255, (4, 84, 84), np.uint8), 4),
    ]
    try:
        for name, cap, make, space, k in workloads:
            d = base / name
            d.mkdir(exist_ok=True)
            rows.append(measure(name, cap, make, space, k, d))
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    cols = [
        ("workload", "{}"),
        ("capacity", "{:,}"),
        ("learner_pause_s", "{:.3f}"),
        ("shard_pause_s", "{:.3f}"),
        ("shard_bytes", "{:,}"),
        ("bytes_per_item", "{:,.0f}"),
        ("write_MBps", "{:.0f}"),
        ("dd_MBps", "{:.0f}"),
        ("dd_over_write", "{:.2f}"),
        ("adds_per_s_idle", "{:,.0f}"),
        ("adds_per_s_during_write", "{:,.0f}"),
    ]
    print(" | ".join(c for c, _ in cols))
    for r in rows:
        print(" | ".join(f.format(r[c]) for c, f in cols))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"rows": rows, "quick": args.quick, "cpus": os.cpu_count()}, indent=2)
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
