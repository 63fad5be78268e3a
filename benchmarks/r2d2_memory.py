"""Replay memory per env step of R2D2 sequence items against DQN transitions on MinAtar.

R2D2 stores each sequence item whole: ``B + L`` observations and the one after them,
so consecutive items of an episode (a new one every ``P`` steps) hold each
observation ``(B + L) / P`` times. This script measures what that costs and what
storing each frame once would save:

* it fills a real :class:`~apex_dask.algo.replay.shard.ReplayShard` (the shard the
  runs use, built as the run builds it: ``experiment.builder.shard_kwargs``) with the
  rollouts of the agent's own env worker on ``MinAtar/Breakout-v1`` (epsilon 0.4, the
  preset's settings, ``--env-steps`` env steps), for the ``minatar_r2d2`` preset, the
  same with the R2D2 paper's sequence shape (burn-in 40, trace 80, period 40) and the
  ``minatar`` DQN preset (transitions, no frame stack);
* per setting it reports the shard's allocated bytes per item (its ``stats()["bytes"]``
  over its capacity), the items and env steps stored, bytes per env step, the
  observation rows stored per distinct observation (env steps + episode ends), and
  the bytes per env step a store of each observation once (plus ``B + L + 1`` uint32
  references per item) would need.

    python benchmarks/r2d2_memory.py                      # 20,000 env steps per setting
    python benchmarks/r2d2_memory.py --env-steps 50000

Prints a table and writes ``benchmarks/results/r2d2_memory.json``. Needs
``pip install 'apex_dask[minatar]'``.
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path
from typing import Any

import numpy as np

from apex_dask.algo.agents.registry import make_env_worker
from apex_dask.algo.replay.shard import ReplayShard
from apex_dask.config import ApexConfig
from apex_dask.experiment.builder import env_factory, shard_kwargs, worker_spec

RESULTS = Path(__file__).resolve().parent / "results" / "r2d2_memory.json"
PAPER = {"r2d2.burn_in": 40, "r2d2.trace_length": 80, "r2d2.period": 40}
SETTINGS: dict[str, tuple[str, dict[str, Any]]] = {
    "r2d2 (minatar_r2d2: B10 L20 P10)": ("minatar_r2d2", {}),
    "r2d2 (paper's shape: B40 L80 P40)": ("minatar_r2d2", PAPER),
    "dqn (minatar: transitions)": ("minatar", {}),
}


def measure(preset: str, overrides: dict[str, Any], env_steps: int) -> dict[str, Any]:
    cfg = ApexConfig.preset(preset).override({"replay.num_shards": 1, **overrides})
    worker = make_env_worker(worker_spec(cfg), env_factory(cfg), exploration=0.4, seed=1)
    shard = ReplayShard(**shard_kwargs(cfg, 0))
    steps = episodes = 0
    while steps < env_steps:
        rollout = worker.sample()
        steps += rollout.steps
        episodes += len(rollout.episode_lengths)
        if len(rollout.batch["action"]):
            shard.add(rollout.batch, rollout.priorities)
    stats = shard.stats()
    items = int(stats["size"])
    assert stats["added"] == items, "the shard wrapped: raise the preset's capacity"
    per_item = stats["bytes"] / stats["capacity"]
    obs = worker.observation_space
    frame_bytes = int(np.prod(obs.shape)) * np.dtype(obs.dtype).itemsize
    sequence = preset == "minatar_r2d2"
    rows_per_item = (cfg.agent.burn_in + cfg.agent.trace_length + 1) if sequence else 2
    distinct = steps + episodes  # every step's observation and each episode's last one
    once = per_item - rows_per_item * frame_bytes + rows_per_item * 4  # refs for frames
    return {
        "preset": preset,
        "overrides": overrides,
        "env_steps": steps,
        "episodes": episodes,
        "items": items,
        "frame_bytes": frame_bytes,
        "bytes_per_item": round(per_item, 1),
        "bytes_per_env_step": round(per_item * items / steps, 1),
        "obs_rows_per_distinct_obs": round(rows_per_item * items / distinct, 2),
        "frames_once_bytes_per_env_step": round((once * items + frame_bytes * distinct) / steps, 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env-steps", type=int, default=20_000)
    p.add_argument("--out", type=Path, default=RESULTS)
    a = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)  # acting and worker priorities, as in an env worker
    rows = {name: measure(preset, o, a.env_steps) for name, (preset, o) in SETTINGS.items()}
    head = (
        f"{'setting':36s} {'items':>7s} {'B/item':>8s} {'B/env step':>10s} "
        f"{'rows/obs':>8s} {'once: B/step':>12s}"
    )
    print(head + "\n" + "-" * len(head))
    for name, r in rows.items():
        print(
            f"{name:36s} {r['items']:>7,d} {r['bytes_per_item']:>8,.0f} "
            f"{r['bytes_per_env_step']:>10,.0f} {r['obs_rows_per_distinct_obs']:>8.2f} "
            f"{r['frames_once_bytes_per_env_step']:>12,.0f}"
        )
    a.out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"machine": platform.platform(), "env_steps": a.env_steps, "settings": rows}
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
