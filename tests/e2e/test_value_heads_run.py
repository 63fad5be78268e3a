"""A C51 agent with noisy nets (``dqn.num_atoms: 51``, ``dqn.noisy: true``) on the
Dask runtime, end to end: it trains, resumes from its checkpoint, plays in
``apex-dask-eval``, and its ``--export`` loads in plain torch and takes the same greedy
action as the evaluation's policy on 1,000 observations."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from apex_dask.experiment.checkpoints.store import load_checkpoint

sys.path.insert(0, str(Path(__file__).parents[1]))
from test_eval_export import load_elsewhere, observations  # noqa: E402

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
HEAD = [
    "--set", "dqn.num_atoms=51",
    "--set", "dqn.v_min=0",
    "--set", "dqn.v_max=100",
    "--set", "dqn.noisy=true",
]  # fmt: skip
COMMON = [
    "--set", "report.min_iter_time_s=1",
    "--set", "topology.local_workers=2",
    "--set", "checkpoint.interval_s=0",
    "--set", "eval.interval_s=2",
]  # fmt: skip


def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_c51_with_noisy_nets_trains_resumes_evaluates_and_exports(tmp_path):
    out = tmp_path / "run"
    submit = str(BIN / "apex-dask-submit")
    run(submit, "--preset", "cartpole", "--out", str(out), "--stop-timesteps", "2500",
        "--quiet", "--no-tensorboard", *HEAD, *COMMON)  # fmt: skip
    first = rows(out / "results.jsonl")
    last = first[-1]
    assert last["learner/steps_trained"] > 0 and math.isfinite(last["learner/loss"])
    eps = [last[f"env/workers/epsilon/{s}"] for s in ("min", "max")]  # rows summarise them
    assert eps == [0.0, 0.0]  # noisy nets explore with their noise alone
    ckpt = sorted((out / "checkpoints").glob("ckpt-*"))[-1]
    learner = load_checkpoint(ckpt)[0]["learner"]
    assert learner["online"]["head.advantage.weight_mu"].shape == (2 * 51, 128)
    assert learner["noise_rng"].dtype == np.uint8

    at = int(last["timesteps_total"])
    resumed = run(submit, "--resume", str(out), "--stop-timesteps", str(at + 1500), "--quiet",
                  "--no-tensorboard")  # fmt: skip
    assert "resumed from" in resumed.stdout + resumed.stderr
    after = rows(out / "results.jsonl")[len(first) :]
    assert after and after[0]["timesteps_total"] > at
    assert after[0]["learner/steps_trained"] >= last["learner/steps_trained"]
    assert after[-1]["timesteps_total"] >= at + 1500

    evaluate = str(BIN / "apex-dask-eval")
    target = tmp_path / "c51.pt"
    played = run(evaluate, str(out), "--episodes", "4", "--seed", "3", "--workers", "2",
                 "--export", str(target))  # fmt: skip
    assert "4 episodes of CartPole-v1" in played.stdout, played.stdout
    report = json.loads(sorted(out.glob("eval-*.json"))[-1].read_text())
    assert len(report["returns"]) == 4
    doc = json.loads(Path(str(target) + ".json").read_text())
    assert any("51 atoms" in x for x in doc["inside"]), doc["inside"]
    assert any("mean weights" in x for x in doc["inside"]), doc["inside"]

    from gymnasium import spaces

    from apex_dask.algo.agents.registry import make_policy
    from apex_dask.cli.runfolder import load_run
    from apex_dask.experiment.builder import agent_spec

    trained = load_run(str(out))
    assert trained.config.agent.num_atoms == 51 and trained.config.agent.noisy

    space = spaces.Box(-np.inf, np.inf, (4,), np.float32)
    policy = make_policy(agent_spec(trained.config), space, spaces.Discrete(2), trained.weights)
    obs = observations(space, 1000, seed=8) * np.array([1.0, 1.0, 0.1, 0.5], np.float32)
    want = [policy.act(o) for o in obs]
    assert load_elsewhere(target, obs, tmp_path)["batch"] == want
