"""The one result builder both runners call, with plain values.

One result dict per iteration, flat ``{metric name: number}`` with the names
of ``docs/metrics.md``. Each component's stats are first made metric-named
by the helpers below (the actors use them for the dashboard too), then
:func:`build_result` assembles them. Rates are over the iteration (the
window since the last result); ``learner/busy_frac`` = (seconds the learner
spent in updates during the window) / (window wall seconds).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from apex_dask.experiment.flow import (
    ROLLOUTS_LOST,
    ROLLOUTS_SENT,
    LearnerFlow,
    RetiredFlow,
    ShardFlow,
    rollouts_lost,
)
from apex_dask.experiment.stats import episode_metrics, mean_or_nan, window_stat_metrics
from apex_dask.experiment.timers import Timer, WindowStat

if TYPE_CHECKING:  # torch: the runners import it, the results module does not
    from apex_dask.algo.agents.base import LearnerProtocol

__all__ = [
    "IterationWindow",
    "build_result",
    "env_metrics",
    "env_summaries",
    "learner_metrics",
    "shard_metrics",
    "shard_stat",
]

# Learner stats that are bookkeeping for the driver, not result metrics.
_INTERNAL = ("errors", "thread_error", "device", "priority_ledger")
_SHARD_KEYS = (
    "size",
    "added",
    "sampled",
    "evicted",
    "stale_priority_updates",
    "bytes",
    "add_s",
    "sample_s",
    "update_s",
)


@dataclass
class IterationWindow:
    """What the runner saw between two results (episodes: lowest-epsilon third only)."""

    wall_s: float = 0.0
    steps: int = 0
    episode_returns: list[float] = field(default_factory=list)
    episode_lengths: list[int] = field(default_factory=list)


def shard_metrics(shard_id: int, stats: Mapping[str, Any], flow: ShardFlow) -> dict[str, float]:
    """``ReplayShard.stats()`` and the shard's hop counters as ``replay/<k>/<name>``."""
    k = shard_id
    out = {f"replay/{k}/{name}": float(stats[name]) for name in _SHARD_KEYS if name in stats}
    out.update(flow.shard_metrics(k))
    return out


def shard_stat(stats: Mapping[str, Any], shard_id: int, name: str) -> float:
    """Shard ``shard_id``'s ``name`` (e.g. ``added``) in metric-named ``stats`` (0 if absent)."""
    return float(stats.get(f"replay/{shard_id}/{name}", 0.0))


def env_metrics(
    index: int,
    *,
    exploration: float,
    exploration_name: str = "epsilon",
    steps_sampled: int,
    steps_per_s: float,
    rollouts_sent: int,
    weights_version: int,
    env_errors: int = 0,
    relay_syncs: int = 0,
    relay_fallbacks: int = 0,
    direct_blobs: int = 0,
) -> dict[str, float]:
    """One env worker's ``env/<i>/*`` counters and its exploration parameter
    ``env/<exploration_name>/<i>`` (its agent's: ``epsilon``, DPG's ``noise_scale``; the
    old name ``env/epsilon/<i>`` is still written beside another one this release)."""
    i = index
    alias = {} if exploration_name == "epsilon" else {f"env/epsilon/{i}": float(exploration)}
    return {
        f"env/{exploration_name}/{i}": float(exploration),
        **alias,
        f"env/{i}/steps_sampled": float(steps_sampled),
        f"env/{i}/steps_per_s": float(steps_per_s),
        f"env/{i}/rollouts_sent": float(rollouts_sent),
        f"env/{i}/weights_version": float(weights_version),
        f"env/{i}/env_errors": float(env_errors),
        f"env/{i}/relay_syncs": float(relay_syncs),
        f"env/{i}/relay_fallbacks": float(relay_fallbacks),
        f"env/{i}/direct_blobs": float(direct_blobs),
    }


_PER_WORKER = re.compile(r"^env/(-?\d+)/([a-z_]+)$")  # env/<i>/<x>
_EXPLORATION = re.compile(r"^env/([a-z_]+)/(-?\d+)$")  # env/<exploration>/<i>
SUMMARY_STATS = ("min", "q25", "q50", "q75", "max", "low_third_mean")


def env_summaries(envs: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Each env worker key summarised over the env workers: ``env/workers/<x>/<stat>`` for
    every ``env/<i>/<x>`` and exploration ``env/<e>/<i>`` (``x`` = ``e``), ``stat`` in
    :data:`SUMMARY_STATS`: min, quartiles, max, and the mean over the lowest-exploration
    third (the ``ceil(n / 3)`` workers with the smallest exploration parameter, the ones
    ``env/episode_return_mean`` reports; ties by index). NaN where no worker reported."""
    values: dict[str, dict[int, float]] = {}
    explore: dict[int, float] = {}
    for e in envs:
        for name, value in e.items():
            if m := _PER_WORKER.match(name):
                values.setdefault(m.group(2), {})[int(m.group(1))] = float(value)
            elif m := _EXPLORATION.match(name):
                i = int(m.group(2))
                values.setdefault(m.group(1), {})[i] = float(value)
                explore.setdefault(i, float(value))  # the agent's own name comes first
    ranked = sorted(explore, key=lambda i: (explore[i], i))
    low = set(ranked[: math.ceil(len(ranked) / 3)])
    out: dict[str, float] = {}
    for x, by_worker in sorted(values.items()):
        xs = np.asarray(list(by_worker.values()), dtype=np.float64)
        lows = [v for i, v in by_worker.items() if i in low]
        p = f"env/workers/{x}/"
        if xs.size == 0:
            out.update({p + s: math.nan for s in SUMMARY_STATS})
            continue
        q25, q50, q75 = np.quantile(xs, [0.25, 0.5, 0.75])
        out.update(
            {
                p + "min": float(xs.min()),
                p + "q25": float(q25),
                p + "q50": float(q50),
                p + "q75": float(q75),
                p + "max": float(xs.max()),
                p + "low_third_mean": mean_or_nan(lows),
            }
        )
    return out


def learner_metrics(
    learner: LearnerProtocol,
    *,
    dequeue: Timer,
    grad: Timer,
    grad_cpu: Timer,
    overall: Timer,
    queue_size: WindowStat,
    recent: Sequence[tuple[float, float, float]],
    flow: LearnerFlow,
    counters: Mapping[str, float],
    counts: Mapping[str, int] | None = None,
) -> dict[str, float]:
    """The learner's ``learner/*`` stats, its ``flow/*`` counters and ``counters``.

    ``learner`` is any agent's learner; ``recent`` the
    last updates' ``(loss, mean_q, grad_norm)``. ``counts``: the learner's
    :meth:`counters` as of the last batch ``flow`` counted (a learner training in
    another thread; default its counters now).
    """
    c = learner.counters() if counts is None else counts
    return {
        "learner/steps_trained": float(c["steps_trained"]),
        "learner/updates": float(c["num_updates"]),
        "learner/target_updates": float(c["num_target_updates"]),
        "learner/version": float(c["version"]),
        "learner/loss": mean_or_nan([r[0] for r in recent]),
        "learner/mean_q": mean_or_nan([r[1] for r in recent]),
        "learner/grad_norm": mean_or_nan([r[2] for r in recent]),
        "learner/dequeue_s": dequeue.mean,
        "learner/grad_s": grad.mean,
        "learner/grad_cpu_s": grad_cpu.mean,
        "learner/overall_s": overall.mean,
        "learner/grad_total_s": grad.total_s,
        **window_stat_metrics("learner/queue_size", queue_size.stats()),
        # learner/device_* and h2d_s on a CUDA learner; absent (not zero) elsewhere
        **learner.device_stats(),
        **learner.agent_stats(),  # what its agent declares (its builder's ``metrics``)
        **{name: float(v) for name, v in counters.items()},
        **flow.metrics(),
    }


def build_result(
    *,
    iteration: int,
    time_s: float,
    window: IterationWindow,
    steps_total: int,
    learner: Mapping[str, Any],
    prev_learner: Mapping[str, Any] | None,
    shards: Sequence[Mapping[str, float]],
    envs: Sequence[Mapping[str, float]],
    acting_versions: Sequence[int],
    weight_syncs: int,
    eval_result: Mapping[str, Any] | None,
    extra: Mapping[str, float] | None = None,
    retired: RetiredFlow | None = None,
    per_worker_keys: bool = False,
) -> dict[str, float]:
    """Assemble one result dict.

    ``learner`` / ``shards`` / ``envs`` are metric-named stats (see the helpers
    above); ``prev_learner`` the learner stats of the previous result (for
    rates); ``window`` holds the episodes of the lowest-epsilon third only.
    ``eval_result`` is an evaluation that finished during this iteration
    (``return_mean``, ``return_std``, ``duration_s``, ``weights_version``,
    ``timed_out``);
    ``eval/*`` appears only then. Env workers' own keys are summarised
    (:func:`env_summaries`: a row of the same size at any worker count);
    ``per_worker_keys`` adds them as they are too. ``retired``: the lost actors' last flow
    counters, added to the live ones'. ``sync/policy_lag`` = learner version -
    mean(acting versions); ``learner/replay_ratio`` = transitions trained /
    env steps sampled. ``extra`` (fault counters) is copied as is; a runner whose env
    workers can die passes its own ``flow/rollouts_sent`` there (rollouts it asked
    for whose call finished, a dead worker's included: its own counter died with
    it). ``flow/rollouts_lost`` = sent - stored, never below 0: the rollouts whose
    call failed and that no shard stored, once nothing is in transit.
    """
    wall = max(window.wall_s, 1e-9)
    out: dict[str, float] = {
        "iteration": float(iteration),
        "time_s": float(time_s),
        "timesteps_total": float(steps_total),
        "env/steps_sampled": float(steps_total),
        "env/steps_per_s": window.steps / wall,
        **episode_metrics(window.episode_returns, window.episode_lengths),
    }
    sent = 0.0
    for e in envs:
        if per_worker_keys:
            out.update(e)
        sent += sum(
            v for k, v in e.items() if k.startswith("env/") and k.endswith("/rollouts_sent")
        )
    out.update(env_summaries(envs))
    if eval_result is not None:
        out["eval/return_mean"] = float(eval_result["return_mean"])
        out["eval/return_std"] = float(eval_result.get("return_std", math.nan))
        out["eval/time_s"] = float(eval_result.get("duration_s", math.nan))
        out["eval/weights_version"] = float(eval_result.get("weights_version", math.nan))
        out["eval/timed_out"] = float(bool(eval_result.get("timed_out", False)))
    for name, value in learner.items():
        if name not in _INTERNAL and isinstance(value, int | float):
            out[name] = float(value)
    prev = prev_learner or {}
    d_updates = learner["learner/updates"] - prev.get("learner/updates", 0.0)
    d_grad = learner["learner/grad_total_s"] - prev.get("learner/grad_total_s", 0.0)
    out["learner/updates_per_s"] = d_updates / wall
    out["learner/busy_frac"] = min(1.0, d_grad / wall)
    out["learner/replay_ratio"] = learner["learner/steps_trained"] / max(steps_total, 1)
    size = stale = 0.0
    for k, s in enumerate(shards):
        out.update(s)
        size += shard_stat(s, k, "size")
        stale += shard_stat(s, k, "stale_priority_updates")
    out["replay/size"] = size
    out["replay/stale_priority_updates"] = stale
    out[ROLLOUTS_SENT] = sent
    out.update(ShardFlow.total(list(shards)).metrics())
    out["sync/weight_syncs"] = float(weight_syncs)
    version = learner.get("learner/version", math.nan)
    out["sync/policy_lag"] = float(version - mean_or_nan([float(v) for v in acting_versions]))
    if extra:
        out.update({k: float(v) for k, v in extra.items()})
    if retired is not None:
        retired.add_to(out)
    # sent = stored + lost + in transit; after a halt nothing is in transit
    out[ROLLOUTS_LOST] = rollouts_lost(out)
    return out
