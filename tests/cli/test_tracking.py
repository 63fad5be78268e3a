"""Result sinks (TensorBoard, W&B) and the CLI flags that turn them on, without a cluster."""

from __future__ import annotations

import math
import sys

import pytest

from apex_dask.cli.main import build_parser, main
from apex_dask.cli.tracking import RunReporter
from apex_dask.config import ApexConfig
from apex_dask.experiment.tracking import (
    TensorBoardSink,
    TrackingError,
    result_step,
    scalar_metrics,
)

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    EventAccumulator,
)


def read_scalars(log_dir) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_scalar_metrics_keeps_finite_numbers_only():
    result = {"a": 1, "b": 2.5, "c": math.nan, "d": math.inf, "e": True, "f": "x"}
    assert scalar_metrics(result) == {"a": 1.0, "b": 2.5}
    assert result_step({"timesteps_total": 4096.0, "iteration": 3}) == 4096
    assert result_step({"iteration": 3}) == 3


def test_one_scalar_per_metric_tagged_by_name_at_timesteps_total(tmp_path):
    sink = TensorBoardSink(tmp_path)
    results = [
        {
            "iteration": 1,
            "timesteps_total": 1000,
            "learner/loss": 0.5,
            "eval/return_mean": math.nan,
        },
        {"iteration": 2, "timesteps_total": 2000, "learner/loss": 0.25, "eval/return_mean": 9.0},
    ]
    for result in results:
        sink.write(result)
    sink.close()
    scalars = read_scalars(tmp_path)
    assert set(scalars) == {"iteration", "timesteps_total", "learner/loss", "eval/return_mean"}
    assert scalars["learner/loss"] == [(1000, 0.5), (2000, 0.25)]
    assert scalars["iteration"] == [(1000, 1.0), (2000, 2.0)]
    assert scalars["eval/return_mean"] == [(2000, 9.0)]  # NaN is a gap, not a point


def test_a_resumed_run_appends_to_the_same_log_and_hides_steps_after_the_checkpoint(tmp_path):
    first = TensorBoardSink(tmp_path)
    for step in range(0, 600, 100):  # crashed at 500; checkpoint at 300
        first.write({"timesteps_total": step, "learner/loss": 1.0})
    first.close()
    resumed = TensorBoardSink(tmp_path, purge_step=300)
    for step in range(300, 800, 100):
        resumed.write({"timesteps_total": step, "learner/loss": 2.0})
    resumed.close()
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 2
    assert read_scalars(tmp_path)["learner/loss"] == [
        (0, 1.0),
        (100, 1.0),
        (200, 1.0),
        (300, 2.0),
        (400, 2.0),
        (500, 2.0),
        (600, 2.0),
        (700, 2.0),
    ]


def test_a_resume_hides_the_row_after_the_checkpoint_that_has_the_checkpoints_own_step(
    tmp_path,
):
    # the attempt cut short: a checkpoint after row 3, and no rollout stored between it
    # and row 4, whose step is then the checkpoint's own (3500); results.jsonl moves rows
    # 4 and 5 aside, so TensorBoard must hide both
    from apex_dask.runtime.orchestration.resume import open_tensorboard

    first = TensorBoardSink(tmp_path)
    for it, step in enumerate((1000, 2000, 3000, 3500, 4500), start=1):
        first.write({"iteration": it, "timesteps_total": step})
    first.close()
    meta = {"iteration": 3, "timesteps_total": 3500, "row_timesteps_total": 3000}
    cfg = ApexConfig.preset("cartpole")
    resumed = open_tensorboard(tmp_path, cfg, "run-1", meta)
    for it, step in ((4, 4200), (5, 5000)):
        resumed.write({"iteration": it, "timesteps_total": step})
    resumed.close()
    shown = read_scalars(tmp_path)["iteration"]
    assert shown == [(1000, 1.0), (2000, 2.0), (3000, 3.0), (4200, 4.0), (5000, 5.0)]


def test_missing_tensorboard_is_one_line_naming_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    with pytest.raises(TrackingError, match=r"apex_dask\[tensorboard\]") as info:
        TensorBoardSink(tmp_path)
    assert "\n" not in str(info.value)


def _args(*argv: str):
    return build_parser().parse_args(list(argv))


@pytest.mark.parametrize(
    ("argv", "expected"),
    [([], "tensorboard"), (["--no-tensorboard"], None)],
)
def test_out_writes_tensorboard_under_out_unless_turned_off(tmp_path, argv, expected):
    reporter = RunReporter(_args(*argv), ApexConfig.preset("cartpole"), tmp_path)
    assert reporter.tensorboard_dir == (tmp_path / expected if expected else None)
    assert RunReporter(_args(*argv), ApexConfig.preset("cartpole"), None).tensorboard_dir is None


def test_wandb_flag_without_the_package_is_one_line_before_anything_starts(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setitem(sys.modules, "wandb", None)
    argv = ["--out", str(tmp_path / "run"), "--wandb", "apex-test"]
    argv += ["--scheduler", "tcp://127.0.0.1:1", "--connect-timeout", "1"]
    assert main(argv) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert err == [
        "apex-dask-submit: error: --wandb needs the wandb package: pip install 'apex_dask[wandb]'"
    ]


def test_wandb_flag_needs_a_project_name(capsys):
    assert main(["--wandb", " "]) == 2
    assert "--wandb needs a project name" in capsys.readouterr().err
