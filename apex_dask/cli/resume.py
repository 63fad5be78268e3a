"""``apex-dask-submit --resume DIR``: continue the run that wrote ``DIR``.

::

    apex-dask-submit --resume runs/pong                      # same config, same folder
    apex-dask-submit --resume runs/pong --stop-time 36000 --set topology.local_workers=8

The config is the one stored in the newest checkpoint under
``DIR/checkpoints`` that verifies (a damaged newer one is skipped, named in one
line); only stop conditions (``--stop-*``, ``stop.*``),
topology (``topology.*``) and checkpoint cadence (``checkpoint.*``) may be
changed, and each change is recorded in ``DIR/resumes.jsonl``. Other keys set to
the value the run already has are accepted (a requeued job repeats its arguments). Counters
(``timesteps_total``, ``iteration``, ``learner/steps_trained``) continue
from the checkpoint and the replay is restored. Rows of ``results.jsonl`` past
the checkpoint (written after it by the attempt that was cut short) move to a
side file (:mod:`.rewind`), so ``iteration`` and ``timesteps_total`` only rise
in it; TensorBoard purges its events past the checkpoint's step.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from apex_dask.cli.checks import UsageError
from apex_dask.cli.resolve import stop_flags
from apex_dask.config import ApexConfig
from apex_dask.experiment.checkpoints.folder import pick_checkpoint
from apex_dask.experiment.checkpoints.store import CheckpointError

__all__ = ["RESUMABLE", "ResumePoint", "resolve_resume"]

RESUMABLE = ("stop.", "topology.", "checkpoint.")
"""Key prefixes a resume may change."""


@dataclass(frozen=True)
class ResumePoint:
    """Where ``--resume`` continues from: the checkpoint, and the keys the command line changed."""

    checkpoint: Path
    overrides: dict[str, Any]


def resolve_resume(args: argparse.Namespace) -> tuple[ApexConfig, ResumePoint]:
    """``(config, where to resume)`` for ``--resume DIR`` (:class:`UsageError` if not)."""
    if args.preset or args.config:
        raise UsageError("--resume takes the run's own config; drop --preset/--config")
    if args.out and Path(args.out).expanduser() != Path(args.resume).expanduser():
        raise UsageError("--resume DIR writes into DIR; drop --out (or give the same folder)")
    root = Path(args.resume).expanduser()
    try:  # the newest that verifies (no data read); the driver skips the same ones, naming them
        picked = pick_checkpoint(root / "checkpoints")
        if picked is None:
            raise UsageError(
                f"--resume {args.resume!r}: no checkpoint in {root / 'checkpoints'} "
                "(nothing to resume); start a new run with --out instead"
            )
        path, stored = picked.path, picked.manifest["metadata"]["config"]
    except (CheckpointError, KeyError, TypeError) as exc:
        raise UsageError(f"--resume {args.resume!r}: {exc}") from None
    base = ApexConfig.from_dict(stored)
    overrides: dict[str, Any] = {}
    for item in args.set:
        if "=" not in item:
            raise UsageError(f"--set {item!r} must look like KEY=VALUE, e.g. --set stop.time_s=60")
        key, value = item.split("=", 1)
        key = key.strip()
        if not key.startswith(RESUMABLE):
            if _unchanged(base, key, value):  # e.g. a requeued job's own arguments
                continue
            raise UsageError(
                f"--set {key}: a resumed run keeps its config; only "
                f"{', '.join(p + '*' for p in RESUMABLE)} keys may change "
                "(giving a key the value the run already has is fine)"
            )
        overrides[key] = value
    overrides.update(stop_flags(args))
    cfg = base.override(overrides)
    return cfg, ResumePoint(path, overrides)


def _unchanged(base: ApexConfig, key: str, value: str) -> bool:
    """Whether ``--set key=value`` leaves ``base`` as it is."""
    try:
        return base.override({key: value}).to_dict() == base.to_dict()
    except Exception:
        return False


def record_resume(out: Path, checkpoint: Path, overrides: dict[str, Any]) -> None:
    """Append one line to ``out/resumes.jsonl``: when, from which checkpoint, what changed."""
    line = json.dumps(
        {"time": time.time(), "checkpoint": checkpoint.name, "overrides": overrides}, default=str
    )
    with open(out / "resumes.jsonl", "a") as f:
        f.write(line + "\n")
