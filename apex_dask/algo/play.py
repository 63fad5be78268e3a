"""Play whole episodes with trained Q-network weights: greedy, or epsilon-greedy.

::

    policy = QPolicy(env.observation_space, env.action_space, weights, hiddens=(64, 64))
    ret, length = play_episode(env, policy, seed=7, epsilon=0.0, rng=episode_rng(0, 7))
    out = play_episodes(factory, weights, [7, 8, 9], epsilon=0.05, hiddens=(64, 64))

Episode ``i`` of an evaluation with base seed ``s`` resets its env with seed
``s + i`` and draws its exploration from ``numpy.random.default_rng([s, i])``
(:func:`episode_rng`): an episode is the same whichever process plays it and
whatever else that process played before, so an evaluation spread over any
number of workers gives the same returns as one played in a single process.

With probability ``epsilon`` a step takes a uniform random action, else
``argmax_a Q(s, a)``. Vector observations run through the numpy MLP
(:class:`~apex_dask.algo.networks.NumpyMLPQ`, as the env workers do), images
through torch. Returns are the env's own rewards over whole episodes
(``terminated or truncated``, or ``max_steps``), as the evaluator counts them.

A ``dpg`` run's weights (actor and critic, :mod:`apex_dask.algo.dpg_networks`)
play through :class:`DPGPolicy`: the deterministic policy mu(s), no noise; with
probability ``epsilon`` a step takes a uniform random action within the
bounds. :func:`make_policy` builds either from ``algo``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces

from apex_dask.algo.networks import NumpyMLPQ, build_q_network

__all__ = [
    "DPGPolicy",
    "QPolicy",
    "WeightsMismatch",
    "check_weights",
    "episode_rng",
    "make_policy",
    "play_episode",
    "play_episodes",
]


class WeightsMismatch(ValueError):
    """Weights that do not fit the network a config builds; the message is one line."""


def check_weights(net: torch.nn.Module, weights: Mapping[str, Any]) -> None:
    """Raise :class:`WeightsMismatch` unless ``weights`` has exactly ``net``'s tensors,
    each of the same shape (the first difference is named)."""
    want = {k: tuple(v.shape) for k, v in net.state_dict().items()}
    missing = [k for k in want if k not in weights]
    if missing:
        raise WeightsMismatch(f"the weights lack {missing[0]!r} ({len(missing)} tensor(s) missing)")
    extra = [k for k in weights if k not in want]
    if extra:
        raise WeightsMismatch(f"the weights hold {extra[0]!r}, which the network does not have")
    for k, shape in want.items():
        got = tuple(np.shape(weights[k]))
        if got != shape:
            raise WeightsMismatch(f"{k!r} has shape {list(got)}, the network wants {list(shape)}")
        if not np.all(np.isfinite(np.asarray(weights[k], dtype=np.float64))):
            raise WeightsMismatch(f"{k!r} holds NaN or inf")


def episode_rng(base_seed: int, index: int) -> np.random.Generator:
    """The exploration generator of episode ``index`` of an evaluation seeded ``base_seed``."""
    return np.random.default_rng([int(base_seed), int(index)])


class QPolicy:
    """Actions from trained weights for one pair of spaces (see the module docstring)."""

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        weights: Mapping[str, Any],
        hiddens: Sequence[int] = (256,),
        dueling: bool = True,
    ) -> None:
        self.net = build_q_network(observation_space, action_space, hiddens, dueling)
        check_weights(self.net, weights)
        self.net.load_state_dict({k: torch.as_tensor(np.asarray(v)) for k, v in weights.items()})
        self.net.eval()
        self.numpy_net = None
        if len(observation_space.shape) == 1:
            self.numpy_net = NumpyMLPQ({k: np.asarray(v) for k, v in weights.items()})
        self.num_actions = int(action_space.n)
        self.offset = int(action_space.start)
        self.dtype = observation_space.dtype

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        """float32 Q-values (B, A) of a batch of observations."""
        if self.numpy_net is not None:
            return self.numpy_net.q_values(np.asarray(obs, np.float32))
        with torch.inference_mode():
            return self.net(torch.as_tensor(np.asarray(obs, self.dtype))).numpy()

    def act(self, obs: Any, epsilon: float = 0.0, rng: np.random.Generator | None = None) -> int:
        """The env's action for one observation (``action_space.start`` added)."""
        if epsilon > 0.0 and rng is not None and rng.random() < epsilon:
            return int(rng.integers(self.num_actions)) + self.offset
        q = self.q_values(np.asarray(obs, self.dtype)[None])[0]
        return int(np.argmax(q)) + self.offset


class DPGPolicy:
    """Actions of a ``dpg`` run's deterministic policy mu(s) (see the module docstring)."""

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        weights: Mapping[str, Any],
        actor_hiddens: Sequence[int] = (256, 256),
        critic_hiddens: Sequence[int] = (256, 256),
        twin_q: bool = True,
    ) -> None:
        from apex_dask.algo.dpg_networks import NumpyDPG, action_bounds, build_dpg_model

        model = build_dpg_model(
            observation_space, action_space, actor_hiddens, critic_hiddens, twin_q
        )
        check_weights(model, weights)
        center, half = action_bounds(action_space)
        self.numpy_net = NumpyDPG({k: np.asarray(v) for k, v in weights.items()}, center, half)
        self.low, self.high = action_space.low, action_space.high
        self.shape, self.dtype = action_space.shape, action_space.dtype

    def act(
        self, obs: Any, epsilon: float = 0.0, rng: np.random.Generator | None = None
    ) -> np.ndarray:
        """The env's action for one observation (float, the action space's shape)."""
        if epsilon > 0.0 and rng is not None and rng.random() < epsilon:
            return rng.uniform(self.low, self.high).astype(self.dtype)
        action = self.numpy_net.policy(np.asarray(obs, np.float32)[None])[0]
        return np.clip(action, self.low, self.high).astype(self.dtype).reshape(self.shape)


def make_policy(
    observation_space: spaces.Space,
    action_space: spaces.Space,
    weights: Mapping[str, Any],
    *,
    algo: str = "dqn",
    hiddens: Sequence[int] = (256,),
    dueling: bool = True,
    dpg: Mapping[str, Any] | None = None,
) -> QPolicy | DPGPolicy:
    """The policy of a run's weights: :class:`QPolicy` (``dqn``: ``hiddens``,
    ``dueling``) or :class:`DPGPolicy` (``dpg``: the ``dpg`` dict's
    ``actor_hiddens``, ``critic_hiddens``, ``twin_q``). :class:`WeightsMismatch`
    if the weights do not fit; ``ValueError`` for spaces the agent cannot take."""
    if algo == "dpg":
        keys = ("actor_hiddens", "critic_hiddens", "twin_q")
        nets = {k: v for k, v in (dpg or {}).items() if k in keys}
        return DPGPolicy(observation_space, action_space, weights, **nets)
    if algo != "dqn":
        raise ValueError(f"algo must be 'dqn' or 'dpg', got {algo!r}")
    return QPolicy(observation_space, action_space, weights, hiddens, dueling)


def play_episode(
    env: gym.Env,
    policy: QPolicy | DPGPolicy,
    *,
    seed: int | None,
    epsilon: float = 0.0,
    rng: np.random.Generator | None = None,
    max_steps: int | None = None,
) -> tuple[float, int]:
    """``(return, length)`` of one episode reset with ``seed``."""
    obs, _ = env.reset(seed=seed)
    total, length = 0.0, 0
    while True:
        obs, reward, terminated, truncated, _ = env.step(policy.act(obs, epsilon, rng))
        total += float(reward)
        length += 1
        if terminated or truncated or (max_steps is not None and length >= max_steps):
            return total, length


def play_episodes(
    env_factory: Callable[[], gym.Env],
    weights: Mapping[str, Any],
    indices: Sequence[int],
    *,
    base_seed: int,
    epsilon: float = 0.0,
    hiddens: Sequence[int] = (256,),
    dueling: bool = True,
    max_steps: int | None = None,
    record: Collection[int] = (),
    render_factory: Callable[[], gym.Env] | None = None,
    algo: str = "dqn",
    dpg: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Play the episodes ``indices`` of an evaluation (see :func:`episode_rng`) with the
    policy :func:`make_policy` builds from ``algo`` and the network keys.

    Returns one dict per episode: ``index``, ``return``, ``length``,
    ``seconds`` and, for the indices in ``record``, ``video`` (the MP4's bytes,
    :class:`~apex_dask.algo.video.EpisodeVideo`, played on an env from
    ``render_factory``: the same env made with ``render_mode="rgb_array"``).
    """
    import time

    env = env_factory()
    try:
        torch.set_num_threads(1)
        policy = make_policy(
            env.observation_space,
            env.action_space,
            weights,
            algo=algo,
            hiddens=hiddens,
            dueling=dueling,
            dpg=dpg,
        )
        out = []
        for i in indices:
            t0 = time.perf_counter()
            video = None
            if i in record and render_factory is not None:
                from apex_dask.algo.video import EpisodeVideo

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
