"""``--from-rllib`` on the command line: the printed YAML runs unchanged with --config,
refusals are one line each and exit 2, Tune samplers go to apex-dask-sweep."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import rllib_files as rf
import yaml

from apex_dask.cli.main import build_parser as submit_parser
from apex_dask.cli.main import main as submit
from apex_dask.cli.sweep.main import _prepare
from apex_dask.cli.sweep.main import build_parser as sweep_parser
from apex_dask.cli.sweep.main import main as sweep
from apex_dask.cli.sweep.spec import load_sweep
from apex_dask.config.rllib import convert, pick, read_experiments

GRID = """\
cartpole-grid:
  env: CartPole-v0
  run: APEX
  num_samples: 2
  stop: {timesteps_total: 20000}
  config:
    num_workers: 2
    lr: {grid_search: [0.001, 0.004]}
    gamma: {uniform: [0.95, 0.99]}
    replay_buffer_config: {capacity: 20000}
    num_steps_sampled_before_learning_starts: 500
"""
BAD = """\
rainbow-apex:
  env: CartPole-v1
  run: APEX
  config:
    num_workers: 2
    soft_q: true
    td_error_loss_fn: mse
"""


def _yaml_part(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.startswith("#")).strip()


def test_printed_config_runs_unchanged_with_config(tmp_path, capsys):
    assert submit(["--from-rllib", str(rf.CARTPOLE_2022), "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("# An apex_dask config (apex-dask-submit --config THIS.yaml)")
    assert "#   env = CartPole-v0 -> env.env_id = CartPole-v1" in printed
    path = tmp_path / "cartpole.yaml"
    path.write_text(printed)

    from apex_dask.cli.resolve import resolve_config

    resolved = resolve_config(submit_parser().parse_args(["--config", str(path)]))
    expected = convert(pick(read_experiments(rf.CARTPOLE_2022), None, "f")).config()
    assert resolved == expected
    assert submit(["--config", str(path), "--print-config"]) == 0
    assert capsys.readouterr().out.strip() == _yaml_part(printed) == expected.to_yaml().strip()


def test_set_and_stop_flags_apply_on_top_of_the_file(capsys):
    args = ["--from-rllib", str(rf.CARTPOLE_2022), "--print-config", "--stop-time", "30"]
    assert submit([*args, "--set", "dqn.lr=0.001"]) == 0
    cfg = yaml.safe_load(_yaml_part(capsys.readouterr().out))
    assert (cfg["dqn"]["lr"], cfg["stop"]["time_s"], cfg["stop"]["train_return"]) == (
        0.001,
        30.0,
        150.0,
    )


def test_refusals_are_one_line_each_and_exit_2(tmp_path):
    path = rf.write(tmp_path, "rainbow.yaml", BAD)
    proc = subprocess.run(
        [sys.executable, "-m", "apex_dask", "--from-rllib", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ.copy(),
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert [line.split(": ")[2] for line in lines] == ["rainbow.yaml", "rainbow.yaml"]
    assert lines[0].startswith("apex-dask-submit: error: rainbow.yaml: soft_q=true: ")
    assert lines[1].startswith("apex-dask-submit: error: rainbow.yaml: td_error_loss_fn=mse: ")
    assert all("--rllib-lenient" in line for line in lines)
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_lenient_warns_per_key_and_goes_on(tmp_path, capsys):
    path = rf.write(tmp_path, "rainbow.yaml", BAD)
    assert submit(["--from-rllib", str(path), "--rllib-lenient", "--print-config"]) == 0
    out, err = capsys.readouterr()
    warnings = err.splitlines()
    assert len(warnings) == 2
    assert warnings[0].startswith("apex-dask-submit: warning: rainbow.yaml: soft_q=true left out")
    assert "#   td_error_loss_fn = mse -> left out (--rllib-lenient): apex_dask's" in out
    yaml.safe_load(_yaml_part(out))


def test_tune_samplers_refuse_a_single_run_and_print_a_sweep_file(tmp_path, capsys):
    path = rf.write(tmp_path, "grid.yaml", GRID)
    assert submit(["--from-rllib", str(path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1
    assert "lr, gamma are Tune samplers (4 trials)" in err[0]
    assert f"apex-dask-sweep --from-rllib {path}" in err[0]

    assert submit(["--from-rllib", str(path), "--print-config"]) == 0
    sweep_file = tmp_path / "sweep.yaml"
    sweep_file.write_text(capsys.readouterr().out)
    spec = load_sweep(sweep_file)
    assert [p.key for p in spec.space.params] == ["dqn.lr", "learner.gamma"]
    assert yaml.safe_load(sweep_file.read_text())["trials"] == 4  # num_samples x the grid
    assert spec.budget.env_steps == 20000  # the file's stop
    assert spec.objective.metric == "env/episode_return_mean"
    assert spec.base.env.env_id == "CartPole-v1" and spec.base.workers.num_workers == 2


def test_sweep_from_rllib_prepares_the_same_sweep(tmp_path, capsys):
    path = rf.write(tmp_path, "grid.yaml", GRID)
    args = sweep_parser().parse_args(["--from-rllib", str(path), "--out", str(tmp_path / "s")])
    folder, spec, resuming = _prepare(args)
    assert not resuming and folder == tmp_path / "s"
    assert "RLlib experiment 'cartpole-grid'" in capsys.readouterr().out
    assert spec.space.grid_points() == [{"dqn.lr": 0.001}, {"dqn.lr": 0.004}]
    conv = convert(pick(read_experiments(path), None, "g"))
    assert spec.base == conv.config()


def test_sweep_from_rllib_without_samplers_is_one_line(capsys):
    assert sweep(["--from-rllib", str(rf.CARTPOLE_2022)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert (
        len(err) == 1 and "no Tune sampler" in err[0] and "apex-dask-submit --from-rllib" in err[0]
    )


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (
            ["--from-rllib", "F", "--config", "x.yaml"],
            "--from-rllib and --config exclude each other",
        ),
        (["--from-rllib", "F", "--preset", "cartpole"], "--from-rllib and --preset exclude"),
        (["--experiment", "pong"], "--experiment needs --from-rllib FILE"),
        (["--rllib-lenient"], "--rllib-lenient needs --from-rllib FILE"),
        (["--from-rllib", "/nonexistent/apex.yaml"], "cannot read RLlib file"),
    ],
)
def test_flag_errors_are_one_line(capsys, args, needle):
    assert submit(args) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and needle in err[0], err


def test_multi_experiment_file_needs_experiment(tmp_path, capsys):
    path = rf.write(tmp_path, "atari.yaml", rf.ATARI_2018)
    assert submit(["--from-rllib", str(path), "--print-config"]) == 2
    assert "pong-apex, breakout-apex); pick one with --experiment NAME" in capsys.readouterr().err
    assert (
        submit(["--from-rllib", str(path), "--experiment", "breakout-apex", "--print-config"]) == 0
    )
    assert "env_id: ALE/Breakout-v5" in capsys.readouterr().out


def test_params_json_and_ddpg_file_print(tmp_path, capsys):
    assert submit(["--from-rllib", str(rf.write_params_2020(tmp_path)), "--print-config"]) == 0
    assert "run APEX (the file has no run:" in capsys.readouterr().out
    assert submit(["--from-rllib", str(rf.PENDULUM_DDPG), "--print-config"]) == 0
    out = capsys.readouterr().out
    # the env was made to read its bounds: action units became half ranges
    assert "target_noise = 0.4 -> dpg.target_noise = 0.2" in out
