"""A checkpoint inside a stop's grace: parts written by a deadline, keeping what fits.

- ``write_part`` with a deadline (or abandoned) removes its half-written file;
- a shard's budgeted ``save_part`` keeps the newest items the last write's seconds
  per item say fit, abandons a write that outlasts its budget (a part with the
  counters only is written then), and what it wrote loads into a new shard;
- the budget, the write history and the ``left_out`` line of a checkpoint.

The shard actors run in this process (their async methods awaited directly, as
in ``test_actors_in_process.py``); the whole stop on a real cluster is in
``tests/e2e/test_stop_grace.py``.
"""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest
from test_actors_in_process import shard, transitions

from apex_dask.experiment.checkpoints.store import CheckpointTimeout, read_part, write_part
from apex_dask.runtime.actors import replay_shard
from apex_dask.runtime.actors.replay_shard import PLAN_SHARE
from apex_dask.runtime.orchestration.checkpoint_budget import SaveBudget, WriteHistory, left_out


def test_a_part_past_its_deadline_is_not_left_half_written(tmp_path):
    tree = {"a": np.arange(1 << 20, dtype=np.float64)}  # 8 MB: several writes
    with pytest.raises(CheckpointTimeout, match="not written by its deadline"):
        write_part(tmp_path, "late", tree, deadline=time.monotonic() - 1.0)
    abandon = threading.Event()
    abandon.set()
    with pytest.raises(CheckpointTimeout):
        write_part(tmp_path, "abandoned", tree, abandon=abandon)
    assert list(tmp_path.iterdir()) == []
    entry = write_part(tmp_path, "in_time", tree, deadline=time.monotonic() + 60.0)
    np.testing.assert_array_equal(read_part(tmp_path, entry)["a"], tree["a"])


def test_a_budgeted_shard_part_keeps_the_newest_items_that_fit_and_loads(tmp_path):
    s_per_item, budget_s = 1e-3, 0.1

    async def scenario():
        a = shard(0, capacity=1024)
        for i in range(5):
            await a.add(transitions(200, i), np.linspace(0.1, 3.0, 200, dtype=np.float32))
        entry = await a.save_part(str(tmp_path), "shard_0", budget_s, s_per_item)
        b = shard(0, capacity=1024)
        held = await b.load_part(str(tmp_path), entry)
        return entry, held, a._shard, b._shard

    entry, held, a, b = asyncio.run(scenario())
    keep = int(PLAN_SHARE * budget_s / s_per_item)  # 70 of the 1,000 items
    assert entry["items"] == held == keep and entry["held"] == 1000
    assert entry["left_out"] == f"the newest {keep} items fit in 0.1 s"
    assert entry["write_s"] > 0
    got, want = b.items_at(b.stored_slots()), a.items_at(a.stored_slots()[:keep])
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    assert b.stats()["added"] == a.stats()["added"] == 1000


def test_a_shard_write_that_outlasts_its_budget_leaves_a_part_with_its_counters(tmp_path):
    async def scenario():
        a = shard(1, capacity=4096)
        for i in range(4):
            await a.add(transitions(1000, i))
        # the rate says everything fits, the budget is spent before the first byte
        entry = await a.save_part(str(tmp_path), "shard_1", 1e-9, 1e-15)
        b = shard(1, capacity=4096)
        return entry, await b.load_part(str(tmp_path), entry), b._shard.stats()

    entry, held, stats = asyncio.run(scenario())
    assert entry["items"] == held == 0 and entry["held"] == 4000
    assert entry["left_out"].startswith("its write did not finish in")
    assert stats["added"] == 4000  # the counters carry on
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shard_1.npz"]


def test_without_history_a_shard_plans_for_a_cautious_disk_shared_by_the_writers(
    tmp_path, monkeypatch
):
    # a slow disk to plan for, so that the 2,000 small items do not all fit in 0.5 s
    monkeypatch.setattr(replay_shard, "FIRST_BYTES_PER_S", 1e5)

    async def scenario():
        a = shard(2, capacity=2048)
        await a.add(transitions(2000, 0))
        per_slot = a._shard.stats()["bytes"] / 2048
        alone = await a.save_part(str(tmp_path / "1"), "shard_2", 0.5, None, 1)
        shared = await a.save_part(str(tmp_path / "4"), "shard_2", 0.5, None, 4)
        return per_slot, alone, shared

    for sub in ("1", "4"):
        (tmp_path / sub).mkdir()
    per_slot, alone, shared = asyncio.run(scenario())
    assert alone["items"] == int(PLAN_SHARE * 0.5 / (per_slot / 1e5)) < 2000
    assert shared["items"] == int(PLAN_SHARE * 0.5 / (per_slot / (1e5 / 4)))


def test_the_budget_keeps_a_reserve_for_the_commit_and_shards_answer_well_before_it():
    budget = SaveBudget.within(10.0)
    assert budget.end - budget.parts_end == pytest.approx(1.0)  # a tenth, 0.2..2 s
    assert 0 < budget.shard_s() < 0.8 * budget.parts_s()
    tiny = SaveBudget.within(0.5)
    assert tiny.end - tiny.parts_end == pytest.approx(0.2)


def test_the_write_history_learns_seconds_per_item_from_whole_writes_only():
    history = WriteHistory()
    history.record(
        {
            "learner": {"write_s": 1.0},
            "shard_0": {"items": 500, "write_s": 2.0},
            "shard_1": {"items": 0, "write_s": 0.1},  # nothing to learn from
            "shard_2": {"items": 10, "write_s": 3.0, "left_out": "its write did not finish"},
            "shard_3": {"items": 100, "held": 400, "write_s": 0.5, "left_out": "the newest 100"},
        }
    )
    assert history.s_per_item == {0: 2.0 / 500, 3: 0.5 / 100}
    kwargs = history.shard_kwargs(0, SaveBudget.within(5.0), 4)
    assert kwargs["s_per_item"] == 2.0 / 500 and kwargs["writers"] == 4
    assert history.shard_kwargs(1, SaveBudget.within(5.0), 4)["s_per_item"] is None


def test_left_out_is_none_when_everything_was_saved_and_else_one_line():
    whole = {"learner": {}, "shard_0": {"items": 5, "held": 5}, "shard_1": {"items": 7, "held": 7}}
    assert left_out(whole) is None
    part = {
        "shard_0": {"items": 1000, "held": 4000, "left_out": "the newest 1000 items fit in 2 s"},
        "shard_1": {"items": 0, "held": 3000, "left_out": "its write did not finish in 2 s"},
    }
    got = left_out(part)
    assert got["items_saved"] == 1000 and got["items_held"] == 7000
    assert "\n" not in got["summary"]
    assert got["summary"] == (
        "replay: 1,000 of 7,000 items saved (the newest of each shard); "
        "shard 1: the write did not finish in time, only counters saved"
    )
    assert got["shards"]["1"] == {"saved": 0, "held": 3000, "why": part["shard_1"]["left_out"]}
