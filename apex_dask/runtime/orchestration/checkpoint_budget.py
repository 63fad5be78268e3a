"""What a checkpoint written inside a stop's grace keeps, from how long the last one took.

::

    history = WriteHistory()
    history.record(manifest["parts"])            # after every checkpoint written or loaded
    budget = SaveBudget.within(8.0)              # seconds for the whole checkpoint
    kwargs = history.shard_kwargs(k, budget, n)  # save_part(..., budget_s=, s_per_item=, ...)
    left = left_out(entries)                     # None: every replay item was saved
    left["summary"]                              # one line, e.g. for the console

A stop (SIGTERM, SIGUSR1, Ctrl-C) has ``checkpoint.grace_s`` for everything;
the checkpoint gets what the halt and the weights left, less a reserve for
committing it. The learner's part and the driver's are always written (they
are small); each replay shard writes as many of its newest items as its last
write's seconds per item say fit in its budget
(:meth:`~apex_dask.runtime.actors.replay_shard.ReplayShardActor.save_part`),
and abandons a write that outlasts it (its part then holds no items, only the
shard's counters). With no earlier write to go by, a shard tries to write
everything within its budget. The manifest's metadata says what was left out
(``left_out``); ``--resume`` loads such a checkpoint as it is: each shard
continues with the items saved.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["SaveBudget", "WriteHistory", "left_out"]


@dataclass(frozen=True)
class SaveBudget:
    """The seconds a checkpoint has: parts until ``parts_end``, the commit until ``end``
    (``time.monotonic()`` of the driver)."""

    end: float
    parts_end: float

    @classmethod
    def within(cls, seconds: float) -> SaveBudget:
        """A budget of ``seconds`` from now; the commit (manifest, rename, fsync) keeps a
        tenth of it, between 0.2 and 2 s."""
        now = time.monotonic()
        reserve = min(2.0, max(0.2, 0.1 * seconds))
        return cls(end=now + seconds, parts_end=now + max(0.0, seconds - reserve))

    def parts_s(self) -> float:
        """Seconds left for the parts (0 when spent)."""
        return max(0.0, self.parts_end - time.monotonic())

    def shard_s(self) -> float:
        """Seconds a shard may spend on its items: 75% of the parts' time (the call
        reaches a busy worker late, a write stops at its next chunk) less what writing
        a part without items takes if its write must be abandoned."""
        left = self.parts_s()
        return max(0.0, 0.75 * left - min(1.0, 0.1 * left))


class WriteHistory:
    """Seconds per replay item of each shard's last checkpoint write (that wrote items)."""

    def __init__(self) -> None:
        self.s_per_item: dict[int, float] = {}

    def record(self, parts: Mapping[str, Mapping[str, Any]]) -> None:
        """Learn from a manifest's ``parts`` (entries with ``write_s`` and ``items``; a
        manifest written before they existed teaches nothing)."""
        for name, entry in parts.items():
            if not name.startswith("shard_"):
                continue
            items, write_s = entry.get("items"), entry.get("write_s")
            if not items or write_s is None or entry.get("left_out", "").startswith("its write"):
                continue
            self.s_per_item[int(name[len("shard_") :])] = float(write_s) / int(items)

    def shard_kwargs(self, k: int, budget: SaveBudget, writers: int) -> dict[str, Any]:
        """``budget_s``, ``s_per_item`` and ``writers`` (the shards writing at once) for
        shard ``k``'s ``save_part``."""
        return {
            "budget_s": budget.shard_s(),
            "s_per_item": self.s_per_item.get(k),
            "writers": writers,
        }


def left_out(entries: Mapping[str, Mapping[str, Any]]) -> dict[str, Any] | None:
    """What a checkpoint's shard ``entries`` left out of the replay: ``summary`` (one
    line), ``items_saved``, ``items_held`` and per shard ``shards`` (``saved``,
    ``held``, ``why``); None when every item was saved."""
    shards: dict[str, dict[str, Any]] = {}
    saved = held = 0
    for name, entry in sorted(entries.items()):
        if not name.startswith("shard_") or "held" not in entry:
            continue
        s, h = int(entry["items"]), int(entry["held"])
        saved, held = saved + s, held + h
        if s < h:
            shards[name[len("shard_") :]] = {"saved": s, "held": h, "why": entry.get("left_out")}
    if not shards:
        return None
    abandoned = sorted(k for k, v in shards.items() if (v["why"] or "").startswith("its write"))
    summary = f"replay: {saved:,} of {held:,} items saved (the newest of each shard)"
    if abandoned:
        which = ", ".join(abandoned)
        summary += f"; shard {which}: the write did not finish in time, only counters saved"
    return {"summary": summary, "items_saved": saved, "items_held": held, "shards": shards}
