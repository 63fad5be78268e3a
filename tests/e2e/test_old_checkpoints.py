"""Checkpoints written by older code still load, resume and play.

``tests/data/checkpoints_9cd68c2`` (before ``apex_dask/algo/`` was split by role): a
DQN CartPole run and a DPG Pendulum run on the Dask runtime, and an in-process
runner's checkpoint. ``tests/data/checkpoints_30e1d41`` (before each agent owned its
config section: the DQN keys in ``learner``, every agent's section in each config): a
C51 DQN run and an R2D2 run, and an in-process R2D2 checkpoint. Their READMEs say how
they were made. Each resumes with today's code and goes on from where it stopped:
counters, steps trained and the replay's contents continue; their configs load with
the moved keys in the agent's section (one ``FutureWarning`` line).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from apex_dask.experiment.checkpoints.runner import load_runner_checkpoint
from apex_dask.local.runner import LocalApex

DATA = Path(__file__).parents[1] / "data" / "checkpoints_9cd68c2"
DATA_30E = Path(__file__).parents[1] / "data" / "checkpoints_30e1d41"
BIN = Path(sys.executable).parent
RUNS = [DATA / "dqn", DATA / "dpg", DATA_30E / "dqn", DATA_30E / "r2d2"]


def rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@pytest.mark.slow
@pytest.mark.parametrize("run", RUNS, ids=lambda p: f"{p.parent.name[-7:]}-{p.name}")
def test_a_run_folder_from_before_the_move_resumes_on_the_dask_runtime(run, tmp_path):
    out = tmp_path / run.name
    shutil.copytree(run, out)
    manifest = json.loads((out / "checkpoints" / "ckpt-000001" / "manifest.json").read_text())
    at = manifest["metadata"]["timesteps_total"]
    before = rows(out / "results.jsonl")
    args = ["--resume", str(out), "--stop-timesteps", str(at + 1500), "--quiet"]
    proc = subprocess.run(
        [str(BIN / "apex-dask-submit"), *args, "--no-tensorboard"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "resumed from" in proc.stdout + proc.stderr
    new = rows(out / "results.jsonl")[len(before) :]
    assert new, "no result after the resume"
    first = new[0]
    assert first["timesteps_total"] > at
    assert first["learner/steps_trained"] >= before[-1]["learner/steps_trained"]
    assert first["replay/size"] >= min(before[-1]["replay/size"], 2000) * 0.9  # replay came back
    assert new[-1]["timesteps_total"] >= at + 1500


def test_an_in_process_checkpoint_from_before_the_move_restores():
    apex = LocalApex.restore(DATA / "local")  # with the config it stored
    try:
        assert apex.config.agent.hiddens == (32,) and apex.config.seed == 3
        assert apex.steps_sampled == 3072 and apex.learner.steps_trained == 24576
        assert sum(len(s) for s in apex.shards) == 2000
        parts, _ = load_runner_checkpoint(DATA / "local")
        want, got = parts["learner"]["online"], apex.learner.get_weights()[1]
        assert want.keys() == got.keys()
        assert all(np.array_equal(got[k], np.asarray(v)) for k, v in want.items())
        result = next(iter(apex.iterate()))
        assert result["timesteps_total"] > 3072 and result["replay/size"] == 2000
    finally:
        apex.close()


@pytest.mark.parametrize(
    ("run", "agent"),
    [
        (DATA / "dqn", {"hiddens": (32,)}),
        (DATA / "dpg", {"actor_hiddens": (16,), "critic_hiddens": (16,)}),
        (DATA_30E / "dqn", {"hiddens": (32,), "num_atoms": 11, "v_max": 100.0}),
        (DATA_30E / "r2d2", {"hiddens": (16,), "lstm_size": 8}),
    ],
    ids=["9cd68c2-dqn", "9cd68c2-dpg", "30e1d41-dqn", "30e1d41-r2d2"],
)
def test_an_old_run_folders_config_loads_its_agent_keys_into_the_agents_section(run, agent):
    """``config.yaml`` and the checkpoint's stored config of an older run: the agent's keys
    move from ``learner`` to its own section (one FutureWarning line), the sections of
    the agents it did not run are dropped (they were never read), and the weights it
    saved fit the network the loaded config builds."""
    import warnings

    from apex_dask.algo.agents.registry import make_policy
    from apex_dask.algo.envs.factory import make_env_factory
    from apex_dask.cli.runfolder import load_run
    from apex_dask.config import ApexConfig
    from apex_dask.experiment.builder import agent_spec

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", FutureWarning)
        cfg = ApexConfig.from_yaml(run / "config.yaml")
    manifest = json.loads((run / "checkpoints" / "ckpt-000001" / "manifest.json").read_text())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        assert ApexConfig.from_dict(manifest["metadata"]["config"]) == cfg
    moved = [str(w.message) for w in caught if "moved to the" in str(w.message)]
    assert len(moved) == (0 if cfg.algo == "dpg" else 1)  # dpg read none of the moved keys
    assert all("\n" not in line and f"{cfg.algo}." in line for line in moved)
    assert {k: getattr(cfg.agent, k) for k in agent} == agent
    assert list(cfg.to_dict()).count(cfg.algo) == 1 and "learner" in cfg.to_dict()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        trained = load_run(str(run))  # as apex-dask-eval reads it
    assert trained.config == cfg
    env = make_env_factory(cfg.env.env_id)()
    policy = make_policy(agent_spec(cfg), env.observation_space, env.action_space, trained.weights)
    obs, _ = env.reset(seed=0)
    assert env.action_space.contains(np.asarray(policy.act(obs)).astype(env.action_space.dtype))
    env.close()


def test_an_in_process_r2d2_checkpoint_from_before_the_agent_sections_restores():
    apex = LocalApex.restore(DATA_30E / "local")
    try:
        assert apex.config.algo == "r2d2" and apex.config.agent.lstm_size == 8
        assert apex.config.agent.hiddens == (16,) and apex.config.seed == 3
        assert apex.steps_sampled >= 2000 and apex.learner.steps_trained > 0
        parts, _ = load_runner_checkpoint(DATA_30E / "local")
        want, got = parts["learner"]["online"], apex.learner.get_weights()[1]
        assert all(np.array_equal(got[k], np.asarray(v)) for k, v in want.items())
        stored = sum(len(s) for s in apex.shards)
        result = next(iter(apex.iterate()))
        assert result["timesteps_total"] > apex.steps_sampled - 1000 and stored > 0
        assert "learner/state_staleness" in result and result["learner/updates"] > 0
    finally:
        apex.close()
