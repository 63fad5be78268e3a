"""The best greedy evaluation's weights, kept by real runs (DQN and DPG) and played again.

A short ``apex-dask-submit`` run evaluates every second. Its ``weights-best.npz``
must hold the weights of its best evaluation: the record matches the first best
entry of the run's evaluation history (from its final checkpoint), and
``apex-dask-eval --best`` with the recorded seed plays exactly the recorded
returns again (greedy play is deterministic: same weights, same episodes). The
summary names the best evaluation and the file; ``--export`` takes it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from apex_dask.experiment.best_weights import BEST_FILE, BEST_JSON, read_best_record
from apex_dask.experiment.checkpoints.store import load_checkpoint
from apex_dask.runtime.orchestration.checkpointing import latest_checkpoint

pytestmark = pytest.mark.slow  # two CLI runs on an embedded cluster, then apex-dask-eval

BIN = Path(sys.executable).parent


@pytest.mark.parametrize("preset", ["cartpole", "pendulum"])
def test_the_best_evaluations_weights_are_kept_and_play_its_episodes_again(tmp_path, preset):
    out = tmp_path / "run"
    run = subprocess.run(
        [str(BIN / "apex-dask-submit"), "--preset", preset, "--out", str(out)]
        + ["--stop-time", "30", "--quiet", "--set", "topology.local_workers=2"]
        + ["--set", "eval.interval_s=1", "--set", "eval.episodes=3"]
        + ["--set", "report.min_iter_time_s=1", "--set", "checkpoint.interval_s=0"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    record = read_best_record(out / BEST_FILE)
    assert record is not None and record == json.loads((out / BEST_JSON).read_text())
    # the run's evaluations (its final checkpoint): the best is the first one of the maximum
    history = load_checkpoint(latest_checkpoint(out / "checkpoints"))[0]["driver"]["eval_history"]
    assert len(history) >= 3
    top = max(h["return_mean"] for h in history)
    first_top = next(h for h in history if h["return_mean"] == top)
    assert record["eval/return_mean"] == pytest.approx(top, rel=1e-12)
    assert record["weights_version"] == first_top["weights_version"]
    assert record["timesteps_total"] <= first_top["timesteps_total"]
    summary = next(x for x in run.stdout.splitlines() if "best greedy eval, its weights" in x)
    assert f"{record['eval/return_mean']:.1f} at " in summary and str(out / BEST_FILE) in summary
    assert BEST_FILE in run.stdout.splitlines()[-1]  # "wrote ..., weights-best.npz, ..."

    # apex-dask-eval --best plays those weights: the recorded episodes, return for return
    episodes, seed = record["eval/episodes"], record["eval/seed"]
    export = tmp_path / "best.pt"
    played = subprocess.run(
        [str(BIN / "apex-dask-eval"), str(out), "--best", "--workers", "1"]
        + ["--seed", str(seed), "--episodes", str(episodes), "--export", str(export)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert played.returncode == 0, played.stdout + played.stderr
    assert f"{BEST_FILE}: greedy eval {record['eval/return_mean']:.1f}" in played.stdout
    report = json.loads(sorted(out.glob("eval-*.json"))[-1].read_text())
    assert report["weights"] == BEST_FILE
    assert report["weights_version"] == record["weights_version"]
    assert report["returns"] == pytest.approx(record["eval/returns"], rel=1e-9, abs=1e-9)
    about = json.loads(Path(str(export) + ".json").read_text())
    assert about["weights"] == BEST_FILE and about["best_eval"] == record
