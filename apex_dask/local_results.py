"""The result dict of the in-process runner, with the names of ``docs/metrics.md``.

Quantities that only exist between processes take their in-process value:
no inqueue (``learner/queue_size`` 0, nothing blocked, nothing in flight or
lost), no failed actors, every shard local to the learner, no replay-ratio
waiting (the runner simply schedules fewer updates).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from apex_dask.algo.results import (
    episode_metrics,
    mean_or_nan,
    replay_metrics,
    window_stat_metrics,
)

if TYPE_CHECKING:
    from apex_dask.local import LocalApex

__all__ = ["local_result"]


def local_result(apex: LocalApex) -> dict[str, float]:
    """Flat ``{name: float}`` for the current iteration of ``apex``."""
    now = time.perf_counter()
    wall = max(now - apex._iter_start, 1e-9)
    lr = apex.learner
    updates = float(lr.num_updates)
    versions = [w.weights_version for w in apex.workers]
    out: dict[str, float] = {
        "iteration": float(apex.iteration + 1),
        "time_s": now - apex.start_time,
        "timesteps_total": float(apex.steps_sampled),
        "env/steps_sampled": float(apex.steps_sampled),
        "env/steps_per_s": (apex.steps_sampled - apex._iter_steps0) / wall,
        **episode_metrics(apex._iter_returns, apex._iter_lengths),
    }
    for i, (eps, worker) in enumerate(zip(apex.epsilons, apex.workers, strict=True)):
        out[f"env/epsilon/{i}"] = float(eps)
        out[f"env/{i}/steps_sampled"] = float(worker.steps_sampled)
        out[f"env/{i}/steps_per_s"] = (worker.steps_sampled - apex._iter_worker_steps0[i]) / wall
        out[f"env/{i}/rollouts_sent"] = float(apex.worker_rollouts[i])
        out[f"env/{i}/weights_version"] = float(worker.weights_version)
    ev = apex._iter_eval
    if ev is not None:
        out["eval/return_mean"] = float(ev["return_mean"])
        out["eval/return_std"] = float(ev["return_std"])
        out["eval/time_s"] = float(ev["duration_s"])
        out["eval/weights_version"] = float(ev["weights_version"])
    out.update(
        {
            "learner/steps_trained": float(lr.steps_trained),
            "learner/updates": updates,
            "learner/updates_per_s": (lr.num_updates - apex._iter_updates0) / wall,
            "learner/version": float(lr.version),
            "learner/weight_snapshots": float(apex.weight_snapshots),
            "learner/loss": mean_or_nan(apex._loss),
            "learner/mean_q": mean_or_nan(apex._mean_q),
            "learner/grad_norm": mean_or_nan(apex._grad_norm),
            "learner/dequeue_s": apex.dequeue_timer.mean,
            "learner/grad_s": apex.grad_timer.mean,
            "learner/overall_s": apex.overall_timer.mean,
            "learner/grad_total_s": apex.grad_timer.total_s,
            "learner/busy_frac": (apex.grad_timer.total_s - apex._iter_grad0) / wall,
            **window_stat_metrics("learner/queue_size", apex.queue_size.stats()),
            "learner/enqueue_blocked_s": 0.0,
            "learner/ratio_wait_s": 0.0,
            "learner/hook_calls": 0.0,
            "learner/local_shards": float(len(apex.shards)),
            "learner/target_updates": float(lr.num_target_updates),
            "learner/replay_ratio": lr.steps_trained / max(apex.steps_sampled, 1),
            **replay_metrics([s.stats() for s in apex.shards]),
            "sync/weight_syncs": float(apex.weight_syncs),
            "sync/policy_lag": lr.version - float(np.mean(versions)),
            "flow/rollouts_sent": float(apex.rollouts),
            "flow/rollouts_stored": float(apex.rollouts),
            "flow/batches_sampled": updates,
            "flow/batches_received": updates,
            "flow/batches_in_queue": 0.0,
            "flow/batches_trained": updates,
            "flow/priority_updates_sent": updates,
            "flow/priority_updates_applied": updates,
            "flow/priority_updates_failed": 0.0,
            "flow/batches_lost": 0.0,
            "faults/env_workers_replaced": 0.0,
            "faults/rollouts_failed": 0.0,
        }
    )
    for k in range(len(apex.shards)):
        out[f"replay/{k}/rollouts_stored"] = float(apex.shard_rollouts[k])
        out[f"replay/{k}/batches_sampled"] = float(apex.shard_batches[k])
        out[f"replay/{k}/priority_updates_applied"] = float(apex.shard_batches[k])
    return out
