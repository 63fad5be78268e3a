"""What apex-dask-submit prints and saves, computed from result dicts."""

from __future__ import annotations

import json
import math

from apex_dask.cli.output import format_progress, format_summary, merge_final


def test_final_counters_replace_the_last_result_but_window_means_do_not():
    last = {
        "iteration": 7,
        "env/episode_return_mean": 212.0,
        "env/steps_per_s": 4000.0,
        "flow/batches_trained": 90,
        "learner/steps_trained": 9000,
        "replay/0/size": 50,
    }
    final = {
        "iteration": 7,
        "env/episode_return_mean": math.nan,
        "env/steps_per_s": 12.0,
        "flow/batches_trained": 95,
        "flow/batches_lost": 0,
        "learner/steps_trained": 9500,
        "replay/0/size": 55,
    }
    merged = merge_final(last, final)
    assert merged["env/episode_return_mean"] == 212.0
    assert merged["env/steps_per_s"] == 4000.0
    assert merged["flow/batches_trained"] == 95 and merged["flow/batches_lost"] == 0
    assert merged["learner/steps_trained"] == 9500 and merged["replay/0/size"] == 55


def test_progress_line_shows_dashes_for_missing_metrics():
    line = format_progress({"iteration": 3, "timesteps_total": 1234, "eval/return_mean": 500.0})
    assert line.startswith("it 3 | ")
    assert "steps 1234" in line and "eval 500.0" in line and "return -" in line


def test_summary_reports_best_eval_and_the_stop_reason():
    results = [
        {"iteration": 1, "time_s": 1.0, "timesteps_total": 100, "eval/return_mean": 30.0},
        {
            "iteration": 2,
            "time_s": 2.0,
            "timesteps_total": 200,
            "eval/return_mean": 475.0,
            "flow/batches_lost": 0,
        },
    ]
    text = format_summary(results, "eval/return_mean >= 475")
    assert "eval/return_mean >= 475" in text
    assert "475.0 / 475.0" in text
    assert "batches lost" in text
    assert "before the first result" in format_summary([], "interrupted")


def test_placement_watcher_announces_rebuilt_shards_and_learner(tmp_path, capsys):
    from apex_dask.cli.watch import PlacementWatcher

    def worker(addr: str) -> dict:
        return {"address": addr, "name": addr[-1], "host": "h", "resources": {}}

    class Run:  # what the watcher reads: the driver's placement, as a dict
        placement = {
            "learner": worker("tcp://a:1"),
            "shards": [worker("tcp://a:1"), worker("tcp://b:2")],
            "env_workers": [worker("tcp://b:2")],
            "evaluator": worker("tcp://b:2"),
        }

    run = Run()
    watcher = PlacementWatcher(run, tmp_path)
    run.placement = {**Run.placement, "learner": worker("tcp://c:3")}
    run.placement["shards"] = [worker("tcp://c:3"), worker("tcp://b:2")]
    watcher.poll(force=True)
    out = capsys.readouterr().out.splitlines()
    assert any("replay shard 0 was lost" in line and "rebuilt on 3" in line for line in out)
    assert any("the learner was lost" in line and "rebuilt on 3" in line for line in out)
    assert not any("replay shard 1" in line for line in out)
    assert watcher.replaced == 2
    assert json.loads((tmp_path / "placement.json").read_text())["learner"]["name"] == "3"


def test_placement_watcher_prints_each_elastic_change_once_and_no_lost_worker(tmp_path, capsys):
    from apex_dask.cli.watch import PlacementWatcher

    def worker(addr: str) -> dict:
        return {"address": addr, "name": addr[-1], "host": "h", "resources": {}}

    class Run:  # an elastic run: a slot filled, a shard moved, each with its line
        placement = {
            "learner": worker("tcp://a:1"),
            "shards": [worker("tcp://b:2")],
            "env_workers": [worker("tcp://b:2"), None],
            "evaluator": worker("tcp://b:2"),
        }
        changes: list[str] = []

    run = Run()
    watcher = PlacementWatcher(run, tmp_path)
    run.placement = {**Run.placement, "env_workers": [worker("tcp://b:2"), worker("tcp://c:3")]}
    run.changes = ["env worker 1 (epsilon 0.4) added on Dask worker 3"]
    watcher.poll(force=True)
    run.placement = {**run.placement, "shards": [worker("tcp://c:3")]}
    run.changes = [*run.changes, "replay shard 0 moved off leaving Dask worker 2 to 3"]
    watcher.poll(force=True)
    watcher.poll(force=True)
    out = capsys.readouterr().out.splitlines()
    assert [line.split(": ", 1)[1] for line in out] == run.changes
    assert watcher.replaced == 0
    written = json.loads((tmp_path / "placement.json").read_text())
    assert written["shards"][0]["name"] == "3" and written["env_workers"][1]["name"] == "3"
