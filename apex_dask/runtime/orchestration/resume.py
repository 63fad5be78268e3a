"""A Dask run's start: leftovers removed, the newest good checkpoint restored, TensorBoard
continued from it.

::

    start = StartCheckpoints.prepare(checkpoint_dir, resume_from)   # before the actors exist
    start.notes          # ["removed 1 unfinished checkpoint write from ... (2.1 GB freed)"]
    resumed = await restore_newest(checkpointer, start.candidates, start.notes)
    resumed.path, resumed.metadata                      # what the run continues from

The candidates are checked newest first without reading their data (manifest,
part names inside the folder, sizes, array headers:
:func:`~apex_dask.experiment.checkpoints.store.verify_checkpoint`); the actors then
load their parts, each verifying its SHA-256. A checkpoint that fails either
check (a :class:`~apex_dask.experiment.checkpoints.store.DamagedCheckpoint`) is skipped
with one line naming it and why, and the next older one is tried; a checkpoint
that verifies but does not fit this run (another env, another number of
shards) is an error at once, since every older one would not fit either.

A skipped checkpoint in the run's own ``checkpoint_dir`` is renamed
``ckpt-N.damaged``: kept for a look (its other parts may be whole), but out of
``checkpoint.keep``'s count, which would otherwise delete the older good
checkpoint at the next save and keep the damaged one.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from apex_dask.config import ApexConfig
from apex_dask.experiment.checkpoints.folder import remove_leftovers, resume_candidates, skip_line
from apex_dask.experiment.checkpoints.store import (
    CheckpointError,
    DamagedCheckpoint,
    verify_checkpoint,
)
from apex_dask.experiment.tracking import TensorBoardSink, TrackingError
from apex_dask.runtime.errors import ApexRuntimeError
from apex_dask.runtime.orchestration.checkpointing import Checkpointer

__all__ = ["Resumed", "StartCheckpoints", "open_tensorboard", "restore_newest"]

log = logging.getLogger("apex_dask.checkpoints")


@dataclass
class StartCheckpoints:
    """What a starting run found: the checkpoints it may resume from (newest first) and
    one line per thing it did or skipped."""

    candidates: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    own_root: Path | None = None
    """The run's checkpoint folder: a damaged checkpoint in it is moved aside."""

    def note(self, line: str) -> None:
        log.warning("%s", line)
        self.notes.append(line)

    def skip(self, path: Path, exc: BaseException) -> None:
        """Note a checkpoint that does not verify; out of the rotation if it is the run's."""
        line = skip_line(path, exc)
        own = self.own_root is not None and path.parent.resolve() == self.own_root.resolve()
        if own and path.is_dir():
            aside, n = path.with_name(f"{path.name}.damaged"), 1
            while aside.exists():
                n += 1
                aside = path.with_name(f"{path.name}.damaged-{n}")
            try:
                os.replace(path, aside)
                line += f"; moved it to {aside.name}"
            except OSError as err:
                line += f"; could not move it aside ({err.strerror or err})"
        self.note(line)

    @classmethod
    def prepare(
        cls,
        checkpoint_dir: str | os.PathLike[str] | None,
        resume_from: str | os.PathLike[str] | None,
    ) -> StartCheckpoints:
        """Remove interrupted writes under ``checkpoint_dir``; list ``resume_from``'s
        checkpoints (:class:`ApexRuntimeError` if it has none)."""
        start = cls(own_root=None if checkpoint_dir is None else Path(checkpoint_dir))
        if checkpoint_dir is not None:
            line = remove_leftovers(checkpoint_dir).line(checkpoint_dir)
            if line:
                start.note(line)
        if resume_from is not None:
            start.candidates = resume_candidates(resume_from)
            if not start.candidates:
                raise ApexRuntimeError(
                    f"no checkpoint in {str(resume_from)!r} (nothing to resume); "
                    "start a new run instead"
                )
        return start


@dataclass(frozen=True)
class Resumed:
    """The checkpoint a run continues from, and its metadata (``timesteps_total``,
    ``iteration``, ``config``, ...)."""

    path: Path
    metadata: dict[str, Any]


async def restore_newest(
    checkpoints: Checkpointer, candidates: list[Path], start: StartCheckpoints
) -> Resumed:
    """Restore the newest of ``candidates`` that verifies into the run (see the module
    docstring); :class:`CheckpointError` (one line) if none does."""
    first: CheckpointError | None = None
    for path in candidates:
        try:
            verify_checkpoint(path, checksums=False)  # cheap: no data read
        except CheckpointError as exc:
            first = first or exc
            start.skip(path, exc)
            continue
        try:
            meta = await checkpoints.restore(path)  # every part's checksum, by its actor
        except DamagedCheckpoint as exc:
            first = first or exc
            start.skip(path, exc)
            continue
        return Resumed(path, meta)
    many = f"none of the {len(candidates)} checkpoints verifies; " if len(candidates) > 1 else ""
    raise CheckpointError(f"{many}{first}")


def open_tensorboard(
    log_dir: str | os.PathLike[str],
    config: ApexConfig,
    run_id: str,
    resumed: dict[str, Any] | None = None,
) -> TensorBoardSink:
    """A run's TensorBoard sink (the config and run id in its Text tab). A run resumed
    from a checkpoint (``resumed``, its metadata) purges the events an earlier attempt
    wrote past the checkpoint's last row, at steps above that row's ``timesteps_total``
    (``row_timesteps_total``; a checkpoint without it: above its own ``timesteps_total``):
    the curves continue from the checkpoint without a fold. (The row after the checkpoint
    may have the checkpoint's own step when no rollout was stored between them.)"""
    meta = resumed or {}
    step = meta.get("row_timesteps_total", meta.get("timesteps_total"))
    purge = None if step is None else int(step) + 1
    try:
        sink = TensorBoardSink(log_dir, purge_step=purge)
    except TrackingError as exc:
        raise ApexRuntimeError(str(exc)) from None
    sink.write_text("config", config.to_yaml())
    sink.write_text("run_id", run_id)
    return sink
