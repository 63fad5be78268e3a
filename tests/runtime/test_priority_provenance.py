"""Priority updates reach only the items they were computed for, end to end on Dask.

A CartPole run on a real 2-process LocalCluster with the shards in the other
worker process, so every batch reaches the learner through a shared-memory slot
that the shard rewrites as soon as the learner frees it (few slots, a fast
shard). With ``replay.audit_priorities`` each priority update carries a checksum
of every item the learner trained on, and the shard compares it with the data
stored where the update lands: all must agree. The replay is small, so items
are overwritten between their sample and their update: those updates are
skipped and counted, never applied to the newcomer.
"""

from __future__ import annotations

import pytest

from apex_dask.config import ApexConfig
from apex_dask.runtime.orchestration.driver import train

pytestmark = pytest.mark.slow


def test_every_applied_update_lands_on_the_items_its_batch_trained_on(client):
    cfg = ApexConfig.preset("cartpole").override(
        {
            "replay.placement": "learner_host",
            "replay.shared_memory": True,
            "replay.audit_priorities": True,
            "replay.num_shards": 2,
            "replay.capacity": 1500,  # each item lives well under a second
            "replay.learning_starts": 400,
            "learner.prefetch_per_shard": 1,  # 5 slots per shard: each reused quickly
            "report.min_iter_time_s": 0.5,
            "report.timesteps_per_iteration": 1000,
            "eval.interval_s": 1e9,
            "topology.call_timeout_s": 30.0,
        }
    )
    results = train(cfg, client, stop={"iterations": 6})
    last = results[-1]
    shards = range(cfg.replay.num_shards)
    checked = sum(last[f"replay/{k}/audit_checked"] for k in shards)
    differ = sum(last[f"replay/{k}/audit_mismatches"] for k in shards)
    stale = sum(last[f"replay/{k}/stale_priority_updates"] for k in shards)
    assert last["learner/shared_batches"] >= 20  # the slots were read and reused many times
    assert last["learner/local_shards"] == 0
    assert last["flow/priority_updates_applied"] >= 20
    # every item that an update reached held the data its batch trained on
    assert checked > 0 and differ == 0
    # some items were overwritten between sample and update, and kept their priority
    assert stale > 0 and last["replay/stale_priority_updates"] == stale
    sampled = sum(last[f"replay/{k}/sampled"] for k in shards)
    assert checked + stale <= sampled
