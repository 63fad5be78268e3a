"""Actor and critic networks of the DPG agent, in torch and (for env workers) numpy.

For vector observations s (a ``Box`` of rank 1) and a bounded ``Box`` of actions:

    mu(s)    = center + half * tanh(MLP_actor(s))      center = (high + low) / 2
                                                       half   = (high - low) / 2
    Q_k(s, a) = MLP_k([s, a])                          k = 1, or 1 and 2 (twin_q)

Each MLP has ReLU layers of the given sizes and a final linear layer (no
activation). The module's state-dict names are ``actor.net.<i>.*``,
``critic.q1.<i>.*`` and ``critic.q2.<i>.*``: one flat weights dict serves the
learner, the env workers (:class:`NumpyDPG`) and checkpoints.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

__all__ = ["Actor", "Critic", "DPGModel", "NumpyDPG", "action_bounds", "build_dpg_model"]


def _mlp(sizes: Sequence[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(int(sizes[i]), int(sizes[i + 1])))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def action_bounds(action_space: spaces.Box) -> tuple[np.ndarray, np.ndarray]:
    """``(center, half)`` float32 arrays of a bounded Box (see the module docstring)."""
    low = np.asarray(action_space.low, np.float64).reshape(-1)
    high = np.asarray(action_space.high, np.float64).reshape(-1)
    return ((high + low) / 2).astype(np.float32), ((high - low) / 2).astype(np.float32)


class Actor(nn.Module):
    """mu(s): ReLU MLP, tanh, scaled to the action bounds."""

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        hiddens: Sequence[int],
        center: np.ndarray,
        half: np.ndarray,
    ) -> None:
        super().__init__()
        self.net = _mlp([obs_dim, *hiddens, act_dim])
        self.register_buffer("act_center", torch.as_tensor(center), persistent=False)
        self.register_buffer("act_half", torch.as_tensor(half), persistent=False)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.act_center + self.act_half * torch.tanh(self.net(obs.float().flatten(1)))


class Critic(nn.Module):
    """Q_1(s, a) and, with ``twin``, Q_2(s, a): ReLU MLPs on the concatenation [s, a]."""

    def __init__(self, obs_dim: int, act_dim: int, hiddens: Sequence[int], twin: bool) -> None:
        super().__init__()
        sizes = [obs_dim + act_dim, *hiddens, 1]
        self.q1 = _mlp(sizes)
        self.q2 = _mlp(sizes) if twin else None

    def forward(
        self, obs: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        x = torch.cat([obs.float().flatten(1), action.float()], dim=1)
        q2 = None if self.q2 is None else self.q2(x).squeeze(1)
        return self.q1(x).squeeze(1), q2


class DPGModel(nn.Module):
    """The actor and the critic together (one state dict, one weights version)."""

    def __init__(self, actor: Actor, critic: Critic) -> None:
        super().__init__()
        self.actor, self.critic = actor, critic


def build_dpg_model(
    observation_space: spaces.Space,
    action_space: spaces.Space,
    actor_hiddens: Sequence[int] = (256, 256),
    critic_hiddens: Sequence[int] = (256, 256),
    twin_q: bool = True,
) -> DPGModel:
    """The DPG model for these spaces; ``ValueError`` (one line) for spaces it cannot take."""
    if not (isinstance(action_space, spaces.Box) and len(action_space.shape) == 1):
        raise ValueError(
            f"unsupported action space {action_space!r}: the dpg agent needs a Box of rank 1"
        )
    if not np.all(np.isfinite(action_space.low)) or not np.all(np.isfinite(action_space.high)):
        raise ValueError(
            f"unsupported action space {action_space!r}: the dpg agent needs finite bounds"
        )
    if not (isinstance(observation_space, spaces.Box) and len(observation_space.shape) == 1):
        raise ValueError(
            f"unsupported observation space {observation_space!r}: "
            "the dpg agent needs a Box of rank 1 (a vector)"
        )
    obs_dim, act_dim = int(observation_space.shape[0]), int(action_space.shape[0])
    center, half = action_bounds(action_space)
    return DPGModel(
        Actor(obs_dim, act_dim, actor_hiddens, center, half),
        Critic(obs_dim, act_dim, critic_hiddens, twin_q),
    )


def _numpy_layers(weights: Mapping[str, np.ndarray], prefix: str) -> list:
    idx = sorted({int(k[len(prefix) :].split(".")[0]) for k in weights if k.startswith(prefix)})
    return [
        (
            np.ascontiguousarray(np.asarray(weights[f"{prefix}{i}.weight"], np.float32).T),
            np.asarray(weights[f"{prefix}{i}.bias"], np.float32),
        )
        for i in idx
    ]


def _forward(layers: list, x: np.ndarray) -> np.ndarray:
    for j, (w, b) in enumerate(layers):
        x = x @ w
        x += b
        if j < len(layers) - 1:
            np.maximum(x, 0.0, out=x)
    return x


class NumpyDPG:
    """Numpy forward passes of a :class:`DPGModel` from its weights dict (equal to torch's)."""

    def __init__(
        self, weights: Mapping[str, np.ndarray], center: np.ndarray, half: np.ndarray
    ) -> None:
        self.actor = _numpy_layers(weights, "actor.net.")
        self.q1 = _numpy_layers(weights, "critic.q1.")
        self.q2 = _numpy_layers(weights, "critic.q2.") or None
        self.center = np.asarray(center, np.float32)
        self.half = np.asarray(half, np.float32)

    def policy(self, obs: np.ndarray) -> np.ndarray:
        """mu(s), float32 (B, act_dim)."""
        h = _forward(self.actor, np.asarray(obs, np.float32).reshape(len(obs), -1))
        return self.center + self.half * np.tanh(h)

    def values(self, obs: np.ndarray, action: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(Q_1(s, a), min_k Q_k(s, a))`` float32 (B,) (the min is Q_1 without a twin)."""
        x = np.concatenate(
            [np.asarray(obs, np.float32).reshape(len(obs), -1), np.asarray(action, np.float32)],
            axis=1,
        )
        q1 = _forward(self.q1, x)[:, 0]
        if self.q2 is None:
            return q1, q1
        return q1, np.minimum(q1, _forward(self.q2, x)[:, 0])
