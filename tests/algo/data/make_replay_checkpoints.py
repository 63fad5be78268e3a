"""Writes ``replay_checkpoints/``: replay shard checkpoints in the format of commit 29928ec.

The fixtures were written by the code of that commit (before the shard's
item storage and frame store owned their own checkpoint state), so
``tests/algo/test_replay_checkpoint_format.py`` checks that checkpoints
written then still load. Run from the repository root::

    python tests/algo/data/make_replay_checkpoints.py

Rerunning it with newer code rewrites the fixtures in the newer format,
which defeats their purpose: only do so on a deliberate format change.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from apex_dask.algo.replay.shard import ReplayShard
from apex_dask.experiment.checkpoints.store import save_checkpoint

OUT = Path(__file__).parent / "replay_checkpoints"


def vector_batch(rng: np.random.Generator, n: int, start: int) -> dict[str, np.ndarray]:
    i = np.arange(start, start + n)
    return {
        "obs": rng.standard_normal((n, 3)).astype(np.float32),
        "action": i.astype(np.int64),
        "reward": rng.standard_normal(n).astype(np.float32),
        "next_obs": rng.standard_normal((n, 3)).astype(np.float32),
        "done": i % 5 == 0,
        "discount": np.full(n, 0.99, np.float32),
    }


def stacked_batch(rng: np.random.Generator, n: int, start: int) -> dict[str, np.ndarray]:
    """Stacks that share frames (a sliding window) except every 7th item (fresh frames)."""
    frames = rng.integers(0, 256, (n + 4, 3, 3), dtype=np.uint8)
    win = np.stack([frames[j : j + 4] for j in range(n + 1)])
    obs, nxt = win[:-1].copy(), win[1:].copy()
    fresh = np.arange(n) % 7 == 3
    obs[fresh] = rng.integers(0, 256, (int(fresh.sum()), 4, 3, 3), dtype=np.uint8)
    return {
        "obs": obs,
        "action": np.arange(start, start + n, dtype=np.int64),
        "reward": rng.standard_normal(n).astype(np.float32),
        "next_obs": nxt,
        "done": rng.random(n) < 0.1,
    }


def fill(shard: ReplayShard, make, rng: np.random.Generator) -> None:
    start = 0
    for r in range(9):
        n = int(rng.integers(3, 12))
        prios = rng.exponential(size=n) if r % 2 else None
        shard.add(make(rng, n, start), prios)
        start += n
        s = shard.sample(8, beta=0.4)
        shard.update_priorities(s.indices, rng.exponential(size=8))


def expected(shard: ReplayShard, make, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """What the shard does next: its stats, its stored items, two samples around an add."""
    out = {f"stats/{k}": np.asarray(v) for k, v in shard.stats().items()}
    s = shard.sample(16, beta=0.4)
    out["s0/indices"], out["s0/weights"] = s.indices, s.weights
    out.update({f"s0/data/{k}": v for k, v in s.data.items()})
    batch, prios = make(rng, 6, 1000), rng.exponential(size=6)
    out.update({f"add/batch/{k}": v for k, v in batch.items()}, **{"add/priorities": prios})
    out["add/slots"] = shard.add(batch, prios)
    s = shard.sample(16, beta=0.6)
    out["s1/indices"], out["s1/weights"] = s.indices, s.weights
    out.update({f"s1/data/{k}": v for k, v in s.data.items()})
    return out


def main() -> None:
    shutil.rmtree(OUT, ignore_errors=True)
    cases = {
        "vector": (ReplayShard(32, alpha=0.6, seed=3), vector_batch),
        "stacked": (ReplayShard(24, alpha=0.7, seed=4, frame_stack=4), stacked_batch),
    }
    for name, (shard, make) in cases.items():
        rng = np.random.default_rng(len(name))
        fill(shard, make, rng)
        save_checkpoint(OUT / name, {"shard_0": shard.state_dict()}, metadata={"case": name})
        np.savez(OUT / f"{name}_expected.npz", **expected(shard, make, rng))
        print(name, shard.stats())


if __name__ == "__main__":
    main()
