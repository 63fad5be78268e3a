"""Run folders as ``apex-dask-submit`` leaves them, with weights that are known to play well.

``cartpole_run(folder)`` writes ``config.yaml`` (the ``cartpole`` preset) and
``weights.npz`` whose dueling MLP computes ``Q(s, 1) - Q(s, 0) = w . s`` for a
linear controller that balances the pole for all 500 steps: an agent as good
as a trained one, without minutes of training in every test. ``minatar_run``
writes the ``minatar`` preset with the network's seeded initial weights.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from apex_dask.algo.agents.base import module_weights
from apex_dask.algo.agents.dqn.networks import build_q_network
from apex_dask.cli.outdir import save_weights, write_text
from apex_dask.config import ApexConfig

CONTROLLER = np.array([0.01, 0.05, 1.0, 0.5], np.float32)
"""push right when 0.01 x + 0.05 x' + theta + 0.5 theta' > 0."""


def cartpole_weights(hiddens: tuple[int, ...] = (128, 128)) -> dict[str, np.ndarray]:
    """Dueling-MLP weights whose greedy action is the linear controller's."""
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    net = build_q_network(env.observation_space, env.action_space, hiddens, dueling=True)
    w = {k: np.zeros_like(v) for k, v in module_weights(net).items()}
    w["trunk.0.weight"][0], w["trunk.0.weight"][1] = CONTROLLER, -CONTROLLER
    for i in range(1, len(hiddens)):  # pass (relu(u), relu(-u)) on unchanged
        w[f"trunk.{2 * i}.weight"][0, 0] = w[f"trunk.{2 * i}.weight"][1, 1] = 1.0
    w["head.advantage.weight"][1, 0], w["head.advantage.weight"][1, 1] = 1.0, -1.0
    return w


def cartpole_run(folder: Path, version: int = 42) -> Path:
    cfg = ApexConfig.preset("cartpole")
    folder.mkdir(parents=True, exist_ok=True)
    write_text(folder / "config.yaml", cfg.to_yaml())
    save_weights(folder, (version, cartpole_weights(tuple(cfg.agent.hiddens))))
    return folder


def minatar_run(folder: Path, version: int = 3) -> Path:
    import gymnasium as gym

    from apex_dask.algo.envs.factory import make_env_factory

    cfg = ApexConfig.preset("minatar")
    env = make_env_factory(cfg.env.env_id)()
    torch.manual_seed(0)
    net = build_q_network(
        env.observation_space, env.action_space, cfg.agent.hiddens, cfg.agent.dueling
    )
    env.close()
    assert isinstance(env.observation_space, gym.spaces.Box)
    folder.mkdir(parents=True, exist_ok=True)
    write_text(folder / "config.yaml", cfg.to_yaml())
    save_weights(folder, (version, module_weights(net)))
    return folder


def pendulum_model(seed: int = 0):
    """The ``pendulum`` preset's DPG model (actor and critic) with seeded weights far from
    the near-zero initial ones, so that its actions vary over the action range."""
    from apex_dask.algo.agents.dpg.networks import build_dpg_model
    from apex_dask.algo.envs.factory import make_env_factory

    cfg = ApexConfig.preset("pendulum")
    env = make_env_factory(cfg.env.env_id)()
    d = cfg.agent
    torch.manual_seed(seed)
    model = build_dpg_model(
        env.observation_space, env.action_space, d.actor_hiddens, d.critic_hiddens, d.twin_q
    )
    env.close()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model.eval()


def pendulum_run(folder: Path, version: int = 5) -> Path:
    """A ``dpg`` run folder: the ``pendulum`` preset and :func:`pendulum_model`'s weights."""
    cfg = ApexConfig.preset("pendulum")
    folder.mkdir(parents=True, exist_ok=True)
    write_text(folder / "config.yaml", cfg.to_yaml())
    save_weights(folder, (version, module_weights(pendulum_model())))
    return folder


def pomdp_run(folder: Path, version: int = 7, seed: int = 0) -> Path:
    """An ``r2d2`` run folder: the ``cartpole_pomdp`` preset and its recurrent network with
    seeded weights far from the initial ones (its actions depend on the state carried)."""
    from apex_dask.algo.agents.r2d2.networks import RecurrentQNetwork
    from apex_dask.algo.envs.factory import make_env_factory

    cfg = ApexConfig.preset("cartpole_pomdp")
    env = make_env_factory(cfg.env.env_id)()
    torch.manual_seed(seed)
    net = RecurrentQNetwork(env.observation_space, env.action_space, cfg.agent)
    env.close()
    with torch.no_grad():
        for p in net.parameters():
            p.normal_(0.0, 0.3)
    folder.mkdir(parents=True, exist_ok=True)
    write_text(folder / "config.yaml", cfg.to_yaml())
    save_weights(folder, (version, module_weights(net)))
    return folder
