"""Checkpoints of a Dask run: written by the actors themselves, committed by the driver.

::

    root/                         e.g. <--out DIR>/checkpoints
      ckpt-000007/                one complete checkpoint (the newest checkpoint.keep kept)
        manifest.json             parts, their SHA-256 and sizes, metadata (config, counters)
        learner.npz               written by the learner actor (nets, optimizer, counters)
        shard_0.npz ...           written by each replay shard actor, all in parallel
        driver.npz                the driver's counters, iteration, eval history, RNG
      .ckpt-000008.tmp-xxxx/      being written (removed on failure; never loaded)

The learner and every shard write their own part straight into the staged
directory (a filesystem all workers share, as an HPC scratch or home
directory), so bulk data never passes through the driver; the driver then
writes the manifest and renames the directory into place. A crash at any
moment leaves the previous complete checkpoint.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from apex_dask.algo.checkpoint import (
    CheckpointError,
    StagedCheckpoint,
    read_manifest,
    read_part,
)
from apex_dask.runtime.actors.calls import call_with_timeout

if TYPE_CHECKING:
    from apex_dask.runtime.orchestration.plan import ExecutionPlan

__all__ = ["Checkpointer", "checkpoints_in", "latest_checkpoint", "load_plan_state", "plan_state"]

_NAME = re.compile(r"^ckpt-(\d{6,})$")


def checkpoints_in(root: str | Path) -> list[Path]:
    """Complete checkpoints under ``root`` (with a manifest), oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _NAME.match(p.name)
        if m and (p / "manifest.json").is_file():
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found)]


def latest_checkpoint(path: str | Path) -> Path | None:
    """``path`` itself if it is a checkpoint, else the newest one under it (or ``path/checkpoints``)."""
    path = Path(path)
    if (path / "manifest.json").is_file():
        return path
    for root in (path, path / "checkpoints"):
        found = checkpoints_in(root)
        if found:
            return found[-1]
    return None


class Checkpointer:
    """Periodic and on-demand checkpoints of one :class:`ExecutionPlan` under ``root``."""

    def __init__(self, plan: ExecutionPlan, root: str | Path | None) -> None:
        self.plan = plan
        self.root = None if root is None else Path(root)
        self.cfg = plan.cfg.checkpoint
        self.saved = 0
        self.last_path: Path | None = None
        self.last_pause_s = 0.0
        self._lock: asyncio.Lock | None = None
        self._last_t = time.monotonic()
        self._pending = False

    def tick(self) -> None:
        """From the plan's loop: start a periodic checkpoint when one is due."""
        if self.root is None or self.cfg.interval_s <= 0 or self._pending:
            return
        if time.monotonic() - self._last_t < self.cfg.interval_s:
            return
        self._pending = True
        self.plan.tasks.add(self.save("periodic"), self._saved)

    def _saved(self, task: asyncio.Future) -> None:
        self._pending = False
        exc = None if task.cancelled() else task.exception()
        if exc is not None:  # a failed checkpoint must not end training; the next one retries
            self.plan.report.note(f"checkpoint failed: {type(exc).__name__}: {exc}")

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
            return await self._save(reason, timeout_s or max(self.plan.timeout, 120.0))

    async def _save(self, reason: str, timeout_s: float) -> Path:
        p = self.plan
        if p.missing_shards:
            raise CheckpointError(
                f"replay shard(s) {sorted(p.missing_shards)} are being rebuilt; the next "
                "checkpoint will be written once they are back"
            )
        staged = StagedCheckpoint(self._next_dest())
        directory = str(staged.path)
        try:
            t0 = time.monotonic()
            calls = [p.learner.save_part(directory, "learner")]
            calls += [s.save_part(directory, f"shard_{k}") for k, s in enumerate(p.shards)]
            entries = await asyncio.gather(*(call_with_timeout(c, timeout_s) for c in calls))
            staged.add_entry("learner", entries[0])
            for k, entry in enumerate(entries[1:]):
                staged.add_entry(f"shard_{k}", entry)
            staged.add_part("driver", plan_state(p))
            metadata = {
                "reason": reason,
                "time": time.time(),
                "write_s": time.monotonic() - t0,
                "timesteps_total": p.store.steps_total,
                "iteration": p.report.iteration,
                "num_shards": len(p.shards),
                "env_id": p.cfg.env.env_id,
                "config": p.cfg.to_dict(),
            }
            path = await asyncio.get_running_loop().run_in_executor(None, staged.commit, metadata)
        except BaseException:
            staged.abort()
            raise
        self.saved += 1
        self.last_path = path
        for old in checkpoints_in(self.root)[: -self.cfg.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return path

    async def restore(self, path: Path) -> dict[str, Any]:
        """Load checkpoint ``path`` into the learner, every shard and the plan; its metadata."""
        p = self.plan
        manifest = read_manifest(path)
        meta, parts = manifest["metadata"], manifest["parts"]
        if meta.get("env_id") != p.cfg.env.env_id:
            raise CheckpointError(
                f"{path}: written for env {meta.get('env_id')!r}, this run is {p.cfg.env.env_id!r}"
            )
        if meta.get("num_shards") != len(p.shards):
            raise CheckpointError(
                f"{path}: holds {meta.get('num_shards')} replay shards, this run has "
                f"{len(p.shards)}; resume with --set replay.num_shards={meta.get('num_shards')}"
            )
        timeout_s = max(p.timeout, 120.0)
        d = str(path)
        calls = [p.learner.load_part(d, parts["learner"])]
        calls += [s.load_part(d, parts[f"shard_{k}"]) for k, s in enumerate(p.shards)]
        loaded = await asyncio.gather(*(call_with_timeout(c, timeout_s) for c in calls))
        # rates of the first result after a resume count from the restored learner
        p.report.prev_learner = {"learner/updates": float(loaded[0]), "learner/grad_total_s": 0.0}
        state = await asyncio.get_running_loop().run_in_executor(
            None, read_part, path, parts["driver"]
        )
        load_plan_state(p, state)
        self.last_path = path
        return meta


def plan_state(plan: ExecutionPlan) -> dict[str, Any]:
    """The driver's part of a checkpoint: counters, iteration, eval history, RNG."""
    elapsed = 0.0 if plan.t_start is None else time.monotonic() - plan.t_start
    return {
        "steps_total": plan.store.steps_total,
        "weight_syncs": plan.store.weight_syncs,
        "iteration": plan.report.iteration,
        "time_s": elapsed,
        "eval_history": list(plan.report.eval_history),
        "faults": {**plan.faults.counters(), **plan.recovery.counters()},
        "retired": dict(plan.recovery.retired),
        "rng": plan.rng.bit_generator.state,
    }


def load_plan_state(plan: ExecutionPlan, state: dict[str, Any]) -> None:
    """Continue ``plan`` from :func:`plan_state` (before it runs)."""
    plan.store.steps_total = int(state["steps_total"])
    plan.store.weight_syncs = int(state["weight_syncs"])
    plan.report.iteration = int(state["iteration"])
    plan.report.eval_history = list(state["eval_history"])
    plan.t_start = time.monotonic() - float(state["time_s"])
    plan.faults.load_counters(state["faults"])
    plan.recovery.load_counters(state["faults"])
    plan.recovery.retired.update({k: int(v) for k, v in state.get("retired", {}).items()})
    plan.rng.bit_generator.state = state["rng"]
