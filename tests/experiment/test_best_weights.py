"""``weights-best.npz``: the best greedy evaluation's weights, written whole, read back as such."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from apex_dask.cli.checks import UsageError
from apex_dask.cli.runfolder import load_run
from apex_dask.config import ApexConfig
from apex_dask.experiment.best_weights import BEST_FILE, BEST_JSON, BestWeights, read_best_record
from apex_dask.local import LocalApex


def _weights(value: float) -> dict[str, np.ndarray]:
    return {"w": np.full((3, 2), value, np.float32), "b": np.full(2, value, np.float32)}


def _eval(mean: float, **extra) -> dict:
    return {"return_mean": mean, "return_std": 1.0, "returns": [mean - 1, mean + 1], **extra}


def test_only_an_improving_finite_evaluation_replaces_the_file(tmp_path):
    best = BestWeights(tmp_path)
    assert best.bar == -math.inf and best.record is None and best.summary() is None
    assert best.offer(_eval(10.0, timesteps_total=500, seed=7), 3, _weights(1.0))
    assert not best.offer(_eval(9.0), 4, _weights(2.0))  # worse
    assert not best.offer(_eval(10.0), 4, _weights(2.0))  # equal: the first one stays
    assert not best.offer(_eval(math.nan), 4, _weights(2.0))  # no episode finished
    assert not best.offer(_eval(50.0, timed_out=True), 4, _weights(2.0))  # cut short
    assert not best.offer(_eval(50.0), 4, _weights(np.inf))  # weights holding inf
    record = read_best_record(tmp_path / BEST_FILE)
    assert record == json.loads((tmp_path / BEST_JSON).read_text()) == best.record
    assert record["eval/return_mean"] == 10.0 and record["weights_version"] == 3
    assert record["timesteps_total"] == 500 and record["eval/seed"] == 7
    assert record["eval/returns"] == [9.0, 11.0] and record["eval/episodes"] == 2
    assert best.offer(_eval(12.5, timesteps_total=900), 5, _weights(3.0))
    with np.load(tmp_path / BEST_FILE, allow_pickle=False) as npz:
        assert int(npz["__version__"]) == 5 and float(npz["w"][0, 0]) == 3.0
    assert best.summary() == f"12.5 at 900 env steps (weights version 5): {tmp_path / BEST_FILE}"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([BEST_FILE, BEST_JSON])  # no temp


def test_a_resumed_run_must_beat_the_folders_best(tmp_path):
    BestWeights(tmp_path).offer(_eval(100.0), 9, _weights(1.0))
    again = BestWeights(tmp_path)
    assert again.bar == 100.0
    assert not again.offer(_eval(99.0), 20, _weights(2.0))
    assert read_best_record(tmp_path / BEST_FILE)["weights_version"] == 9


def test_kept_weights_are_a_copy(tmp_path):
    best, w = BestWeights(), _weights(1.0)
    best.offer(_eval(1.0), 1, w)
    w["w"][:] = 7.0  # the learner's arrays change after the evaluation
    assert best.weights[0] == 1 and float(best.weights[1]["w"][0, 0]) == 1.0
    assert best.summary().endswith("(kept in memory)")


def test_apex_dask_eval_best_reads_the_weights_and_the_record(tmp_path):
    cfg = ApexConfig.preset("cartpole")
    (tmp_path / "config.yaml").write_text(cfg.to_yaml())
    with pytest.raises(UsageError, match="no weights-best.npz") as info:
        load_run(str(tmp_path), best=True)
    assert "\n" not in str(info.value)
    BestWeights(tmp_path).offer(_eval(42.0, timesteps_total=1234), 17, _weights(0.5))
    run = load_run(str(tmp_path), best=True)
    assert run.source == BEST_FILE and run.version == 17
    assert sorted(run.weights) == ["b", "w"]  # the record is not a weight
    assert run.best["eval/return_mean"] == 42.0 and run.best["timesteps_total"] == 1234


def test_the_in_process_runner_keeps_its_best_evaluation():
    cfg = ApexConfig.preset("cartpole").override(
        {
            "dqn.hiddens": [16],
            "replay.learning_starts": 64,
            "workers.num_workers": 1,
            "eval.episodes": 2,
            "eval.interval_s": 0.0,
            "report.min_iter_time_s": 0.0,
            "report.timesteps_per_iteration": 50,
        }
    )
    with LocalApex(cfg) as apex:
        evals = [r["eval/return_mean"] for r in apex.iterate({"iterations": 4})]
        assert apex.best.record["eval/return_mean"] == max(evals)
        assert apex.best.weights is not None
