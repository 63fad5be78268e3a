"""Checkpoints of the in-process runner: learner, every shard, the runner's counters, config."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from apex_dask.algo.checkpoint import save_checkpoint

if TYPE_CHECKING:
    from apex_dask.local.runner import LocalApex

__all__ = ["restore_runner", "save_runner"]

_COUNTERS = (
    "steps_sampled",
    "weight_syncs",
    "rollouts",
    "iteration",
    "shard_cursor",
    "weight_snapshots",
)
_LISTS = ("worker_rollouts", "shard_rollouts", "shard_batches")


def save_runner(apex: LocalApex, path: str | Path) -> Path:
    """Write ``apex``'s checkpoint directory (atomically)."""
    runner: dict[str, Any] = {name: getattr(apex, name) for name in (*_COUNTERS, *_LISTS)}
    runner["rng"] = apex.rng.bit_generator.state
    parts: dict[str, Any] = {"learner": apex.learner.state_dict(), "runner": runner}
    parts.update({f"shard_{k}": s.state_dict() for k, s in enumerate(apex.shards)})
    meta = {"timesteps": apex.steps_sampled, "config": apex.config.to_dict()}
    return save_checkpoint(path, parts, metadata=meta)


def restore_runner(apex: LocalApex, parts: dict[str, Any]) -> None:
    """Load a checkpoint's parts into a freshly built ``apex``."""
    apex.learner.load_state_dict(parts["learner"])
    for k, shard in enumerate(apex.shards):
        shard.load_state_dict(parts[f"shard_{k}"])
    r = parts["runner"]
    for name in _COUNTERS:
        setattr(apex, name, int(r[name]))
    for name in _LISTS:
        setattr(apex, name, list(r[name]))
    apex.rng.bit_generator.state = r["rng"]
