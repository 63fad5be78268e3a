"""Result dicts of the Dask driver and its stop conditions (pure functions).

One result dict per iteration, flat ``{metric name: number}`` with the names of
``docs/metrics.md``. Rates are over the iteration (the window since the last
result); ``learner/busy_frac`` = (seconds the learner spent in updates during
the window) / (window wall seconds).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from apex_dask.algo.results import episode_metrics
from apex_dask.config import StopConfig

__all__ = ["IterationWindow", "build_result", "stop_reason"]

# Learner stats that are bookkeeping for the driver, not result metrics.
_INTERNAL = ("learner/grad_total_s", "errors", "thread_error", "device")


@dataclass
class IterationWindow:
    """What the driver saw between two results."""

    wall_s: float = 0.0
    steps: int = 0
    episode_returns: list[float] = field(default_factory=list)
    episode_lengths: list[int] = field(default_factory=list)


def _mean(xs: Sequence[float]) -> float:
    return float(sum(xs) / len(xs)) if xs else math.nan


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
    epsilons: Sequence[float],
    acting_versions: Sequence[int],
    weight_syncs: int,
    eval_result: Mapping[str, Any] | None,
    eval_time_s: float = 0.0,
    extra: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """Assemble one result dict.

    ``learner`` / ``shards`` / ``envs`` are the actors' metric-named stats;
    ``prev_learner`` the learner stats of the previous result (for rates);
    ``window`` holds the episodes of the lowest-epsilon third only.
    ``eval_result`` is an evaluation that finished during this iteration (its
    ``eval/return_mean`` appears only then, as in the in-process runner).
    ``sync/policy_lag`` = learner version - mean(acting versions);
    ``learner/replay_ratio`` = transitions trained / env steps sampled.
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
    for i, eps in enumerate(epsilons):
        out[f"env/epsilon/{i}"] = float(eps)
    if eval_result is not None:
        out["eval/return_mean"] = float(eval_result["return_mean"])
        out["eval/return_std"] = float(eval_result.get("return_std", math.nan))
    out["eval/time_s"] = float(eval_time_s)
    for name, value in learner.items():
        if name not in _INTERNAL and isinstance(value, int | float):
            out[name] = float(value)
    prev = prev_learner or {}
    d_updates = learner["learner/updates"] - prev.get("learner/updates", 0.0)
    d_grad = learner["learner/grad_total_s"] - prev.get("learner/grad_total_s", 0.0)
    out["learner/updates_per_s"] = d_updates / wall
    out["learner/busy_frac"] = min(1.0, d_grad / wall)
    out["learner/replay_ratio"] = learner["learner/steps_trained"] / max(steps_total, 1)
    size = 0.0
    stored = sampled = applied = 0.0
    for k, s in enumerate(shards):
        out.update(s)
        size += s.get(f"replay/{k}/size", 0.0)
        stored += s.get(f"replay/{k}/rollouts_stored", 0.0)
        sampled += s.get(f"replay/{k}/batches_sampled", 0.0)
        applied += s.get(f"replay/{k}/priority_updates_applied", 0.0)
    out["replay/size"] = size
    sent = 0.0
    for i, e in enumerate(envs):
        sent += e.get(f"env/{i}/rollouts_sent", 0.0)
    out["flow/rollouts_sent"] = sent
    out["flow/rollouts_stored"] = stored
    out["flow/batches_sampled"] = sampled
    out["flow/priority_updates_applied"] = applied
    out["sync/weight_syncs"] = float(weight_syncs)
    version = learner.get("learner/version", math.nan)
    out["sync/policy_lag"] = float(version - _mean([float(v) for v in acting_versions]))
    if extra:
        out.update({k: float(v) for k, v in extra.items()})
    return out


def stop_reason(stop: StopConfig, result: Mapping[str, float], use_eval: bool) -> str | None:
    """Why training should stop after ``result`` (a short phrase), or None to go on.

    The reward condition reads ``eval/return_mean`` when evaluation is on, else
    ``env/episode_return_mean``.
    """
    if stop.timesteps is not None and result["timesteps_total"] >= stop.timesteps:
        return f"timesteps_total >= {stop.timesteps}"
    if stop.time_s is not None and result["time_s"] >= stop.time_s:
        return f"time_s >= {stop.time_s:g}"
    if stop.iterations is not None and result["iteration"] >= stop.iterations:
        return f"iteration >= {stop.iterations}"
    if stop.reward is not None:
        key = "eval/return_mean" if use_eval else "env/episode_return_mean"
        value = result.get(key, math.nan)
        if not math.isnan(value) and value >= stop.reward:
            return f"{key} >= {stop.reward:g}"
    return None
