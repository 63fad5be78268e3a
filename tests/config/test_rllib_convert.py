"""RLlib Ape-X files of each era convert to the expected apex_dask config; the
per-worker exploration formulas match RLlib's; every rule is in docs/rllib.md."""

from __future__ import annotations

import math

import numpy as np
import pytest
import rllib_files as rf
import yaml

from apex_dask.algo.agents.dpg.noise import noise_ladder
from apex_dask.algo.rollout.exploration import apex_epsilons
from apex_dask.config import ApexConfig
from apex_dask.config.rllib import RLlibError, convert, pick, read_experiments, table
from apex_dask.config.rllib.registry import RULES
from apex_dask.config.rllib.rules_env import ATARI_GAMES


def _conv(path, name=None, **kw):
    return convert(pick(read_experiments(path), name, path.name), **kw)


def _expected(overrides: dict) -> dict:
    return ApexConfig().override(overrides).to_dict()


def test_2018_multi_experiment_yaml_needs_a_name_and_converts_each(tmp_path):
    path = rf.write(tmp_path, "atari-apex.yaml", rf.ATARI_2018)
    experiments = read_experiments(path)
    assert [e.name for e in experiments] == ["pong-apex", "breakout-apex"]
    with pytest.raises(RLlibError, match="holds 2 experiments .*--experiment NAME"):
        pick(experiments, None, path.name)
    with pytest.raises(RLlibError, match="no experiment named 'qbert'; the file holds"):
        pick(experiments, "qbert", path.name)

    pong = _conv(path, "pong-apex")
    assert pong.era == "2018" and not pong.refusals and not pong.warnings
    assert pong.config().to_dict() == _expected(
        {
            "env.env_id": "ALE/Pong-v5",
            "env.repeat_action_probability": 0.0,
            "env.clip_rewards": True,
            "replay.frame_stack": 4,
            "replay.capacity": 1_000_000,
            "replay.alpha": 0.5,
            "replay.learning_starts": 50_000,
            "workers.rollout_fragment_length": 20,
            "dqn.lr": 1e-4,
            "learner.target_update_freq": 50_000,
            "learner.device": "cuda",
            "eval.episodes": 0,
            "stop.train_return": 20.0,
            "stop.timesteps": 10_000_000,
            "checkpoint.interval_s": 300.0,  # checkpoint_freq 10 x min_iter_time_s 30
        }
    )
    ignored = {r.key for r in pong.rows if type(r.outcome).__name__ == "Ignored"}
    assert {"exploration_fraction", "final_prioritized_replay_beta", "optimizer.debug"} <= ignored

    breakout = _conv(path, "breakout-apex")
    cfg = breakout.config()
    assert (cfg.env.env_id, cfg.workers.num_workers, cfg.replay.num_shards) == (
        "ALE/Breakout-v5",
        16,
        2,
    )
    assert cfg.agent.hiddens == (512,)  # Atari: the layers after the conv net
    assert cfg.learner.device == "cpu"


def test_2020_params_json_converts_every_key_without_a_refusal(tmp_path):
    path = rf.write_params_2020(tmp_path)
    conv = _conv(path)
    e = conv.experiment
    assert e.run == "APEX" and "no run:" in e.run_from
    assert conv.era == "2020"
    assert conv.refusals == [] and conv.not_reproduced == []
    # every key of the file has its row: nothing dropped silently
    keys = [r.key for r in conv.rows if not r.default]
    written = []
    for key, value in rf.PARAMS_2020.items():
        if key in ("model", "optimizer", "multiagent", "exploration_config"):
            written += [f"{key}.{sub}" for sub in value]
        elif key != "env_config":  # empty
            written.append(key)
    assert sorted(keys) == sorted(written)
    assert conv.config().to_dict() == _expected(
        {
            "env.env_id": "ALE/Breakout-v5",
            "env.repeat_action_probability": 0.0,
            "env.clip_rewards": None,
            "replay.frame_stack": 4,
            "workers.num_workers": 8,
            "dqn.lr": 1e-4,
            "learner.device": "cuda",
            "learner.min_replay_ratio": None,
            "learner.max_replay_ratio": None,
            "eval.episodes": 0,
        }
    )


def test_2022_cartpole_file_converts_to_the_expected_config():
    conv = _conv(rf.CARTPOLE_2022)
    assert conv.era == "2022" and not conv.refusals and not conv.space
    assert conv.config().to_dict() == _expected(
        {
            "env.env_id": "CartPole-v1",
            "env.env_kwargs": {"max_episode_steps": 200},
            "workers.num_workers": 2,
            "workers.rollout_fragment_length": 32,
            "workers.max_weight_sync_delay": 64,
            "replay.capacity": 50_000,
            "replay.num_shards": 2,
            "replay.learning_starts": 1000,
            "learner.batch_size": 64,
            "dqn.lr": 0.004,
            "dqn.hiddens": (128, 128),  # fcnet_hiddens then hiddens
            "learner.target_update_freq": 2000,
            "learner.min_replay_ratio": 8.0,  # training_intensity: a replay ratio
            "learner.max_replay_ratio": 8.0,
            "learner.device": "cpu",
            "report.timesteps_per_iteration": 1000,
            "report.min_iter_time_s": 1.0,
            "eval.episodes": 0,
            "stop.train_return": 150.0,
            "stop.timesteps": 200_000,
        }
    )
    lines = table(conv)
    assert any(line.startswith("  framework = torch -> ignored: ") for line in lines)


def test_a_2022_file_without_training_intensity_gets_rllib_2x_default_of_one(tmp_path):
    text = "e:\n  run: APEX\n  env: CartPole-v1\n  config:\n    num_rollout_workers: 2\n"
    conv = _conv(rf.write(tmp_path, "e.yaml", text))
    assert (conv.config().learner.min_replay_ratio, conv.config().learner.max_replay_ratio) == (
        1.0,
        1.0,
    )
    old = _conv(rf.write(tmp_path, "o.yaml", text.replace("num_rollout_workers", "num_workers")))
    assert old.config().learner.max_replay_ratio is None  # execution-plan RLlib: unbounded


@pytest.mark.parametrize("n", [1, 2, 5, 32])
def test_rllib_per_worker_epsilons_are_apex_dasks_ladder(n):
    # RLlib's PerWorkerEpsilonGreedy: remote worker w = 1..N gets 0.4 ** (1 + (w-1)/(N-1) * 7)
    rllib = [0.4 ** (1 + (w - 1) / float(max(n - 1, 1)) * 7) for w in range(1, n + 1)]
    cfg = ApexConfig().override({"workers.num_workers": n})
    ours = apex_epsilons(n, cfg.workers.epsilon_base, cfg.workers.epsilon_alpha)
    np.testing.assert_allclose(ours, rllib, rtol=1e-12)


@pytest.mark.parametrize("n", [2, 3, 16])
def test_pendulum_ou_noise_ladder_is_rllibs_per_worker_scale(n):
    conv = _conv(rf.PENDULUM_DDPG, action_half_range=2.0)
    assert not conv.refusals
    text = yaml.safe_load(rf.PENDULUM_DDPG.read_text())
    text["pendulum-apex-ddpg"]["config"]["num_workers"] = n
    cfg = convert(pick([*_read_dict(text)], None, "p"), action_half_range=2.0).config()
    # RLlib's PerWorkerOrnsteinUhlenbeckNoise: worker index w = i + 1, scale
    # 0.4 ** (1 + w/(N-1) * 7), noise = scale * ou_base_scale * X * (high - low) with X's
    # stationary std ou_sigma / sqrt(1 - (1 - theta)^2); in half ranges: x 2
    stat = 0.2 / math.sqrt(1 - 0.85**2)
    rllib = [0.4 ** (1 + (i + 1) / (n - 1) * 7) * 0.1 * stat * 2 for i in range(n)]
    ours = noise_ladder(n, cfg.agent.noise_base, cfg.agent.noise_alpha)
    np.testing.assert_allclose(ours, rllib, rtol=1e-5)
    assert (cfg.agent.noise, cfg.agent.ou_theta) == ("ou", 0.15)


def _read_dict(data):
    import tempfile
    from pathlib import Path

    folder = Path(tempfile.mkdtemp())
    path = folder / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    return read_experiments(path)


def test_apex_ddpg_pendulum_file_converts_units_and_targets():
    conv = _conv(rf.PENDULUM_DDPG, action_half_range=2.0)
    cfg = conv.config()
    assert cfg.algo == "dpg" and cfg.env.env_id == "Pendulum-v1"
    assert (cfg.agent.target_noise, cfg.agent.target_noise_clip) == (0.2, 0.5)  # / half range 2
    assert (cfg.agent.tau, cfg.agent.policy_delay, cfg.agent.twin_q) == (0.005, 2, True)
    assert cfg.agent.actor_hiddens == (64, 64) and cfg.agent.critic_hiddens == (64, 64)
    assert (cfg.eval.episodes, cfg.eval.interval_s, cfg.stop.eval_return) == (10, 0.0, -250.0)
    assert cfg.learner.grad_clip >= 1e9  # RLlib's DDPG default: no clipping
    # without the action bounds the units cannot be converted: refused, not guessed
    blind = _conv(rf.PENDULUM_DDPG, action_half_range=None)
    assert any(line.startswith("target_noise=0.4: in action units") for line in blind.refusals)


def test_2018_ddpg_noise_uses_the_zero_based_index(tmp_path):
    text = (
        "d:\n  run: APEX_DDPG\n  env: Pendulum-v0\n  config:\n    num_workers: 4\n"
        "    exploration_noise_type: gaussian\n    exploration_gaussian_sigma: 0.5\n"
        "    pure_exploration_steps: 0\n    tau: 1.0\n    l2_reg: 0\n"
    )
    cfg = _conv(rf.write(tmp_path, "d.yaml", text), action_half_range=2.0).config()
    rllib = [0.4 ** (1 + i / 3 * 7) * 0.5 / 2.0 for i in range(4)]
    np.testing.assert_allclose(
        noise_ladder(4, cfg.agent.noise_base, cfg.agent.noise_alpha), rllib, rtol=1e-5
    )
    assert (cfg.agent.tau, cfg.learner.target_update_freq) == (1.0, 500_000)


def test_rllib_defaults_not_reproduced_are_listed_not_dropped(tmp_path):
    text = "d:\n  run: APEX_DDPG\n  env: Pendulum-v1\n  config:\n    num_workers: 2\n"
    conv = _conv(rf.write(tmp_path, "d.yaml", text), action_half_range=2.0)
    assert not conv.refusals
    listed = " ".join(conv.not_reproduced)
    for key in ("tau=0.002", "l2_reg=1e-06", "exploration_config.random_timesteps=1000"):
        assert key in listed
    assert "RLlib defaults apex_dask does not reproduce" in "\n".join(table(conv))
    cfg = conv.config()
    assert cfg.agent.tau == ApexConfig(algo="dpg").agent.tau  # apex_dask's own value stays


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            "BreakoutNoFrameskip-v4",
            {"env.env_id": "ALE/Breakout-v5", "env.repeat_action_probability": 0.0},
        ),
        (
            "SeaquestNoFrameskip-v0",
            {"env.env_id": "ALE/Seaquest-v5", "env.repeat_action_probability": 0.25},
        ),
        ("ALE/Pong-v5", {"env.env_id": "ALE/Pong-v5", "env.repeat_action_probability": 0.25}),
        (
            "CartPole-v0",
            {"env.env_id": "CartPole-v1", "env.env_kwargs": {"max_episode_steps": 200}},
        ),
        ("MountainCar-v0", {"env.env_id": "MountainCar-v0"}),
    ],
)
def test_env_ids(tmp_path, env, expected):
    text = f"e:\n  run: APEX\n  env: {env}\n  config: {{num_workers: 2}}\n"
    cfg = _conv(rf.write(tmp_path, "e.yaml", text)).config()
    assert {k: v for k, v in _flat(cfg).items() if k in expected} == expected


def _flat(cfg):
    from apex_dask.config.rllib import flat_config

    return flat_config(cfg)


def test_the_atari_game_list_is_alive_in_ale_v5():
    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)
    for game in ATARI_GAMES:
        assert f"{game}NoFrameskip-v4" in gym.registry
        assert f"ALE/{game}-v5" in gym.registry


def test_tune_samplers_become_a_sweep_space(tmp_path):
    text = (
        "g:\n  run: APEX\n  env: CartPole-v1\n  num_samples: 2\n  config:\n"
        "    num_workers: 2\n    lr: {grid_search: [0.001, 0.004]}\n"
        "    hiddens: {grid_search: [[64], [128]]}\n    model: {fcnet_hiddens: [32]}\n"
        "    gamma: {uniform: [0.95, 0.99]}\n    n_step: {randint: [1, 4]}\n"
    )
    conv = _conv(rf.write(tmp_path, "g.yaml", text))
    assert not conv.refusals
    assert conv.space == {
        "dqn.lr": {"grid": [0.001, 0.004]},
        "dqn.hiddens": {"grid": [[32, 64], [32, 128]]},  # each value converted
        "learner.gamma": {"uniform": [0.95, 0.99]},
        "learner.n_step": {"int": [1, 3]},  # Tune's randint excludes its upper bound
    }
    assert conv.trials == 2 * 2 * 2  # num_samples x the grid's points
    assert conv.sampled == ["lr", "hiddens", "gamma", "n_step"]


def test_num_samples_alone_is_a_grid_over_seeds(tmp_path):
    text = "g:\n  run: APEX\n  env: CartPole-v1\n  num_samples: 3\n  config: {seed: 7}\n"
    conv = _conv(rf.write(tmp_path, "g.yaml", text))
    assert conv.space == {"seed": {"grid": [7, 8, 9]}} and conv.trials == 3


def test_docs_table_lists_every_rllib_key():
    docs = (rf.ROOT / "docs" / "rllib.md").read_text()
    missing = [k for r in RULES for k in r.keys if f"`{k}`" not in docs]
    assert not missing, missing
