"""Checkpoints of a Dask run: written by the actors themselves, committed by the driver.

::

    root/                         e.g. <--out DIR>/checkpoints
      ckpt-000007/                one complete checkpoint (the newest checkpoint.keep kept)
        manifest.json             parts, their SHA-256 and sizes, metadata (config, counters)
        learner.npz               written by the learner actor (nets, optimizer, counters)
        shard_0.npz ...           written by each replay shard actor, all in parallel
        driver.npz                the driver's counters, iteration, eval history, RNG
      .ckpt-000008.tmp-xxxx/      being written (removed on failure, or at the next start,
                                  :mod:`apex_dask.experiment.checkpoint_folder`; never loaded)

The learner and every shard write their own part straight into the staged
directory (a filesystem all workers share, as an HPC scratch or home
directory), so bulk data never passes through the driver; the driver then
writes the manifest and renames the directory into place. A crash at any
moment leaves the previous complete checkpoint.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path
from typing import Any

from apex_dask.config import ApexConfig
from apex_dask.experiment.checkpoint import (
    CheckpointError,
    StagedCheckpoint,
    read_manifest,
    read_part,
)
from apex_dask.experiment.checkpoint_folder import CKPT_NAME as _NAME
from apex_dask.experiment.checkpoint_folder import checkpoints_in, latest_checkpoint
from apex_dask.runtime.actors.calls import call_with_timeout
from apex_dask.runtime.orchestration.state import RunState
from apex_dask.runtime.orchestration.tasks import Job, TaskSet

__all__ = ["Checkpointer", "checkpoints_in", "latest_checkpoint"]


class Checkpointer(Job):
    """Periodic and on-demand checkpoints of one run's actors and ``state`` under ``root``."""

    def __init__(
        self,
        state: RunState,
        tasks: TaskSet,
        config: ApexConfig,
        root: str | Path | None,
        timeout_s: float,
    ) -> None:
        super().__init__(tasks)
        self.state, self.config = state, config
        self.root = None if root is None else Path(root)
        self.cfg = config.checkpoint
        self.timeout = timeout_s
        self.last_path: Path | None = None
        self._lock: asyncio.Lock | None = None
        self._last_t = time.monotonic()

    def due(self, now: float) -> bool:
        """A periodic checkpoint every ``checkpoint.interval_s`` (with a root; > 0)."""
        if self.root is None or self.cfg.interval_s <= 0:
            return False
        return now - self._last_t >= self.cfg.interval_s

    def start(self, now: float) -> Any:
        return self.save("periodic")

    def done(self, result: Any, exc: BaseException | None) -> None:
        if exc is not None:  # a failed checkpoint must not end training; the next one retries
            self.state.note(f"checkpoint failed: {type(exc).__name__}: {exc}")

    def latest(self) -> Path | None:
        """The newest complete checkpoint of this run (or the one it resumed from)."""
        found = None if self.root is None else latest_checkpoint(self.root)
        return found or self.last_path

    def _next_dest(self) -> Path:
        assert self.root is not None
        numbers = [int(m.group(1)) for p in checkpoints_in(self.root) if (m := _NAME.match(p.name))]
        return self.root / f"ckpt-{max(numbers, default=0) + 1:06d}"

    async def save(self, reason: str, timeout_s: float | None = None) -> Path:
        """Write one checkpoint now; its path. Raises :class:`CheckpointError` on failure."""
        if self.root is None:
            raise CheckpointError("this run has no checkpoint directory (give --out DIR)")
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            self._last_t = time.monotonic()
            return await self._save(reason, timeout_s or max(self.timeout, 120.0))

    async def _save(self, reason: str, timeout_s: float) -> Path:
        s = self.state
        if s.missing_shards:
            raise CheckpointError(
                f"replay shard(s) {sorted(s.missing_shards)} are being rebuilt; the next "
                "checkpoint will be written once they are back"
            )
        staged = StagedCheckpoint(self._next_dest())
        directory = str(staged.path)
        try:
            t0 = time.monotonic()
            calls = [s.learner.save_part(directory, "learner")]
            calls += [h.save_part(directory, f"shard_{k}") for k, h in enumerate(s.shards)]
            entries = await asyncio.gather(*(call_with_timeout(c, timeout_s) for c in calls))
            staged.add_entry("learner", entries[0])
            for k, entry in enumerate(entries[1:]):
                staged.add_entry(f"shard_{k}", entry)
            staged.add_part("driver", s.snapshot())
            metadata = {
                "reason": reason,
                "time": time.time(),
                "write_s": time.monotonic() - t0,
                "timesteps_total": s.counters.steps_total,
                "iteration": s.counters.iteration,
                "num_shards": len(s.shards),
                "env_id": self.config.env.env_id,
                "config": self.config.to_dict(),
            }
            path = await asyncio.get_running_loop().run_in_executor(None, staged.commit, metadata)
        except BaseException:
            staged.abort()
            raise
        self.last_path = path
        for old in checkpoints_in(self.root)[: -self.cfg.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return path

    async def restore(self, path: Path) -> dict[str, Any]:
        """Load checkpoint ``path`` into the learner, every shard and the run state; its
        metadata."""
        s, env_id = self.state, self.config.env.env_id
        manifest = read_manifest(path)
        meta, parts = manifest["metadata"], manifest["parts"]
        if meta.get("env_id") != env_id:
            raise CheckpointError(
                f"{path}: written for env {meta.get('env_id')!r}, this run is {env_id!r}"
            )
        if meta.get("num_shards") != len(s.shards):
            raise CheckpointError(
                f"{path}: holds {meta.get('num_shards')} replay shards, this run has "
                f"{len(s.shards)}; resume with --set replay.num_shards={meta.get('num_shards')}"
            )
        timeout_s = max(self.timeout, 120.0)
        d = str(path)
        calls = [s.learner.load_part(d, parts["learner"])]
        calls += [h.load_part(d, parts[f"shard_{k}"]) for k, h in enumerate(s.shards)]
        # every load ends before this returns (a caller may try an older checkpoint next)
        loaded = await asyncio.gather(
            *(call_with_timeout(c, timeout_s) for c in calls), return_exceptions=True
        )
        failed = [x for x in loaded if isinstance(x, BaseException)]
        if failed:
            raise failed[0]
        s.restart_rates(int(loaded[0]))  # the first result's rates count from the restore
        state = await asyncio.get_running_loop().run_in_executor(
            None, read_part, path, parts["driver"]
        )
        s.restore(state)
        self.last_path = path
        return meta
