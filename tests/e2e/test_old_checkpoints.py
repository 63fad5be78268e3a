"""Checkpoints written before the code moved still resume (``tests/data/checkpoints_9cd68c2``).

The run folders were written by commit 9cd68c2 (its README says how): a DQN
CartPole run and a DPG Pendulum run on the Dask runtime, and an in-process
runner's checkpoint. Each resumes with today's code and goes on from where it
stopped: counters, steps trained and the replay's contents continue.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from apex_dask.local.checkpoint import load_runner_checkpoint
from apex_dask.local.runner import LocalApex

DATA = Path(__file__).parents[1] / "data" / "checkpoints_9cd68c2"
BIN = Path(sys.executable).parent


def rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@pytest.mark.slow
@pytest.mark.parametrize("run", ["dqn", "dpg"])
def test_a_run_folder_from_before_the_move_resumes_on_the_dask_runtime(run, tmp_path):
    out = tmp_path / run
    shutil.copytree(DATA / run, out)
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
