"""RLlib files as Tune read them: every tuned APEX / APEX_DDPG example RLlib shipped
(``docs/examples/rllib/tuned/``) converts without ``--rllib-lenient`` and prints a config
(or, for Tune samplers, a sweep file) that loads back; Tune samplers at any depth are sweep
dimensions; an integer key given a non-integer is one line; the experiment-level ``env``
wins over ``config.env`` as in Tune, and a config key next to ``run:`` is refused as Tune
refused it; ``params.json``'s ``-Infinity`` is minus infinity."""

from __future__ import annotations

import json
import math

import pytest
import rllib_files as rf
import yaml

from apex_dask.cli.main import main as submit
from apex_dask.cli.sweep.spec import spec_from_dict
from apex_dask.config.rllib import convert, pick, read_experiments, sweep_file, table
from apex_dask.config.rllib.files import RLlibError

TUNED = sorted((rf.EXAMPLES / "tuned").glob("*.yaml"))
REFUSED_BY_RLLIB = {
    # the commit that brought exploration_config misspelled two keys; RLlib refused
    # unknown config keys ("Unknown config parameter"), and the next commit fixed them
    "atari-apex@17c50f6.yaml": (
        "exploration=",
        "final_prioritized_replay_beta_annealing_timesteps=",
    ),
}
HALF_RANGE = {"Pendulum": 2.0, "MountainCarContinuous": 1.0}


def _conversion(path):
    exp = pick(read_experiments(path), None, path.name)
    env = str(exp.env or exp.config.get("env"))
    half = next((h for name, h in HALF_RANGE.items() if name in env), None)
    return convert(exp, action_half_range=half)


def test_the_tuned_examples_are_all_here():
    assert len(TUNED) == 31
    heads = [p.read_text().splitlines()[0] for p in TUNED]
    assert all(h.startswith("# RLlib's tuned example ") for h in heads)
    runs = {pick(read_experiments(p), None, p.name).run for p in TUNED}
    assert runs == {"APEX", "APEX_DDPG"}


@pytest.mark.parametrize("path", TUNED, ids=[p.name for p in TUNED])
def test_every_tuned_example_converts_without_lenient(path, capsys):
    conv = _conversion(path)
    if path.name in REFUSED_BY_RLLIB:
        keys = REFUSED_BY_RLLIB[path.name]
        assert [r.split("=")[0] + "=" for r in conv.refusals] == list(keys), conv.refusals
        return
    assert conv.refusals == [], conv.refusals
    cfg = conv.config()
    # the stop the file names is kept with its one meaning
    stops = {k for k in (conv.experiment.stop or {})}
    if stops & {"episode_reward_mean", "sampler_results/episode_reward_mean"}:
        assert cfg.stop.train_return is not None
    # the CLI prints a config (or a sweep file for Tune samplers) that loads back
    assert submit(["--from-rllib", str(path), "--print-config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    if conv.space:
        spec = spec_from_dict(printed, path.parent, name=path.name)
        assert spec.space.keys == list(conv.space)
    else:
        assert printed == cfg.to_dict()


def test_the_pendulum_file_stops_on_the_training_return_with_evaluation_on():
    """RLlib's own APEX_DDPG Pendulum file: a training-return stop beside evaluation
    every 5 iterations (refused before stop had two keys)."""
    conv = _conversion(rf.EXAMPLES / "tuned" / "apex_ddpg-pendulum-apex-ddpg@3c739c3.yaml")
    assert conv.refusals == []
    cfg = conv.config()
    assert (cfg.stop.train_return, cfg.stop.eval_return) == (-160.0, None)
    assert cfg.eval.episodes == 10 and cfg.eval.interval_s == 150.0  # 5 x 30 s iterations
    lines = "\n".join(table(conv))
    assert "stop.sampler_results/episode_reward_mean = -160 -> stop.train_return = -160" in lines


def _write(tmp_path, doc, name="exp.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc) if not isinstance(doc, str) else doc)
    return path


def _convert(tmp_path, doc, **kw):
    path = _write(tmp_path, doc)
    return convert(pick(read_experiments(path), None, path.name), **kw)


def test_grid_search_two_levels_deep_is_a_sweep_dimension(tmp_path):
    exp = {
        "run": "APEX",
        "env": "CartPole-v1",
        "config": {
            "num_workers": 2,
            "env_config": {"opts": {"a": {"grid_search": [1, 2]}, "b": 3}},
        },
    }
    conv = _convert(tmp_path, {"deep": exp})
    assert conv.refusals == []
    assert conv.space == {"env.env_kwargs.opts.a": {"grid": [1, 2]}} and conv.trials == 2
    base = conv.config()
    assert base.env.env_kwargs == {"opts": {"b": 3}}
    spec = spec_from_dict(sweep_file(conv, base), tmp_path, name="deep")
    got = [
        spec.trial_config(spec.space.overrides(p)).env.env_kwargs for p in spec.space.grid_points()
    ]
    assert got == [{"opts": {"a": 1, "b": 3}}, {"opts": {"a": 2, "b": 3}}]


def test_samplers_at_any_depth_each_become_dimensions(tmp_path):
    exp = {
        "run": "APEX",
        "env": "CartPole-v1",
        "config": {
            "num_workers": 2,
            "env_config": {"x": {"y": {"z": {"uniform": [0.5, 1.5]}}}},
            # a whole value with grids inside: one grid over every combination, as Tune's
            # variants; here RLlib's evaluation_config (greedy: the same either way)
            "evaluation_interval": 1,
            "evaluation_config": {"explore": {"grid_search": [False]}},
        },
    }
    conv = _convert(tmp_path, {"deep": exp})
    assert conv.refusals == []
    assert conv.space["env.env_kwargs.x.y.z"] == {"uniform": [0.5, 1.5]}
    row = next(r for r in conv.rows if r.key == "evaluation_config")
    assert row.value == {"explore": {"grid_search": [False]}}  # the table shows it as written


def test_nested_samplers_inside_an_ignored_key_do_not_matter(tmp_path):
    exp = {
        "run": "APEX_DDPG",
        "env": "Pendulum-v1",
        "trial_resources": {"cpu": 1, "extra_cpu": {"eval": "4 + spec.config.num_workers"}},
        "config": {"num_workers": 2},
    }
    conv = _convert(tmp_path, {"old": exp}, action_half_range=2.0)
    assert conv.refusals == [] and conv.space == {}


def test_a_nested_sampler_without_counterpart_is_one_line(tmp_path):
    exp = {
        "run": "APEX",
        "env": "CartPole-v1",
        "config": {"evaluation_interval": 1, "evaluation_config": {"explore": {"randn": [0, 1]}}},
    }
    conv = _convert(tmp_path, {"x": exp})
    assert len(conv.refusals) == 1
    assert "Tune's randn at explore inside the value" in conv.refusals[0]


@pytest.mark.parametrize(
    ("where", "key", "value"),
    [
        ("config", "timesteps_per_iteration", "lots"),
        ("config", "timesteps_per_iteration", 2.5),
        ("config", "learning_starts", "lots"),
        ("config", "num_workers", 2.5),
        ("experiment", "keep_checkpoints_num", "lots"),
        ("experiment", "keep_checkpoints_num", 2.5),
        ("ddpg", "num_workers", "lots"),
        ("ddpg", "target_network_update_freq", 2.5),
        ("ddpg", "train_batch_size", "lots"),
    ],
)
def test_an_integer_key_given_a_non_integer_is_one_line_exit_2(tmp_path, capsys, where, key, value):
    run, env = ("APEX_DDPG", "Pendulum-v1") if where == "ddpg" else ("APEX", "CartPole-v1")
    exp = {"run": run, "env": env, "config": {"num_workers": 2}}
    if where == "experiment":
        exp[key] = value
    else:
        exp["config"][key] = value
    path = _write(tmp_path, {"x": exp})
    assert submit(["--from-rllib", str(path), "--print-config"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert f"{key}={value}" in err[0] or f"{key}={value!r}" in err[0], err


def test_the_experiment_level_env_wins_over_config_env_and_the_table_says_so(tmp_path):
    exp = {"run": "APEX", "env": "CartPole-v1", "config": {"env": "Acrobot-v1", "num_workers": 2}}
    conv = _convert(tmp_path, {"x": exp})
    assert conv.refusals == []
    assert conv.config().env.env_id == "CartPole-v1"
    lines = "\n".join(table(conv))
    assert "config.env = Acrobot-v1 -> ignored: the experiment-level env: CartPole-v1" in lines


def test_a_config_key_at_the_experiment_level_is_refused_as_tune_refused_it(tmp_path):
    exp = {"run": "APEX", "env": "CartPole-v1", "lr": 0.001, "config": {"num_workers": 2}}
    conv = _convert(tmp_path, {"x": exp})
    assert conv.refusals == [
        "lr=0.001: a config key next to run: at the experiment level, which Tune refuses "
        "(no such experiment setting); move it under config:"
    ]


def test_params_json_minus_infinity_is_minus_infinity(tmp_path):
    params = {"env": "CartPole-v0", "num_workers": 2, "horizon": "HORIZON"}
    path = tmp_path / "params.json"
    path.write_text(json.dumps(params).replace('"HORIZON"', "-Infinity"))
    (exp,) = read_experiments(path)
    assert exp.config["horizon"] == -math.inf
    conv = convert(exp)
    # RLlib's horizon: inf is no cut, -inf no number of steps at all
    assert [r for r in conv.refusals if r.startswith("horizon=")] == [
        "horizon=-inf: give a number of env steps"
    ]
    path.write_text(json.dumps(params).replace('"HORIZON"', "Infinity"))
    assert convert(read_experiments(path)[0]).refusals == []


def test_an_unreadable_rllib_file_is_one_rllib_error(tmp_path):
    path = tmp_path / "bomb.yaml"
    lines = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    for i, name in enumerate("bcdefghi"):
        prev = "abcdefghi"[i]
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    path.write_text("\n".join(lines))
    with pytest.raises(RLlibError, match="more than 100,000 values once its YAML aliases"):
        read_experiments(path)
