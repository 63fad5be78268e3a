"""Config keys of image envs: sticky actions, reward clipping, envs per worker, eval bounds."""

from __future__ import annotations

import pytest

from apex_dask.config import ApexConfig, ConfigError
from apex_dask.experiment.builder import env_factory, worker_spec
from apex_dask.local import run_local


@pytest.mark.parametrize(
    "key, value",
    [
        ("workers.envs_per_worker", 0),
        ("eval.timeout_s", 0.0),
        ("eval.max_episode_steps", 0),
        ("env.repeat_action_probability", 1.5),
    ],
)
def test_bad_values_are_refused_naming_the_field(key, value):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        ApexConfig.preset("cartpole").override({key: value})


def test_the_builder_passes_the_env_keys_to_the_factory_and_workers():
    cfg = ApexConfig.preset("atari").override({"env.repeat_action_probability": 0.25})
    factory = env_factory(cfg)
    assert factory.clip_rewards is True and factory.repeat_action_probability == 0.25
    assert worker_spec(cfg).rollout.num_envs == 8
    assert env_factory(ApexConfig.preset("cartpole")).clip_rewards is None


def test_a_timed_out_evaluation_is_reported_and_the_run_goes_on():
    cfg = ApexConfig.preset("cartpole").override(
        {
            "eval.interval_s": 0.0,
            "eval.episodes": 3,
            "eval.timeout_s": 1e-6,
            "report.min_iter_time_s": 0.0,
            "report.timesteps_per_iteration": 200,
        }
    )
    results = list(run_local(cfg, stop={"iterations": 2}))
    assert len(results) == 2
    assert [r["eval/timed_out"] for r in results] == [1.0, 1.0]
    ok = list(run_local(cfg.override({"eval.timeout_s": 60.0}), stop={"iterations": 1}))
    assert ok[0]["eval/timed_out"] == 0.0 and ok[0]["eval/return_mean"] > 0
