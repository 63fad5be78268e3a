"""A shard rebuilt on the learner's worker takes the late priority updates of the lost one
as stale, and the learner's priority sender goes on (a real 2-process LocalCluster).

The learner trains on shard 0 (50 items) on its own worker: the shard is called
as a local object and its priority updates are applied inline by the sender.
Shard 0 is then replaced by a rebuilt one holding 3 items, as the recovery does
after a fault: the batches already queued carry slots up to 49, which the
rebuilt shard never held. Those updates are counted stale; the sender lives on,
and the updates for the rebuilt shard's own items land.
"""

from __future__ import annotations

import numpy as np
import pytest
from polling import poll
from test_actors import make_learner, make_shard, rollout

pytestmark = pytest.mark.slow  # the module's 2-process LocalCluster


def test_late_updates_to_a_smaller_rebuilt_local_shard_are_stale_and_the_sender_goes_on(
    client, worker_addresses
):
    from apex_dask.algo.envs.factory import make_env_factory
    from apex_dask.algo.envs.probe import probe_spaces

    rng = np.random.default_rng(3)
    here = worker_addresses[0]
    old = make_shard(client, here, 0, learning_starts=1, batch_size=16)
    old.result().add(rollout(50, rng)).result()
    spaces = probe_spaces(make_env_factory("CartPole-v1"))
    learner = make_learner(client, here, spaces, [old], inqueue_size=16).result()
    learner.start().result()
    poll(lambda: learner.stats().result()["flow/batches_trained"] > 20, 60)
    assert learner.stats().result()["learner/local_shards"] == 1

    rebuilt_fut = make_shard(client, here, 0, learning_starts=1, batch_size=16)  # kept: alive
    rebuilt = rebuilt_fut.result()
    rebuilt.add(rollout(3, rng)).result()
    learner.set_shard(0, rebuilt).result()  # as the recovery does, with the new handle

    def own_updates_land():
        s = rebuilt.stats().result()
        return s["replay/0/priority_updates_applied"] >= 10 and s

    stats = poll(own_updates_land, 60)
    assert stats["replay/0/stale_priority_updates"] > 0  # the lost shard's slots: stale
    final = learner.stop().result()
    assert final["flow/priority_updates_failed"] == 0  # stale, never an error
    assert learner.thread_error().result() is None
    after = rebuilt.stats().result()
    applied = after["replay/0/priority_updates_applied"] + after.get(
        "replay/0/priority_updates_stale", 0
    )
    # every update the learner sent after the switch reached the rebuilt shard
    assert applied > 0 and final["learner/outbox_size"] == 0
