"""A Dask run's checkpoint folder at start-up: leftovers removed, the newest good checkpoint
restored.

::

    start = StartCheckpoints.prepare(checkpoint_dir, resume_from)   # before the actors exist
    start.notes          # ["removed 1 unfinished checkpoint write from ... (2.1 GB freed)"]
    resumed = await restore_newest(checkpointer, start.candidates, start.notes)
    resumed.path, resumed.metadata                      # what the run continues from

The candidates are checked newest first without reading their data (manifest,
part names inside the folder, sizes, array headers:
:func:`~apex_dask.algo.checkpoint.verify_checkpoint`); the actors then
load their parts, each verifying its SHA-256. A checkpoint that fails either
check (a :class:`~apex_dask.algo.checkpoint.DamagedCheckpoint`) is skipped
with one line naming it and why, and the next older one is tried; a checkpoint
that verifies but does not fit this run (another env, another number of
shards) is an error at once, since every older one would not fit either.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from apex_dask.algo.checkpoint import CheckpointError, DamagedCheckpoint, verify_checkpoint
from apex_dask.algo.checkpoint_folder import remove_leftovers, resume_candidates, skip_line
from apex_dask.runtime.errors import ApexRuntimeError
from apex_dask.runtime.orchestration.checkpointing import Checkpointer

__all__ = ["Resumed", "StartCheckpoints", "restore_newest"]

log = logging.getLogger("apex_dask.checkpoints")


@dataclass
class StartCheckpoints:
    """What a starting run found: the checkpoints it may resume from (newest first) and
    one line per thing it did or skipped."""

    candidates: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def note(self, line: str) -> None:
        log.warning("%s", line)
        self.notes.append(line)

    @classmethod
    def prepare(
        cls,
        checkpoint_dir: str | os.PathLike[str] | None,
        resume_from: str | os.PathLike[str] | None,
    ) -> StartCheckpoints:
        """Remove interrupted writes under ``checkpoint_dir``; list ``resume_from``'s
        checkpoints (:class:`ApexRuntimeError` if it has none)."""
        start = cls()
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
            start.note(skip_line(path, exc))
            continue
        try:
            meta = await checkpoints.restore(path)  # every part's checksum, by its actor
        except DamagedCheckpoint as exc:
            first = first or exc
            start.note(skip_line(path, exc))
            continue
        return Resumed(path, meta)
    many = f"none of the {len(candidates)} checkpoints verifies; " if len(candidates) > 1 else ""
    raise CheckpointError(f"{many}{first}")
