"""Greedy evaluation episodes of an env worker (:class:`~apex_dask.algo.rollout.worker.ActingWorker`).

::

    out = greedy_episodes(worker, 10, seed=0, max_steps=27_000, timeout_s=300)

Episodes run on the worker's own evaluation env (made on first use, through
the worker's bounded :class:`~apex_dask.algo.envs.guard.EnvGuard`). An env
error (raised, hung, non-finite) follows the worker's policy: counted in
``worker.env_errors``, the episode in progress dropped and the env made
again, or :class:`~apex_dask.algo.envs.guard.EnvFailed`.
"""

from __future__ import annotations

import math
import time
from functools import partial
from typing import Any

import numpy as np

from apex_dask.algo.envs.guard import EnvFault, check_finite

__all__ = ["greedy_episodes"]


def _episode(
    worker: Any, env: Any, ep_seed: int, max_steps: int | None, deadline: float, frames: Any
):
    """``(return, length)`` of one greedy episode, or None if the deadline cut it."""
    guard, step = worker._guard, worker._eval_steps
    obs = worker._as_obs(guard.call("reset", lambda: env.reset(seed=ep_seed), step)[0])
    check_finite(obs, 0.0, worker.env_id, step, what="reset")
    worker._begin_eval_episode()
    if frames is not None:
        frames.offer(env, 0)
    total, length, done = 0.0, 0, False
    while not done:
        if time.monotonic() >= deadline:
            return None
        action = worker._greedy(obs) + worker._action_offset
        worker._eval_steps += 1
        step = worker._eval_steps
        obs, reward, terminated, truncated, _ = guard.call("step", partial(env.step, action), step)
        obs = worker._as_obs(obs)
        check_finite(obs, reward, worker.env_id, step)
        total += float(reward)
        length += 1
        if frames is not None:
            frames.offer(env, length)
        done = terminated or truncated or (max_steps is not None and length >= max_steps)
    return total, length


def greedy_episodes(
    worker: Any,
    num_episodes: int,
    seed: int | None = None,
    max_steps: int | None = None,
    timeout_s: float | None = None,
    frames: Any = None,
) -> dict[str, Any]:
    """Greedy (epsilon 0) episodes on a separate env instance, bounded in steps and time.

    Episode i resets with ``seed + i`` when ``seed`` is given, else with a seed
    from the worker's evaluation generator. ``max_steps`` cuts an episode
    (it then counts as a finished episode, as a time limit would).
    ``timeout_s`` bounds the whole evaluation: once that much wall time has
    passed, the episode in progress is dropped and no further one starts.
    Returns ``return_mean``, ``return_std`` (over the finished episodes;
    NaN for none), ``returns``, ``lengths`` and ``timed_out`` (bool).
    Returns and ``terminated`` are the env's own (raw scores, whole games).
    ``frames`` (an :class:`~apex_dask.algo.play.video.EpisodeFrames`) is offered the
    first episode's frames (the env must render ``rgb_array``).
    """
    deadline = math.inf if timeout_s is None else time.monotonic() + float(timeout_s)
    returns: list[float] = []
    lengths: list[int] = []
    timed_out = False
    for i in range(num_episodes):
        if time.monotonic() >= deadline:
            timed_out = True
            break
        ep_seed = seed + i if seed is not None else int(worker._eval_rng.integers(2**31))
        try:
            if worker._eval_env is None:
                worker._eval_env = worker._guard.make(worker.env_factory)
            shown = frames if i == 0 else None
            got = _episode(worker, worker._eval_env, ep_seed, max_steps, deadline, shown)
        except EnvFault as fault:
            worker.policy.record(fault, worker.where, "eval")  # EnvFailed: the run ends
            if worker._eval_env is not None:
                worker._guard.discard(worker._eval_env)
            worker._eval_env = None  # made again for the next episode
            continue
        if got is None:
            timed_out = True
            break
        worker.policy.completed(got[1], "eval")
        returns.append(got[0])
        lengths.append(got[1])
    return {
        "return_mean": float(np.mean(returns)) if returns else math.nan,
        "return_std": float(np.std(returns)) if returns else math.nan,
        "returns": returns,
        "lengths": lengths,
        "timed_out": timed_out,
    }
