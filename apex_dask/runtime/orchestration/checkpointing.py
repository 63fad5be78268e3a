"""Checkpoints of a Dask run: written by the actors themselves, committed by the driver.

::

    root/                         e.g. <--out DIR>/checkpoints
      ckpt-000007/                one complete checkpoint (the newest checkpoint.keep kept)
        manifest.json             parts, their SHA-256 and sizes, metadata (config, counters)
        learner.npz               written by the learner actor (nets, optimizer, counters)
        shard_0.npz ...           written by each replay shard actor, all in parallel
        driver.npz                the driver's counters, iteration, eval history, RNG
      .ckpt-000008.tmp-xxxx/      being written (removed on failure, or at the next start,
                                  :mod:`apex_dask.experiment.checkpoints.folder`; never loaded)

The learner and every shard write their own part straight into the staged
directory (a filesystem all workers share, as an HPC scratch or home
directory), so bulk data never passes through the driver; the driver then
writes the manifest and renames the directory into place. A crash at any
moment leaves the previous complete checkpoint.

A stop's checkpoint has a time budget (``save(..., within_s=)``, from
``checkpoint.grace_s``): what it keeps of the replay follows from how long
the last write took (:mod:`.checkpoint_budget`); its manifest's metadata says
what it left out (``left_out``), and :attr:`Checkpointer.left_out` too.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path
from typing import Any

from apex_dask.config import ApexConfig
from apex_dask.experiment.checkpoints.folder import CKPT_NAME as _NAME
from apex_dask.experiment.checkpoints.folder import checkpoints_in, latest_checkpoint
from apex_dask.experiment.checkpoints.store import (
    CheckpointError,
    StagedCheckpoint,
    read_manifest,
    read_part,
)
from apex_dask.runtime.actors.calls import call_with_timeout
from apex_dask.runtime.orchestration.checkpoint_budget import SaveBudget, WriteHistory, left_out
from apex_dask.runtime.orchestration.state import RunState
from apex_dask.runtime.orchestration.tasks import Job, TaskSet

__all__ = ["Checkpointer", "checkpoints_in", "latest_checkpoint"]


class Checkpointer(Job):
    """Periodic and on-demand checkpoints of one run's actors and ``state`` under ``root``."""

    name = "driver.checkpoints"

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
        self.left_out: dict[str, Any] | None = None  # what the last one left out (None: nothing)
        self.history = WriteHistory()  # how long each shard's last write took
        self._lock: asyncio.Lock | None = None
        self._periodic_task: asyncio.Task | None = None
        self._last_t = time.monotonic()

    def due(self, now: float) -> bool:
        """A periodic checkpoint every ``checkpoint.interval_s`` (with a root; > 0)."""
        if self.root is None or self.cfg.interval_s <= 0:
            return False
        return now - self._last_t >= self.cfg.interval_s

    def start(self, now: float) -> Any:
        return self._periodic()

    async def _periodic(self) -> Path:
        self._periodic_task = asyncio.current_task()
        try:
            return await self.save("periodic")
        finally:
            self._periodic_task = None

    def abandon_periodic(self) -> None:
        """Cancel a periodic checkpoint being written (a stop's goes first); its staged
        folder is removed and the shards abandon its writes when the stop's begins."""
        if self._periodic_task is not None:
            self._periodic_task.cancel()

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

    async def save(
        self, reason: str, timeout_s: float | None = None, *, within_s: float | None = None
    ) -> Path:
        """Write one checkpoint now; its path. Raises :class:`CheckpointError` on failure.

        ``within_s``: the whole checkpoint within that many seconds, keeping of the
        replay what fits (see the module docstring); else each part may take
        ``timeout_s`` (default: the call timeout, at least 120 s).
        """
        if self.root is None:
            raise CheckpointError("this run has no checkpoint directory (give --out DIR)")
        budget = None if within_s is None else SaveBudget.within(within_s)
        if self._lock is None:
            self._lock = asyncio.Lock()
        if budget is None:
            await self._lock.acquire()
        else:  # a periodic one being written is abandoned for this one
            self.abandon_periodic()
            try:
                await asyncio.wait_for(self._lock.acquire(), budget.parts_s())
            except TimeoutError:
                raise CheckpointError(
                    f"another checkpoint was still being written after {within_s:g} s"
                ) from None
        try:
            self._last_t = time.monotonic()
            return await self._save(reason, timeout_s or max(self.timeout, 120.0), budget)
        finally:
            self._lock.release()

    async def _save(self, reason: str, timeout_s: float, budget: SaveBudget | None) -> Path:
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
            if budget is None:
                calls += [h.save_part(directory, f"shard_{k}") for k, h in enumerate(s.shards)]
            else:  # the shards answer within their budget; the calls' bound is the parts'
                timeout_s, n = max(0.1, budget.parts_s()), len(s.shards)
                calls += [
                    h.save_part(directory, f"shard_{k}", **self.history.shard_kwargs(k, budget, n))
                    for k, h in enumerate(s.shards)
                ]
            entries = await asyncio.gather(*(call_with_timeout(c, timeout_s) for c in calls))
            staged.add_entry("learner", entries[0])
            for k, entry in enumerate(entries[1:]):
                staged.add_entry(f"shard_{k}", entry)
            staged.add_part("driver", s.snapshot())
            left = left_out(staged.entries)
            metadata = {
                "reason": reason,
                "time": time.time(),
                "write_s": time.monotonic() - t0,
                "within_s": None if budget is None else round(budget.end - t0, 3),
                "left_out": left,
                "timesteps_total": s.counters.steps_total,
                "iteration": s.counters.iteration,
                "row_timesteps_total": s.counters.row_steps,
                "num_shards": len(s.shards),
                "env_id": self.config.env.env_id,
                "config": self.config.to_dict(),
            }
            # a manifest, a rename and two fsyncs: not abandoned half-way (the budget keeps
            # a reserve for it)
            path = await asyncio.get_running_loop().run_in_executor(None, staged.commit, metadata)
        except BaseException:
            staged.abort()
            raise
        self.history.record(staged.entries)
        self.last_path, self.left_out = path, left
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
        self.history.record(parts)
        self.last_path = path
        return meta
