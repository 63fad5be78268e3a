"""The in-process runner: its bookkeeping, stop conditions, and that it learns."""

import math
import warnings

import numpy as np
import pytest

from apex_dask.config import ApexConfig, ConfigError
from apex_dask.experiment.stop import resolve_stop
from apex_dask.local import LocalApex, run_local

TINY = {
    "learner.batch_size": 32,
    "dqn.hiddens": [32],
    "learner.target_update_freq": 640,
    "replay.capacity": 4000,
    "replay.num_shards": 2,
    "replay.learning_starts": 400,
    "workers.num_workers": 3,
    "workers.rollout_fragment_length": 16,
    "workers.max_weight_sync_delay": 32,
    "report.min_iter_time_s": 0.0,
    "report.timesteps_per_iteration": 480,
    "eval.interval_s": 0.0,
    "eval.episodes": 1,
    "report.per_worker_keys": True,  # each env worker's own keys in the rows too
    "seed": 3,
}


def tiny(**overrides):
    return ApexConfig.preset("cartpole").override({**TINY, **overrides})


def test_counters_agree_across_components():
    apex = LocalApex(tiny())
    for _ in range(60):
        apex.step()
    r = apex.result()
    steps = sum(w.steps_sampled for w in apex.workers)
    assert r["timesteps_total"] == r["env/steps_sampled"] == steps == 60 * 3 * 16
    stored = sum(s.stats()["added"] for s in apex.shards)
    pending = sum(w.adder.num_pending for w in apex.workers)
    assert stored == steps - pending  # every step became one transition, in some shard
    assert r["replay/size"] == stored
    assert r["learner/steps_trained"] == 32 * r["learner/updates"]
    # priorities went back to the shards the batches came from
    assert sum(s.stats()["updated"] for s in apex.shards) == r["learner/steps_trained"]
    assert sum(s.stats()["sampled"] for s in apex.shards) == r["learner/steps_trained"]
    assert r["learner/target_updates"] == r["learner/steps_trained"] // 640
    assert sum(r[f"replay/{k}/rollouts_stored"] for k in range(2)) == r["flow/rollouts_stored"]
    assert sum(r[f"replay/{k}/batches_sampled"] for k in range(2)) == r["learner/updates"]
    assert sum(r[f"env/{i}/rollouts_sent"] for i in range(3)) == r["flow/rollouts_sent"] == 180
    assert r["env/1/steps_sampled"] == 60 * 16
    assert r["env/epsilon/0"] == pytest.approx(0.4)
    assert r["env/epsilon/2"] == pytest.approx(0.4**8)
    apex.close()


def test_no_updates_until_each_shard_holds_its_share_of_learning_starts():
    apex = LocalApex(tiny(**{"replay.learning_starts": 1000}))  # 500 per shard
    while all(len(s) < 500 for s in apex.shards):
        assert apex.learner.num_updates == 0
        apex.step()
    while apex.learner.num_updates == 0:
        apex.step()
    ready = [len(s) >= 500 for s in apex.shards]
    assert any(ready)
    # only ready shards were sampled
    for s, ok in zip(apex.shards, ready, strict=True):
        assert ok or s.stats()["sampled"] == 0


def test_replay_ratio_bound_is_kept():
    apex = LocalApex(tiny(**{"learner.max_replay_ratio": 2.0, "learner.min_replay_ratio": None}))
    for _ in range(40):
        apex.step()
        assert apex.learner.steps_trained <= 2.0 * apex.steps_sampled
    # and the learner actually used its budget once learning started
    assert apex.learner.steps_trained > 2.0 * apex.steps_sampled - 32 * 2


def test_without_ratio_bound_one_update_per_fragment_after_learning_starts():
    apex = LocalApex(
        tiny(
            **{
                "learner.max_replay_ratio": None,
                "learner.min_replay_ratio": None,
                "replay.learning_starts": 0,
            }
        )
    )
    for _ in range(10):
        apex.step()
    assert apex.learner.num_updates == 10 * 3


def test_weights_sync_after_delay_only_when_newer():
    apex = LocalApex(tiny(**{"workers.max_weight_sync_delay": 48}))
    assert apex.weight_syncs == 3  # the initial sync of every worker
    assert all(w.weights_version == 0 for w in apex.workers)
    for _ in range(30):
        apex.step()
    r = apex.result()
    # each worker syncs at most every 3 fragments (48 steps of 16)
    assert 3 < r["sync/weight_syncs"] <= 3 + 3 * (30 // 3)
    assert all(w.weights_version <= apex.learner.version for w in apex.workers)
    lag = apex.learner.version - np.mean([w.weights_version for w in apex.workers])
    assert r["sync/policy_lag"] == pytest.approx(lag)


def test_no_sync_without_newer_weights():
    apex = LocalApex(tiny(**{"replay.learning_starts": 4000, "replay.capacity": 8000}))
    for _ in range(20):
        apex.step()
    assert apex.learner.version == 0 and apex.weight_syncs == 3


def test_stop_on_timesteps_and_iterations():
    results = list(run_local(tiny(), stop={"timesteps": 1000}))
    assert results[-1]["timesteps_total"] >= 1000
    assert all(r["timesteps_total"] < 1000 for r in results[:-1])
    cfg = tiny(**{"stop.iterations": 3})
    assert len(list(run_local(cfg))) == 3


def test_two_return_stops_each_read_one_result_key():
    evaluated = list(run_local(tiny(), stop={"eval_return": 1.0}))
    assert len(evaluated) == 1 and evaluated[0]["eval/return_mean"] >= 1.0
    trained = list(run_local(tiny(), stop={"train_return": 1.0, "iterations": 5}))
    assert len(trained) == 1 and trained[0]["env/episode_return_mean"] >= 1.0
    # no evaluation: the training episodes' stop still works; an evaluation stop is refused
    no_eval = tiny(**{"eval.episodes": 0})
    results = list(run_local(no_eval, stop={"train_return": 1.0, "iterations": 5}))
    assert len(results) == 1 and results[0]["env/episode_return_mean"] >= 1.0
    assert "eval/return_mean" not in results[0]
    with pytest.raises(ConfigError, match="stop.eval_return.*needs the greedy evaluation"):
        no_eval.override({"stop.eval_return": 1.0})


def test_retired_reward_stop_keeps_working_with_one_warning_naming_its_key():
    with pytest.warns(FutureWarning, match=r"now means stop\.eval_return") as caught:
        evaluated = list(run_local(tiny(), stop={"reward": 1.0}))
    assert len(caught) == 1
    assert len(evaluated) == 1 and evaluated[0]["eval/return_mean"] >= 1.0
    with pytest.warns(FutureWarning, match=r"now means stop\.train_return"):
        cfg = tiny(**{"eval.episodes": 0, "stop.reward": 3.0})
    assert (cfg.stop.train_return, cfg.stop.eval_return) == (3.0, None)
    with pytest.warns(FutureWarning, match=r"now means stop\.eval_return"):
        cfg = tiny(**{"stop.reward": "5"})
    assert (cfg.stop.train_return, cfg.stop.eval_return) == (None, 5.0)
    with pytest.raises(ConfigError, match="stop.reward and stop.eval_return are both given"):
        with pytest.warns(FutureWarning):
            tiny(**{"stop.reward": 5, "stop.eval_return": 6})
    # an old config file's `stop: {reward: null}` loads without a word
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ApexConfig.from_dict({"preset": "cartpole", "stop": {"reward": None}}) == (
            ApexConfig.preset("cartpole")
        )


def test_resolve_stop_overrides_field_by_field_and_rejects_unknown():
    base = tiny(**{"stop.time_s": 10.0}).stop
    merged = resolve_stop(base, {"timesteps": 5})
    assert merged.time_s == 10.0 and merged.timesteps == 5
    with pytest.raises(ValueError, match="rewards"):
        resolve_stop(base, {"rewards": 1})


def test_same_seed_same_training():
    def run():
        apex = LocalApex(tiny(**{"eval.episodes": 0}))
        for _ in range(30):
            apex.step()
        return apex.learner.get_weights()

    (va, wa), (vb, wb) = run(), run()
    assert va == vb > 0
    for k in wa:
        np.testing.assert_array_equal(wa[k], wb[k])


@pytest.mark.slow
def test_cartpole_preset_learns_well_above_random():
    """A broken learner fails here: random play scores ~22 on CartPole-v1."""
    cfg = ApexConfig.preset("cartpole").override({"eval.episodes": 0, "seed": 0})
    apex = LocalApex(cfg)
    while apex.steps_sampled < 24_000:
        apex.step()
    ev = apex.workers[-1]  # any worker's greedy evaluation env will do
    ev.set_weights(*apex.learner.get_weights())
    score = ev.evaluate(10, seed=123)["return_mean"]
    assert not math.isnan(score) and score >= 150, score


def test_checkpoint_restores_learner_replay_and_counters(tmp_path):
    apex = LocalApex(tiny(**{"eval.episodes": 0}))
    for _ in range(20):
        apex.step()
    path = apex.save(tmp_path / "ckpt")
    back = LocalApex.restore(path)
    assert back.config == apex.config
    assert back.steps_sampled == apex.steps_sampled
    assert back.learner.counters() == apex.learner.counters()
    assert [len(s) for s in back.shards] == [len(s) for s in apex.shards]
    version, weights = apex.learner.get_weights()
    assert all(w.weights_version == version for w in back.workers)
    # identical replay and learner state: the next batch trains identically
    assert back.train_once() and apex.train_once()
    wa, wb = apex.learner.get_weights()[1], back.learner.get_weights()[1]
    for k in wa:
        np.testing.assert_array_equal(wa[k], wb[k])
    back.step()
    assert back.steps_sampled == apex.steps_sampled + 3 * 16


def test_before_learn_on_batch_from_the_config_runs_on_every_batch(tmp_path, monkeypatch):
    (tmp_path / "apex_test_hooks.py").write_text(
        "calls = []\n"
        "def halve(batch, shard_id):\n"
        "    calls.append((shard_id, len(batch['indices'])))\n"
        "    return {**batch, 'weights': batch['weights'] * 0.5}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import apex_test_hooks

    cfg = tiny(**{"learner.before_learn_on_batch": "apex_test_hooks:halve"})
    results = list(run_local(cfg, stop={"iterations": 2}))
    updates = results[-1]["learner/updates"]
    assert updates > 0 and results[-1]["learner/hook_calls"] == updates
    assert len(apex_test_hooks.calls) == updates
    assert {n for _, n in apex_test_hooks.calls} == {32}
    assert {k for k, _ in apex_test_hooks.calls} <= {0, 1}


@pytest.mark.parametrize(
    "path,needle",
    [("no_such_module_xyz:f", "cannot import 'no_such_module_xyz'"), ("math:nope", "no function")],
)
def test_a_bad_hook_path_is_one_config_error(path, needle):
    from apex_dask.config import ConfigError

    with pytest.raises(ConfigError, match=needle):
        LocalApex(tiny(**{"learner.before_learn_on_batch": path}))


def test_run_local_runs_dpg_and_its_checkpoint_restores(tmp_path):
    """The in-process oracle runs the dpg agent on Pendulum-v1: float actions in replay,
    the noise ladder as the workers' exploration, checkpoints through the same runner."""
    cfg = ApexConfig.preset("pendulum").override(
        {
            **{k: v for k, v in TINY.items() if not k.startswith(("learner.", "dqn."))},
            "learner.batch_size": 32,
            "learner.max_replay_ratio": 2.0,
            "learner.min_replay_ratio": 2.0,
        }
    )
    assert cfg.algo == "dpg"
    results = list(run_local(cfg, stop={"iterations": 2}))
    assert results[-1]["learner/updates"] > 0 and math.isfinite(results[-1]["learner/loss"])
    assert math.isfinite(results[-1]["eval/return_mean"])
    ladder = [0.3, 0.3**2, 0.3**3]  # the noise scales, also under their old name this release
    assert [results[-1][f"env/noise_scale/{i}"] for i in range(3)] == pytest.approx(ladder)
    assert [results[-1][f"env/epsilon/{i}"] for i in range(3)] == pytest.approx(ladder)
    apex = LocalApex(cfg.override({"eval.episodes": 0}))
    for _ in range(20):
        apex.step()
    assert apex.shards[0].sample(4, 0.4).data["action"].dtype == np.float32
    back = LocalApex.restore(apex.save(tmp_path / "ckpt"))
    assert back.learner.counters() == apex.learner.counters()
    assert back.train_once() and apex.train_once()
    wa, wb = apex.learner.get_weights()[1], back.learner.get_weights()[1]
    for k in wa:
        np.testing.assert_array_equal(wa[k], wb[k])
