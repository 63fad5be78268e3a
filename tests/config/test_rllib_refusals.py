"""Each key apex_dask cannot honour is refused in one line naming the key, its value and
why; with ``lenient`` the same key is one warning line and the rest converts."""

from __future__ import annotations

import pytest
import yaml

from apex_dask.config.rllib import convert, pick, read_experiments

CARTPOLE = {"run": "APEX", "env": "CartPole-v1"}
PENDULUM = {"run": "APEX_DDPG", "env": "Pendulum-v1"}
NATURE_LIKE_RLLIB = [[16, [8, 8], 4], [32, [4, 4], 2], [256, [11, 11], 1]]

CASES = [
    # (experiment, config, extra experiment keys, refused "key=value", why)
    (CARTPOLE, {"num_atoms": 2.5}, {}, "num_atoms=2.5", "whole number of atoms"),
    (CARTPOLE, {"noisy": True, "sigma0": -1}, {}, "sigma0=-1", "positive sigma0"),
    (
        CARTPOLE,
        {"exploration_config": {"type": "EpsilonGreedy"}},
        {},
        "exploration_config.type=EpsilonGreedy",
        "constant per-worker epsilons",
    ),
    (CARTPOLE, {"per_worker_exploration": False}, {}, "per_worker_exploration=false", "schedule"),
    (CARTPOLE, {"soft_q": True}, {}, "soft_q=true", "soft-Q"),
    (CARTPOLE, {"tau": 0.5}, {}, "tau=0.5", "soft target updates of the Q-net"),
    (CARTPOLE, {"td_error_loss_fn": "mse"}, {}, "td_error_loss_fn=mse", "Huber loss"),
    (
        CARTPOLE,
        {"batch_mode": "complete_episodes"},
        {},
        "batch_mode=complete_episodes",
        "fixed-length fragments",
    ),
    (CARTPOLE, {"model": {"use_lstm": True}}, {}, "model.use_lstm=true", "feed-forward"),
    (
        CARTPOLE,
        {"model": {"fcnet_activation": "tanh"}},
        {},
        "model.fcnet_activation=tanh",
        "use ReLU",
    ),
    (CARTPOLE, {"num_workers": 0}, {}, "num_workers=0", "needs env workers"),
    (CARTPOLE, {"num_gpus": 2}, {}, "num_gpus=2", "one GPU"),
    (CARTPOLE, {"lrr": 0.001}, {}, "lrr=0.001", "not a key of RLlib's APEX"),
    (
        CARTPOLE,
        {"trian_batch_size": 32},
        {},
        "trian_batch_size=32",
        "did you mean train_batch_size?",
    ),
    (CARTPOLE, {"actor_hiddens": [64]}, {}, "actor_hiddens=[64]", "a key of APEX_DDPG"),
    (
        CARTPOLE,
        {"worker_side_prioritization": False},
        {},
        "worker_side_prioritization=false",
        "initial priorities",
    ),
    (
        CARTPOLE,
        {"callbacks": "my_pkg.MyCallbacks"},
        {},
        "callbacks=my_pkg.MyCallbacks",
        "callbacks do not run",
    ),
    (
        CARTPOLE,
        {"buffer_size": 100_000, "replay_buffer_config": {"capacity": 200_000}},
        {},
        "replay_buffer_config.capacity=200000",
        "another era's spelling",
    ),
    (
        CARTPOLE,
        {"lr_schedule": [[0, 0.001], [1000, 0.0001]]},
        {},
        "lr_schedule=",
        "learning-rate schedule",
    ),
    (
        CARTPOLE,
        {"observation_filter": "MeanStdFilter"},
        {},
        "observation_filter=MeanStdFilter",
        "filters",
    ),
    (
        CARTPOLE,
        {"evaluation_interval": 1, "evaluation_config": {"env_config": {"x": 1}}},
        {},
        "evaluation_config=",
        "cannot differ",
    ),
    (
        CARTPOLE,
        {"replay_buffer_config": {"type": "ReservoirReplayBuffer"}},
        {},
        "replay_buffer_config.type=ReservoirReplayBuffer",
        "prioritized replay buffers",
    ),
    (
        CARTPOLE,
        {},
        {"stop": {"episode_reward_max": 200}},
        "stop.episode_reward_max=200",
        "return mean, env steps, wall time or iterations",
    ),
    (
        CARTPOLE,
        {},
        {"stop": {"evaluation/episode_reward_mean": 150}},
        "stop.evaluation/episode_reward_mean=150",
        "evaluation is off",
    ),
    (
        CARTPOLE,
        {},
        {"restore": "/ray_results/APEX/checkpoint_10"},
        "restore=",
        "RLlib checkpoint cannot be loaded",
    ),
    (
        CARTPOLE,
        {"lr": {"qloguniform": [1e-4, 1e-2, 1e-4]}},
        {},
        "lr=",
        "no apex-dask-sweep counterpart",
    ),
    (
        CARTPOLE,
        {"training_intensity": {"grid_search": [1, 2]}},
        {},
        "training_intensity=",
        "learner.min_replay_ratio, learner.max_replay_ratio together",
    ),
    (
        {"run": "APEX", "env": "PongDeterministic-v4"},
        {},
        {},
        "env=PongDeterministic-v4",
        "4 frames without max-pooling",
    ),
    ({"run": "APEX", "env": "Pong-v4"}, {}, {}, "env=Pong-v4", "a random 2-4 frames"),
    (
        {"run": "APEX", "env": "PongNoFrameskip-v4"},
        {"model": {"conv_filters": NATURE_LIKE_RLLIB}},
        {},
        "model.conv_filters=",
        "Nature-DQN",
    ),
    (
        {"run": "APEX", "env": "ALE/Pong-v5"},
        {"env_config": {"frameskip": 4}},
        {},
        "env_config.frameskip=4",
        "frame by frame",
    ),
    (PENDULUM, {"l2_reg": 1e-6}, {}, "l2_reg=1e-06", "no L2 regularisation"),
    (
        PENDULUM,
        {"tau": 0.002, "target_network_update_freq": 500000},
        {},
        "tau=0.002",
        "soft update (tau 0.002) once per 500000",
    ),
    (
        PENDULUM,
        {"exploration_config": {"random_timesteps": 1000}},
        {},
        "exploration_config.random_timesteps=1000",
        "random-action warm-up",
    ),
    (
        PENDULUM,
        {"exploration_config": {"type": "OrnsteinUhlenbeckNoise"}},
        {},
        "exploration_config.type=OrnsteinUhlenbeckNoise",
        "annealed",
    ),
    (PENDULUM, {"actor_hidden_activation": "tanh"}, {}, "actor_hidden_activation=tanh", "ReLU"),
    (PENDULUM, {"use_huber": True, "huber_threshold": 2.0}, {}, "huber_threshold=2", "delta 1"),
    (PENDULUM, {"hiddens": [64]}, {}, "hiddens=[64]", "a key of APEX;"),
]


def _experiment(tmp_path, base, config, extra):
    data = {"exp": {**base, **extra, "config": config}}
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return pick(read_experiments(path), None, path.name)


@pytest.mark.parametrize(
    ("base", "config", "extra", "where", "why"),
    CASES,
    ids=[c[3].rstrip("=") or "x" for c in CASES],
)
def test_refused_in_one_line_and_lenient_warns_and_goes_on(
    tmp_path, base, config, extra, where, why
):
    exp = _experiment(tmp_path, base, config, extra)
    strict = convert(exp, action_half_range=2.0)
    mine = [line for line in strict.refusals if line.startswith(where)]
    assert len(mine) == 1, strict.refusals
    assert why in mine[0], mine[0]
    assert "\n" not in mine[0]

    lenient = convert(exp, lenient=True, action_half_range=2.0)
    assert lenient.refusals == []
    warned = [line for line in lenient.warnings if line.startswith(where)]
    assert len(warned) == 1, lenient.warnings
    assert "(--rllib-lenient)" in warned[0] and why in warned[0]
    lenient.config()  # the rest converts to a valid config


def test_training_reward_stop_with_evaluation_on_stops_on_the_training_episodes(tmp_path):
    exp = _experiment(
        tmp_path, CARTPOLE, {"evaluation_interval": 1}, {"stop": {"episode_reward_mean": 150}}
    )
    conv = convert(exp)
    assert conv.refusals == [] and conv.warnings == []
    cfg = conv.config()
    assert cfg.stop.train_return == 150.0 and cfg.stop.eval_return is None
    assert cfg.eval.episodes == 10


def test_rainbow_value_head_keys_become_the_dqn_agents_options(tmp_path):
    keys = {"num_atoms": 51, "v_min": -20, "v_max": 30, "noisy": True, "sigma0": 0.3}
    conv = convert(_experiment(tmp_path, CARTPOLE, keys, {}))
    assert conv.refusals == []
    dqn = conv.config().agent
    assert (dqn.num_atoms, dqn.v_min, dqn.v_max) == (51, -20.0, 30.0)
    assert (dqn.noisy, dqn.sigma0) == (True, 0.3)
    # RLlib's Ape-X kept its per-worker epsilons with noisy layers
    assert conv.config().workers.epsilon_with_noisy is True


def test_support_and_sigma_mean_nothing_without_their_head(tmp_path):
    keys = {"v_min": -20, "v_max": 30, "sigma0": 0.3}
    conv = convert(_experiment(tmp_path, CARTPOLE, keys, {}))
    assert conv.refusals == []
    assert conv.config() == convert(_experiment(tmp_path, CARTPOLE, {}, {})).config()


def test_no_op_value_head_keys_change_nothing(tmp_path):
    keys = {"num_atoms": 1, "v_min": -10.0, "v_max": 10.0, "noisy": False, "sigma0": 0.5}
    exp = _experiment(tmp_path, CARTPOLE, keys, {})
    conv = convert(exp)
    assert conv.refusals == []
    plain = convert(_experiment(tmp_path, CARTPOLE, {}, {}))
    assert conv.config() == plain.config()
