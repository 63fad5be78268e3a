"""The contract every agent keeps, checked for each registered agent (the built-in ones and
those installed packages register through the ``apex_dask.agents`` entry point group).

A new agent inherits these checks: nothing here names an agent. Each runs on the first
of a few small real envs whose spaces the agent accepts (its own ``check_spaces``),
with the agent's default config:

- its config section round-trips through dicts and YAML, every key documented;
- a worker rollout is well formed, and its priorities are the learner's TD errors on
  the same data under the same weights;
- one learner update moves the weights and bumps the version;
- a checkpoint round trip gives a bit-identical next update;
- greedy play and the exported TorchScript program choose the same actions;
- the pre-start estimate of a replay item's bytes is close to a real shard's;
- another agent's keys, and moved keys it has no field for, are refused in one line.
"""

from __future__ import annotations

import dataclasses
import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from apex_dask.algo.agents.base import module_weights
from apex_dask.algo.agents.registry import agents, make_env_worker, make_learner, make_policy
from apex_dask.algo.agents.spec import WorkerSpec
from apex_dask.algo.envs.factory import make_env_factory
from apex_dask.algo.replay.shard import ReplayShard
from apex_dask.algo.rollout.spec import RolloutSpec
from apex_dask.cli.checks import EnvSpaces
from apex_dask.cli.memory import replay_bytes
from apex_dask.config import ApexConfig, ConfigError
from apex_dask.config.renames import MOVED_TO_AGENT
from apex_dask.experiment.checkpoints.store import load_checkpoint, save_checkpoint

AGENTS = sorted(agents())
ENVS = ("CartPole-v1", "Pendulum-v1", "MountainCarContinuous-v0")
"""Small real envs; each agent is checked on the first whose spaces it takes."""
EXACT_PRIORITIES = {"dpg": {"smooth_target_policy": False}, "r2d2": {"initial_priority": "worker"}}
"""Settings under which an agent's learner computes its targets without noise (TD3's
target smoothing draws noise the workers' priorities do not): its priorities on the
workers' data are then exactly theirs. An agent with deterministic targets needs none;
one whose workers leave new items the shard's max priority (R2D2 by default) is asked
to score them."""
ROLLOUT = RolloutSpec(n_step=3, gamma=0.99, fragment_length=40, num_envs=2)


def _config(algo: str, **own) -> ApexConfig:
    cfg = ApexConfig(algo=algo).override({"learner.device": "cpu"})
    return dataclasses.replace(cfg, agent=dataclasses.replace(cfg.agent, **own)) if own else cfg


def _env(cfg: ApexConfig) -> str:
    builder = agents()[cfg.algo]
    for env_id in ENVS:
        env = gym.make(env_id)
        if builder.check_spaces(env.observation_space, env.action_space, cfg.agent) is None:
            return env_id
    raise AssertionError(f"the {cfg.algo} agent takes none of {ENVS}")


class Parts:
    """An agent's learner and one env worker (acting with the learner's weights), built
    through the registry as the runners build them."""

    def __init__(self, algo: str, seed: int = 0, **own) -> None:
        torch.manual_seed(0)
        self.cfg = cfg = _config(algo, **own)
        self.builder = agents()[algo]
        self.env_id = _env(cfg)
        self.factory = make_env_factory(self.env_id)
        env = self.factory()
        self.obs_space, self.act_space = env.observation_space, env.action_space
        env.close()
        self.spec = self.builder.agent_spec(cfg)
        self.learner = make_learner(self.spec, self.obs_space, self.act_space, seed=seed)
        worker_spec = WorkerSpec(self.spec, ROLLOUT)
        self.worker = make_env_worker(worker_spec, self.factory, exploration=0.3, seed=seed + 1)
        self.worker.set_weights(*self.learner.get_weights())

    def filled_shard(self, rollouts: int = 4) -> ReplayShard:
        shard = ReplayShard(4096, seed=0)
        for _ in range(rollouts):
            out = self.worker.sample()
            shard.add(out.batch, out.priorities)
        return shard


@pytest.fixture(scope="module", params=AGENTS)
def parts(request) -> Parts:
    return Parts(request.param)


# -- the config ---------------------------------------------------------------------


@pytest.mark.parametrize("algo", AGENTS)
def test_the_agents_section_round_trips_and_is_documented(algo, tmp_path):
    cfg = ApexConfig(algo=algo)
    assert type(cfg.agent) is agents()[algo].config
    assert ApexConfig.from_dict(cfg.to_dict()) == cfg
    path = tmp_path / "run.yaml"
    path.write_text(cfg.to_yaml())
    assert ApexConfig.from_yaml(path) == cfg
    fields = [f.name for f in dataclasses.fields(cfg.agent)]
    docs = ApexConfig.field_docs()
    assert all(docs.get(f"{algo}.{name}") for name in fields), "every key has its docstring"
    # every key set from the CLI's strings, each to its own value, gives the same config
    text = {f"{algo}.{k}": str(v).lower() if isinstance(v, bool) else str(v) for k, v in
            cfg.to_dict()[algo].items() if v is not None}  # fmt: skip
    assert cfg.override(text) == cfg
    assert agents()[algo].network_keys(cfg).startswith(f"{algo}.")


@pytest.mark.parametrize("algo", AGENTS)
def test_another_agents_keys_are_refused_in_one_line_naming_that_agent(algo):
    cfg = ApexConfig(algo=algo)
    for other, builder in agents().items():
        if other == algo:
            continue
        name = dataclasses.fields(builder.config)[0].name
        value = getattr(builder.config(), name)
        with pytest.raises(ConfigError) as err:
            cfg.override({f"{other}.{name}": value})
        line = str(err.value)
        assert "\n" not in line and f"{other}.{name}" in line and f"{other} agent" in line
    own = {f.name for f in dataclasses.fields(cfg.agent)}
    for key in MOVED_TO_AGENT:
        if key.partition(".")[2] not in own:
            with pytest.raises(ConfigError, match="agent"):
                cfg.override({key: MOVED_TO_AGENT[key]})


# -- acting, learning, priorities -------------------------------------------------


def test_a_worker_rollout_is_well_formed(parts):
    out = parts.worker.sample()
    assert out.steps == ROLLOUT.fragment_length * ROLLOUT.num_envs
    assert out.exploration == 0.3 and out.weights_version == parts.learner.version
    assert len(out) > 0
    assert all(len(v) == len(out) for v in out.batch.values())
    if out.priorities is None:  # the shard gives the new items its max priority
        return
    assert len(out.priorities) == len(out)
    assert np.all(np.isfinite(out.priorities)) and np.all(out.priorities >= 0)


def test_one_learner_update_moves_the_weights_and_the_version(parts):
    shard = parts.filled_shard()
    before = {k: v.copy() for k, v in parts.learner.get_weights()[1].items()}
    version = parts.learner.version
    s = shard.sample(min(32, len(shard)), 0.4)
    td, metrics = parts.learner.update(s.data, s.weights)
    assert td.shape == (len(s.weights),) and np.all(np.isfinite(td)) and np.all(td >= 0)
    assert math.isfinite(metrics["loss"]) and parts.learner.version == version + 1
    after = parts.learner.get_weights()[1]
    assert any(not np.array_equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("algo", AGENTS)
def test_worker_priorities_equal_the_learners_on_the_same_data(algo):
    """The learner's first update sees online = target = the weights the worker acted
    with: its TD errors on the worker's items are the worker's initial priorities."""
    p = Parts(algo, seed=4, **EXACT_PRIORITIES.get(algo, {}))
    out = p.worker.sample()
    td, _ = p.learner.update(out.batch, np.ones(len(out), np.float32))
    np.testing.assert_allclose(out.priorities, td, rtol=1e-4, atol=1e-5)


def test_a_checkpoint_round_trip_gives_a_bit_identical_next_update(parts, tmp_path):
    shard = parts.filled_shard()
    for _ in range(3):
        s = shard.sample(min(32, len(shard)), 0.4)
        parts.learner.update(s.data, s.weights)
    path = save_checkpoint(tmp_path / "ckpt", {"learner": parts.learner.state_dict()}, metadata={})
    restored = make_learner(parts.spec, parts.obs_space, parts.act_space, seed=99)
    restored.load_state_dict(load_checkpoint(path)[0]["learner"])
    assert restored.counters() == parts.learner.counters()
    s = shard.sample(min(32, len(shard)), 0.4)
    td_a, m_a = parts.learner.update(s.data, s.weights)
    td_b, m_b = restored.update(s.data, s.weights)
    np.testing.assert_array_equal(td_a, td_b)
    assert m_a == m_b
    w_a, w_b = module_weights(parts.learner.online), module_weights(restored.online)
    assert all(np.array_equal(w_a[k], w_b[k]) for k in w_a)


# -- play, export, memory ---------------------------------------------------------


def test_greedy_play_and_the_exported_program_agree(parts):
    weights = parts.learner.get_weights()[1]
    policy = make_policy(parts.spec, parts.obs_space, parts.act_space, weights)
    scripted = parts.builder.scripted_policy(
        parts.cfg.agent, parts.obs_space, parts.act_space, weights
    )
    env = parts.factory()
    obs, _ = env.reset(seed=5)
    policy.reset()
    state = [torch.zeros(shape) for shape in scripted.state]
    for _ in range(40):
        action = policy.act(obs)
        x = torch.as_tensor(np.asarray(obs, parts.obs_space.dtype))
        with torch.no_grad():
            if scripted.state:
                exported, *state = scripted.program(x[None], *state)
                exported = exported[0]
            else:
                exported = scripted.program(x)
        np.testing.assert_allclose(np.asarray(exported), np.asarray(action), rtol=1e-5, atol=1e-6)
        obs, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            obs, _ = env.reset()
            policy.reset()
            state = [torch.zeros(shape) for shape in scripted.state]
    env.close()


def test_the_replay_memory_estimate_is_close_to_a_real_shards_bytes(parts):
    shard = parts.filled_shard(rollouts=6)
    real = shard.stats()["bytes"] / shard.capacity  # its arrays hold every slot
    _, estimate = replay_bytes(parts.cfg, EnvSpaces(parts.obs_space, parts.act_space))
    assert 0.7 * real <= estimate <= 1.5 * real, (estimate, real)
    params, acts = parts.builder.network_size(parts.cfg.agent, parts.obs_space, parts.act_space)
    net = parts.builder.make_network(parts.cfg.agent, parts.obs_space, parts.act_space)
    assert params == sum(p.numel() for p in net.parameters()) and acts > 0
