"""Checkpoints of the in-process runner: learner, every shard, the runner's counters, config.

::

    parts = runner_state(apex)               # what LocalApex.state_dict() returns
    path = save_runner(apex, "runs/x/ckpt")
    parts, meta = load_runner_checkpoint(path)   # CheckpointError: one line naming the file
    restore_runner(apex, parts)
    parts, meta, path = load_newest_runner_checkpoint("runs/x")   # a folder of ckpt-N

Both :func:`save_runner` and :func:`load_newest_runner_checkpoint` first
remove what an interrupted write of that checkpoint left beside it
(``.<name>.tmp-*``; :func:`~apex_dask.experiment.checkpoints.folder.remove_leftovers`),
with one logged line saying how much was freed. Given a folder of ``ckpt-N``
checkpoints, :func:`load_newest_runner_checkpoint` takes the newest that
verifies, logging one line for each newer one it skipped and why.

:func:`load_runner_checkpoint` refuses, before any runner is built, a
checkpoint that is not the in-process runner's (a Dask run's has no
``runner`` part) and one whose learner weights hold NaN or inf: such weights
would make every Q-value NaN from the first step.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from apex_dask.experiment.checkpoints.folder import remove_leftovers, resume_candidates, skip_line
from apex_dask.experiment.checkpoints.stateful import Stateful
from apex_dask.experiment.checkpoints.store import (
    MANIFEST,
    CheckpointError,
    load_checkpoint,
    save_checkpoint,
)

__all__ = [
    "Runner",
    "load_newest_runner_checkpoint",
    "load_runner_checkpoint",
    "restore_runner",
    "runner_state",
    "save_runner",
]

log = logging.getLogger("apex_dask.checkpoints")

_COUNTERS = (
    "steps_sampled",
    "weight_syncs",
    "rollouts",
    "iteration",
    "shard_cursor",
    "weight_snapshots",
)
_LISTS = ("worker_rollouts", "shard_rollouts", "shard_batches")
_WEIGHTS = ("online", "target")
"""The learner part's networks; every value must be finite."""


class Runner(Protocol):
    """What a checkpoint holds of the in-process runner (``LocalApex``): its learner, its
    shards, its random generator, its config, and the counters and lists named in
    ``_COUNTERS`` and ``_LISTS`` (attributes of the same names)."""

    learner: Stateful
    shards: Sequence[Stateful]
    rng: np.random.Generator
    config: Any
    steps_sampled: int


def runner_state(apex: Runner) -> dict[str, Any]:
    """``apex``'s checkpoint parts: ``learner`` and ``shard_<k>`` (each part's own
    ``state_dict()``) and ``runner`` (its counters, lists and the RNG's state)."""
    runner: dict[str, Any] = {name: getattr(apex, name) for name in (*_COUNTERS, *_LISTS)}
    runner["rng"] = apex.rng.bit_generator.state
    parts: dict[str, Any] = {"learner": apex.learner.state_dict(), "runner": runner}
    parts.update({f"shard_{k}": s.state_dict() for k, s in enumerate(apex.shards)})
    return parts


def save_runner(apex: Runner, path: str | Path) -> Path:
    """Write ``apex``'s checkpoint directory (atomically)."""
    parts = runner_state(apex)
    meta = {"timesteps": apex.steps_sampled, "config": apex.config.to_dict()}
    _clean_beside(Path(path))
    return save_checkpoint(path, parts, metadata=meta)


def _clean_beside(path: Path) -> None:
    """Remove what interrupted writes of checkpoint ``path`` (or, for a folder of ``ckpt-N``
    checkpoints, of any of them) left; one logged line."""
    if path.is_dir() and not (path / MANIFEST).is_file() and resume_candidates(path):
        root, name = path, None
    else:
        root, name = path.parent, path.name
    line = remove_leftovers(root, name).line(root)
    if line:
        log.warning("%s", line)


def load_newest_runner_checkpoint(
    path: str | Path,
) -> tuple[dict[str, Any], dict[str, Any], Path]:
    """``(parts, metadata, checkpoint)``: ``path`` if it is a checkpoint, else the newest
    checkpoint under it that verifies and holds finite weights (newer ones that do not are
    skipped, one logged line each).
    :class:`CheckpointError` (one line) if there is none."""
    path = Path(path)
    _clean_beside(path)
    candidates = resume_candidates(path)
    if not candidates:
        raise CheckpointError(f"{path}: not a checkpoint (no {MANIFEST}, no ckpt-N inside)")
    first: CheckpointError | None = None
    for ckpt in candidates:
        try:
            parts, meta = load_runner_checkpoint(ckpt)
        except CheckpointError as exc:
            if len(candidates) == 1:
                raise
            first = first or exc
            log.warning("%s", skip_line(ckpt, exc))
            continue
        return parts, meta, ckpt
    raise CheckpointError(f"none of the {len(candidates)} checkpoints verifies; {first}")


def load_runner_checkpoint(path: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(parts, metadata)`` of an in-process runner's checkpoint, every file verified.

    Raises :class:`CheckpointError` (one line naming the file) for a damaged
    or foreign checkpoint and for learner weights holding NaN or inf.
    """
    parts, meta = load_checkpoint(path)
    missing = [name for name in ("learner", "runner") if name not in parts]
    if missing or not isinstance(meta, dict) or "config" not in meta:
        what = f"no {missing[0]!r} part" if missing else "no config in its metadata"
        raise CheckpointError(
            f"{Path(path)}: not a checkpoint of the in-process runner ({what}); "
            "a Dask run's checkpoint is resumed with apex-dask-submit --resume"
        )
    learner = parts["learner"]
    for net in _WEIGHTS:
        arrays = learner.get(net) if isinstance(learner, dict) else None
        if not isinstance(arrays, dict):
            raise CheckpointError(f"{Path(path) / 'learner.npz'}: no {net!r} network")
        for name, value in arrays.items():
            if not np.all(np.isfinite(np.asarray(value))):
                raise CheckpointError(
                    f"{Path(path) / 'learner.npz'}: the {net} network's {name} holds NaN or "
                    "inf; refusing to restore it (use an earlier checkpoint)"
                )
    return parts, meta


def restore_runner(apex: Runner, parts: Mapping[str, Any]) -> None:
    """Load a checkpoint's parts (:func:`runner_state`'s) into a freshly built ``apex``."""
    apex.learner.load_state_dict(parts["learner"])
    for k, shard in enumerate(apex.shards):
        shard.load_state_dict(parts[f"shard_{k}"])
    r = parts["runner"]
    for name in _COUNTERS:
        setattr(apex, name, int(r[name]))
    for name in _LISTS:
        setattr(apex, name, list(r[name]))
    apex.rng.bit_generator.state = r["rng"]
