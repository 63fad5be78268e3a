"""Play whole episodes with a trained agent's weights: greedy, or epsilon-greedy.

::

    spec = AgentSpec("dqn", DQNConfig(hiddens=(64, 64)))
    policy = make_policy(spec, env.observation_space, env.action_space, weights)
    ret, length = play_episode(env, policy, seed=7, epsilon=0.0, rng=episode_rng(0, 7))
    out = play_episodes(factory, spec, weights, [7, 8, 9], base_seed=0, epsilon=0.05)

Episode ``i`` of an evaluation with base seed ``s`` resets its env with seed
``s + i`` and draws its exploration from ``numpy.random.default_rng([s, i])``
(:func:`episode_rng`): an episode is the same whichever process plays it and
whatever else that process played before, so an evaluation spread over any
number of workers gives the same returns as one played in a single process.

The policy is the agent's own (its builder's ``make_policy``: the DQN agent's
argmax of Q, the DPG agent's actor); with probability ``epsilon`` a step
takes a uniform random action. Returns are the env's own rewards over whole
episodes (``terminated or truncated``, or ``max_steps``), as the evaluator
counts them.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from apex_dask.algo.agents.registry import make_policy
from apex_dask.algo.agents.spec import AgentSpec, Policy
from apex_dask.algo.play.exported import PolicyFile

__all__ = ["episode_rng", "play_episode", "play_episodes"]


def episode_rng(base_seed: int, index: int) -> np.random.Generator:
    """The exploration generator of episode ``index`` of an evaluation seeded ``base_seed``."""
    return np.random.default_rng([int(base_seed), int(index)])


def play_episode(
    env: gym.Env,
    policy: Policy,
    *,
    seed: int | None,
    epsilon: float = 0.0,
    rng: np.random.Generator | None = None,
    max_steps: int | None = None,
) -> tuple[float, int]:
    """``(return, length)`` of one episode reset with ``seed``."""
    obs, _ = env.reset(seed=seed)
    policy.reset()
    total, length = 0.0, 0
    while True:
        obs, reward, terminated, truncated, _ = env.step(policy.act(obs, epsilon, rng))
        total += float(reward)
        length += 1
        if terminated or truncated or (max_steps is not None and length >= max_steps):
            return total, length


def play_episodes(
    env_factory: Callable[[], gym.Env],
    agent: AgentSpec | PolicyFile,
    weights: Mapping[str, Any],
    indices: Sequence[int],
    *,
    base_seed: int,
    epsilon: float = 0.0,
    max_steps: int | None = None,
    record: Collection[int] = (),
    render_factory: Callable[[], gym.Env] | None = None,
) -> list[dict[str, Any]]:
    """Play the episodes ``indices`` of an evaluation (see :func:`episode_rng`) with the
    policy of ``agent``'s weights, or an exported policy file's
    (:class:`~apex_dask.algo.play.exported.PolicyFile`; ``weights`` unused).

    Returns one dict per episode: ``index``, ``return``, ``length``,
    ``seconds`` and, for the indices in ``record``, ``video`` (the MP4's bytes,
    :class:`~apex_dask.algo.play.video.EpisodeVideo`, played on an env from
    ``render_factory``: the same env made with ``render_mode="rgb_array"``).
    """
    import time

    env = env_factory()
    try:
        torch.set_num_threads(1)
        if isinstance(agent, PolicyFile):  # an exported file, in its own runtime
            policy: Policy = agent.policy()
        else:
            policy = make_policy(agent, env.observation_space, env.action_space, weights)
        out = []
        for i in indices:
            t0 = time.perf_counter()
            video = None
            if i in record and render_factory is not None:
                from apex_dask.algo.play.video import EpisodeVideo

                video = EpisodeVideo(render_factory)
            ret, length = play_episode(
                env if video is None else video.env,
                policy,
                seed=int(base_seed) + int(i),
                epsilon=epsilon,
                rng=episode_rng(base_seed, i),
                max_steps=max_steps,
            )
            row: dict[str, Any] = {"index": int(i), "return": ret, "length": length}
            if video is not None:
                row["video"] = video.finish()
            row["seconds"] = time.perf_counter() - t0
            out.append(row)
        return out
    finally:
        env.close()
