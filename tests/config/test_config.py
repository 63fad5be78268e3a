"""ApexConfig: presets, YAML, dotted overrides and one clear error per bad value."""

from __future__ import annotations

import dataclasses

import pytest

from apex_dask.config import PRESETS, ApexConfig, ConfigError


def test_defaults_are_rllib_apex_defaults():
    cfg = ApexConfig()
    assert cfg.workers.num_workers == 32
    assert cfg.replay.num_shards == 4
    assert cfg.replay.capacity == 2_000_000
    assert cfg.replay.learning_starts == 50_000
    assert cfg.learner.batch_size == 512
    assert cfg.workers.rollout_fragment_length == 50
    assert cfg.learner.n_step == 3
    assert cfg.agent.double_q and cfg.agent.dueling
    assert cfg.agent.hiddens == (256,)
    assert cfg.agent.lr == 5e-4 and cfg.learner.adam_eps == 1e-8
    assert cfg.learner.grad_clip == 40 and cfg.learner.gamma == 0.99
    assert cfg.learner.target_update_freq == 500_000
    assert cfg.workers.max_weight_sync_delay == 400
    assert (cfg.replay.alpha, cfg.replay.beta, cfg.replay.eps) == (0.6, 0.4, 1e-6)
    assert cfg.report.timesteps_per_iteration == 25_000 and cfg.report.min_iter_time_s == 30
    assert cfg.learner.inqueue_size == 16 and cfg.learner.prefetch_per_shard == 4
    assert cfg.workers.rollouts_in_flight == 2
    assert cfg.replay.shard_capacity == 500_000 and cfg.replay.shard_learning_starts == 12_500


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_builds_and_round_trips_through_dict(name):
    cfg = ApexConfig.preset(name)
    assert ApexConfig.from_dict(cfg.to_dict()) == cfg


def test_atari_preset_is_rllib_defaults_on_an_atari_env():
    cfg = ApexConfig.preset("atari")
    assert cfg.env.env_id.startswith("ALE/")
    # RLlib's defaults, but frames stored once each (a storage choice, not a hyperparameter)
    assert cfg.replay.frame_stack == 4
    replay = dataclasses.replace(cfg.replay, frame_stack=None)
    # and RLlib's tuned Atari Ape-X: 8 envs per worker, the DQN Atari setup of the env
    assert cfg.workers.envs_per_worker == 8
    # stepped by ale-py's native vector env (the same preprocessing, docs/algorithm.md)
    assert cfg.workers.vector_mode == "native"
    workers = dataclasses.replace(cfg.workers, envs_per_worker=1, vector_mode="sync")
    assert cfg.env.clip_rewards is True and cfg.env.repeat_action_probability == 0.0
    assert cfg.eval.max_episode_steps == 27_000  # 108,000 frames
    same = dataclasses.replace(cfg, env=ApexConfig().env, replay=replay, workers=workers)
    assert same == ApexConfig()


def test_cartpole_preset_is_small():
    cfg = ApexConfig.preset("cartpole")
    assert cfg.env.env_id == "CartPole-v1"
    assert cfg.workers.num_workers <= 4


def test_dpg_presets_choose_the_dpg_agent_with_td3_options():
    for name, env_id in (("pendulum", "Pendulum-v1"), ("halfcheetah", "HalfCheetah-v5")):
        cfg = ApexConfig.preset(name)
        assert cfg.algo == "dpg" and cfg.env.env_id == env_id
        assert cfg.agent.twin_q and cfg.agent.smooth_target_policy and cfg.agent.policy_delay == 2
    assert ApexConfig().algo == "dqn" and ApexConfig.preset("cartpole").algo == "dqn"


def test_config_is_frozen():
    cfg = ApexConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.seed = 3  # type: ignore[misc]


def test_dotted_overrides_parse_strings_like_the_cli():
    cfg = ApexConfig.preset("cartpole").override(
        {
            "replay.alpha": "0.5",
            "dqn.hiddens": "[64, 64]",
            "dqn.double_q": "false",
            "stop.eval_return": "475",
            "learner.max_replay_ratio": "null",
        }
    )
    assert cfg.replay.alpha == 0.5
    assert cfg.agent.hiddens == (64, 64)
    assert cfg.agent.double_q is False
    assert cfg.stop.eval_return == 475.0
    assert cfg.learner.max_replay_ratio is None


def test_env_kwargs_accept_free_keys():
    cfg = ApexConfig().override({"env.env_kwargs.max_episode_steps": "200"})
    assert cfg.env.env_kwargs == {"max_episode_steps": 200}


def test_from_yaml_with_preset_and_sections(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("preset: cartpole\nreplay:\n  alpha: 0.3\ndqn.lr: 0.002\nseed: 7\n")
    cfg = ApexConfig.from_yaml(path)
    assert cfg.env.env_id == "CartPole-v1"
    assert cfg.replay.alpha == 0.3 and cfg.agent.lr == 0.002 and cfg.seed == 7
    nested = tmp_path / "nested.yaml"
    nested.write_text("preset: cartpole\ndqn:\n  lr: 0.002\n  hiddens: [8]\n")
    assert ApexConfig.from_yaml(nested).agent.hiddens == (8,)


@pytest.mark.parametrize(
    ("overrides", "names"),
    [
        ({"replay.capacity": -5}, ["replay.capacity", "-5", "> 0"]),
        ({"learner.batch_size": 600_000}, ["learner.batch_size", "600000", "shard"]),
        ({"replay.alpha": 1.5}, ["replay.alpha", "1.5", "[0, 1]"]),
        ({"replay.beta": -0.1}, ["replay.beta", "-0.1", "[0, 1]"]),
        ({"replay.alhpa": 0.5}, ["replay.alhpa", "replay.alpha"]),
        ({"nonsense": 1}, ["nonsense"]),
        ({"dqn.lr": "fast"}, ["dqn.lr", "fast", "number"]),
        ({"learner.n_step": 2.5}, ["learner.n_step", "2.5", "integer"]),
        ({"dqn.dueling": "maybe"}, ["dqn.dueling", "maybe", "true or false"]),
        ({"learner.device": "tpu"}, ["learner.device", "tpu", "cpu"]),
        ({"learner.gamma": 0}, ["learner.gamma", "(0, 1]"]),
        ({"workers.num_workers": 0}, ["workers.num_workers", "0", "> 0"]),
        ({"replay": 3}, ["replay", "section"]),
        ({"env.make_timeout_s": 0}, ["env.make_timeout_s", "> 0"]),
        ({"env.step_timeout_s": -1}, ["env.step_timeout_s", "> 0"]),
        ({"workers.max_env_errors_per_1k_steps": 0}, ["max_env_errors_per_1k_steps", "> 0"]),
        ({"workers.max_consecutive_env_errors": 0}, ["max_consecutive_env_errors", "> 0"]),
        ({"workers.restart_failed_envs": "sometimes"}, ["restart_failed_envs", "true or false"]),
        ({"algo": "sac"}, ["algo", "sac", "dqn", "dpg"]),
        ({"algo": "dpg", "dpg.tau": 0}, ["dpg.tau", "(0, 1]"]),
        ({"algo": "dpg", "dpg.noise": "pink"}, ["dpg.noise", "gaussian or ou"]),
        ({"algo": "dpg", "dpg.policy_delay": 0}, ["dpg.policy_delay", "> 0"]),
        ({"algo": "dpg", "dpg.critic_hiddens": []}, ["dpg.critic_hiddens", "positive layer"]),
        ({"dpg.tau": 0.5}, ["dpg.tau", "dpg agent", "algo is dqn", "algo=dpg"]),
        ({"algo": "dpg", "r2d2.burn_in": 4}, ["r2d2.burn_in", "r2d2 agent", "algo=r2d2"]),
        ({"algo": "dpg", "learner.hiddens": [8]}, ["learner.hiddens", "dqn.hiddens", "dpg"]),
        ({"dqn": {"lr": 1}}, ["dqn", "section"]),
        ({"algo": "dpg", "replay.frame_stack": 4}, ["replay.frame_stack", "algo=dpg"]),
    ],
)
def test_bad_values_raise_one_config_error_naming_field_value_and_rule(overrides, names):
    with pytest.raises(ConfigError) as info:
        ApexConfig().override(overrides)
    message = str(info.value)
    assert "\n" not in message
    for part in names:
        assert part in message, (part, message)


def test_min_replay_ratio_above_max_names_both_and_the_way_out():
    cfg = ApexConfig.preset("cartpole")
    assert cfg.learner.min_replay_ratio == cfg.learner.max_replay_ratio == 8.0
    with pytest.raises(ConfigError) as info:
        cfg.override({"learner.max_replay_ratio": 2})
    for part in ("learner.min_replay_ratio", "max_replay_ratio (2.0)", "min_replay_ratio=null"):
        assert part in str(info.value)
    relaxed = cfg.override({"learner.max_replay_ratio": 2, "learner.min_replay_ratio": None})
    assert relaxed.learner.min_replay_ratio is None


def test_unknown_preset_lists_the_presets():
    with pytest.raises(ConfigError, match="cartpole"):
        ApexConfig.preset("pong")


def test_bad_yaml_and_missing_file_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        ApexConfig.from_yaml(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("replay: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        ApexConfig.from_yaml(bad)


def test_every_field_has_a_docstring():
    docs = ApexConfig.field_docs()
    assert len(docs) > 30
    missing = [name for name, doc in docs.items() if not doc]
    assert not missing


@pytest.mark.parametrize(
    "call, needle",
    [
        (lambda: ApexConfig().override(None), "must be a mapping"),
        (lambda: ApexConfig().override({1: 2}), "must be a string"),
        (lambda: ApexConfig(seed="x"), "seed"),
        (lambda: ApexConfig.preset(["x"]), "unknown preset"),
        (lambda: ApexConfig.from_yaml(None), "must be a path"),
    ],
    ids=["override-none", "override-int-key", "seed-str", "preset-list", "from-yaml-none"],
)
def test_wrong_types_in_the_python_api_are_one_config_error(call, needle):
    with pytest.raises(ConfigError) as info:
        call()
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_the_retired_per_minute_env_error_cap_is_ignored_with_one_line_naming_the_new_keys():
    """Old config files and old checkpoints' configs still load; the key does nothing."""
    with pytest.warns(FutureWarning) as caught:
        cfg = ApexConfig.from_dict({"workers": {"max_env_errors_per_min": 3}})
        again = ApexConfig().override({"workers.max_env_errors_per_min": "7"})
    assert cfg == again == ApexConfig()
    text = str(caught[0].message)
    assert "\n" not in text and text.startswith("workers.max_env_errors_per_min is no longer used")
    assert "workers.max_env_errors_per_1k_steps" in text
    assert "workers.max_consecutive_env_errors" in text
    assert "max_env_errors_per_min" not in ApexConfig().to_yaml()


def test_the_old_sleepy_env_id_still_works_with_one_line_naming_the_new_one():
    import warnings

    old = "apex_dask.algo.benchmark_envs:ApexSleepy-v0"
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", FutureWarning)
        cfg = ApexConfig.preset("cartpole").override({"env.env_id": old})
        from_file = ApexConfig.from_dict({"preset": "cartpole", "env": {"env_id": old}})
    assert cfg.env.env_id == from_file.env.env_id == "apex_dask.algo.envs.benchmark:ApexSleepy-v0"
    lines = {str(w.message) for w in seen}
    assert len(lines) == 1 and "apex_dask.algo.envs.benchmark:ApexSleepy-v0" in lines.pop()


def test_a_moved_learner_key_still_works_with_one_future_warning_line():
    """``learner.lr`` (and the other agent keys) moved to the agent's own section."""
    with pytest.warns(FutureWarning) as caught:
        cfg = ApexConfig().override({"learner.lr": 1e-3, "learner.hiddens": "[8]"})
        r2d2 = ApexConfig().override({"algo": "r2d2", "learner.lr": 2e-3})
    assert cfg == ApexConfig().override({"dqn.lr": 1e-3, "dqn.hiddens": [8]})
    assert r2d2.agent.lr == 2e-3
    lines = [str(w.message) for w in caught]
    assert len(lines) == 2 and all("\n" not in line for line in lines)
    assert "learner.lr, learner.hiddens" in lines[0] and "dqn.lr, dqn.hiddens" in lines[0]
    assert "r2d2.lr" in lines[1]


def test_an_old_full_config_loads_and_drops_what_its_agent_never_read():
    """A dict as an older apex_dask wrote it: every agent's section, the DQN keys in
    ``learner``; the keys move to the run's agent, the rest was never read."""
    old = ApexConfig.preset("pendulum").to_dict()
    del old["dpg"]
    old["learner"].update(lr=1e-2, hiddens=[64], num_atoms=1)  # dqn's, unread by dpg
    old["dpg"] = {**ApexConfig.preset("pendulum").to_dict()["dpg"], "twin_q": False}
    old["r2d2"] = {"lstm_size": 64, "burn_in": 10}
    with pytest.warns(FutureWarning) as caught:
        cfg = ApexConfig.from_dict(old)
    assert cfg.algo == "dpg" and cfg.agent.twin_q is False
    assert cfg.agent.actor_hiddens == (64, 64)
    assert "learner.lr, learner.hiddens" in str(caught[-1].message)
    assert "never read" in str(caught[-1].message)


def test_switching_algo_starts_the_agents_section_from_its_defaults():
    cfg = ApexConfig.preset("cartpole").override({"algo": "r2d2", "r2d2.burn_in": 2})
    assert cfg.algo == "r2d2" and cfg.agent.burn_in == 2 and cfg.agent.lr == 5e-4
    assert "dqn" not in cfg.to_dict() and cfg.to_dict()["r2d2"]["burn_in"] == 2
    assert ApexConfig.from_dict(cfg.to_dict()) == cfg


def test_an_agents_section_of_another_agents_class_is_one_config_error():
    from apex_dask.algo.agents.dpg.config import DPGConfig

    with pytest.raises(ConfigError, match="dqn section must be a DQNConfig"):
        ApexConfig(agent=DPGConfig())
    assert ApexConfig(algo="dpg", agent=DPGConfig(tau=1.0)).agent.tau == 1.0
