"""``apex-dask-sweep`` for real: CartPole trials on the embedded cluster, two at once.

- six trials, one grid key (a learning rate that learns, one that cannot) and
  one sampled key: a weak trial is pruned; the sweep process is SIGKILLed while
  two trials run; ``--resume`` marks them interrupted, runs them again with the
  same values and finishes the six; ``best.yaml`` trains with apex-dask-submit;
- a grid over two values of one key runs exactly those two configs.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
import yaml

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent

SET = (
    "{eval.interval_s: 1.0, eval.episodes: 5, report.min_iter_time_s: 1.0, "
    "report.timesteps_per_iteration: 250, checkpoint.interval_s: 0}"
)
PRUNED_SWEEP = f"""
base: {{preset: cartpole, set: {SET}}}
space:
  dqn.lr: {{grid: [0.004, 1.0e-7]}}
  replay.alpha: {{uniform: [0.4, 0.7]}}
objective: {{metric: eval/return_mean, mode: max}}
budget: {{env_steps: 6000}}
sampler: {{name: tpe, seed: 3}}
pruner: {{name: median, reports: 6, startup_trials: 1, warmup_reports: 3}}
"""


def start(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [str(BIN / "apex-dask-sweep"), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: what it leaves behind is findable
    )


def group_left(pgid: int, wait_s: float = 15.0) -> list[str]:
    """The processes of group ``pgid`` still alive after up to ``wait_s`` (zombies aside)."""
    deadline = time.monotonic() + wait_s
    while True:
        left = []
        for p in psutil.process_iter(["pid", "name", "status", "cmdline"]):
            if p.info["status"] != psutil.STATUS_ZOMBIE and _in_group(p, pgid):
                left.append(f"{p.pid} {p.info['name']} {' '.join(p.info['cmdline'] or [])[:80]}")
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def statuses(folder: Path) -> dict[str, dict]:
    return {
        p.parent.name: json.loads(p.read_text()) for p in sorted(folder.glob("trial-*/status.json"))
    }


@pytest.mark.timeout(1200)
def test_six_trials_two_at_once_pruned_killed_resumed_and_best_trains(tmp_path):
    optuna = pytest.importorskip("optuna")
    space = tmp_path / "space.yaml"
    space.write_text(PRUNED_SWEEP)
    out = tmp_path / "sweep"
    proc = start(str(space), "--trials", "6", "--concurrent", "2", "--out", str(out))
    # kill it once two trials are done and the next two have started
    deadline = time.monotonic() + 420
    while time.monotonic() < deadline and proc.poll() is None:
        running = [p for p in out.glob("trial-*") if not (p / "status.json").exists()]
        if len(statuses(out)) >= 2 and len(running) == 2:
            break
        time.sleep(0.5)
    assert proc.poll() is None, proc.communicate()[0]
    assert len(statuses(out)) >= 2, "no trial finished in time"
    os.kill(proc.pid, signal.SIGKILL)
    first = proc.communicate(timeout=60)[0]
    for pid in (p.pid for p in psutil.process_iter() if _in_group(p, proc.pid)):
        _kill(pid)  # the killed sweep's cluster: no one is left to close it
    interrupted = [p.name for p in out.glob("trial-*") if not (p / "status.json").exists()]
    assert len(interrupted) == 2, first

    again = start("--resume", str(out))
    log = again.communicate(timeout=600)[0]
    assert again.returncode == 0, log
    assert group_left(again.pid) == [], "the resumed sweep left processes running"
    numbers = sorted(int(n.split("-")[1]) for n in interrupted)
    assert f"trial(s) {', '.join(map(str, numbers))} were interrupted: run again" in log, log

    from optuna.storages.journal import JournalFileBackend, JournalStorage

    study = optuna.load_study(
        study_name="apex-sweep",
        storage=JournalStorage(JournalFileBackend(str(out / "study.journal"))),
    )
    trials = study.get_trials()
    by_state = {}
    for t in trials:
        by_state.setdefault(t.state.name, []).append(t)
    assert sorted(t.number for t in by_state["FAIL"]) == numbers
    assert all(t.user_attrs.get("interrupted") for t in by_state["FAIL"])
    finished = by_state.get("COMPLETE", []) + by_state.get("PRUNED", [])
    assert len(finished) == 6, [(t.number, t.state.name) for t in trials]
    for lost in by_state["FAIL"]:  # each interrupted trial ran again with its own values
        assert any(t.params == lost.params and t.number > lost.number for t in finished)
    assert {t.params["dqn.lr"] for t in finished} == {0.004, 1e-7}
    # the resumed sampler draws new values (not its first ones again): six different alphas
    assert len({t.params["replay.alpha"] for t in finished}) == 6

    # at least one weak trial was pruned early, and its folder says where
    pruned = by_state.get("PRUNED", [])
    assert pruned, log
    for t in pruned:
        status = json.loads((out / f"trial-{t.number:04d}" / "status.json").read_text())
        assert status["state"] == "pruned"
        assert status["message"] == f"pruned at step {status['pruned_at']}"
        assert 3000 <= status["pruned_at"] <= status["steps"] < 6000  # after the warm-up
        # said by the sweep that ran it: the killed one (a trial done before the kill) or
        # the resumed one
        assert f"trial {t.number} pruned at step {status['pruned_at']}" in first + log
    # each was pruned for doing worse than trials finished before it at the same report
    # (the median pruner's rule, read back from the study: which rate that hits depends on
    # the evaluations' luck within 6,000 steps; the best trial's rate is checked below)
    # (a trial with no evaluation yet, all NaN, is pruned as well)
    complete = by_state.get("COMPLETE", [])
    for t in pruned:
        step = max(t.intermediate_values)
        mine = [v for v in t.intermediate_values.values() if not math.isnan(v)]
        before = [
            o.intermediate_values[step]
            for o in complete
            if step in o.intermediate_values and o.datetime_complete < t.datetime_complete
        ]
        before = [v for v in before if not math.isnan(v)]
        assert not mine or (before and max(mine) < max(before)), (
            t.number,
            t.intermediate_values,
            before,
        )
    # every trial is a run folder, and the table lists the six that count
    for t in finished:
        folder = out / f"trial-{t.number:04d}"
        for name in ("config.yaml", "results.jsonl", "final.json", "weights.npz", "status.json"):
            assert (folder / name).is_file(), (folder, name)
        cfg = yaml.safe_load((folder / "config.yaml").read_text())
        assert cfg["dqn"]["lr"] == t.params["dqn.lr"]
        assert cfg["replay"]["alpha"] == pytest.approx(t.params["replay.alpha"])
    table = log[log.index("trial  dqn.lr") :]
    assert len([line for line in table.splitlines() if line.strip()[:1].isdigit()]) == 8  # 6 + 2
    for name in ("history.png", "importances.png", "trials.json", "best.yaml"):
        assert (out / name).is_file(), name

    best = yaml.safe_load((out / "best.yaml").read_text())
    assert best["dqn"]["lr"] == study.best_trial.params["dqn.lr"] == 0.004
    run_dir = tmp_path / "best-run"
    done = subprocess.run(
        [
            str(BIN / "apex-dask-submit"),
            "--config",
            str(out / "best.yaml"),
            "--stop-timesteps",
            "1500",
            "--out",
            str(run_dir),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert rows[-1]["timesteps_total"] >= 1500
    trained = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert trained["learner"] == best["learner"] and trained["replay"] == best["replay"]


def _in_group(p: psutil.Process, pgid: int) -> bool:
    try:
        return os.getpgid(p.pid) == pgid
    except (ProcessLookupError, psutil.Error):
        return False


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.mark.timeout(600)
def test_a_grid_over_two_values_runs_exactly_those_configs_on_a_running_scheduler(tmp_path):
    pytest.importorskip("optuna")
    from distributed import Client, LocalCluster

    from apex_dask.runtime.observability.preload import PRELOAD

    space = tmp_path / "grid.yaml"
    space.write_text(
        f"base: {{preset: cartpole, set: {SET}}}\n"
        "space: {learner.batch_size: {grid: [32, 48]}}\n"
        "budget: {env_steps: 1000}\n"
        "pruner: {name: none}\n"
    )
    out = tmp_path / "grid"
    with (
        LocalCluster(
            n_workers=4,
            threads_per_worker=1,
            dashboard_address="127.0.0.1:0",
            scheduler_kwargs={"preload": [PRELOAD]},
        ) as cluster,
        Client(cluster) as client,
    ):
        proc = start(
            str(space),
            "--scheduler",
            cluster.scheduler_address,
            "--concurrent",
            "2",
            "--out",
            str(out),
        )
        log = proc.communicate(timeout=420)[0]
        assert proc.returncode == 0, log
        port = client.scheduler_info()["services"]["dashboard"]
        with urllib.request.urlopen(
            f"http://127.0.0.1:{port}/apex/metrics.json?series=0", timeout=20
        ) as r:
            runs = json.loads(r.read())["runs"]
        assert len(client.scheduler_info()["workers"]) == 4  # the cluster is not the sweep's
    assert "2 trials, 2 at once" in log
    folders = sorted(out.glob("trial-*"))
    assert [f.name for f in folders] == ["trial-0000", "trial-0001"]
    sizes = sorted(
        yaml.safe_load((f / "config.yaml").read_text())["learner"]["batch_size"] for f in folders
    )
    assert sizes == [32, 48]
    for f in folders:
        status = json.loads((f / "status.json").read_text())
        assert status["state"] == "complete" and status["steps"] >= 1000, status
    placements = [json.loads((f / "placement.json").read_text()) for f in folders]
    learners = {p["learner"]["address"] for p in placements}
    assert len(learners) == 2  # the two trials' learners on different workers
    used = [
        {p["learner"]["address"], *(e["address"] for e in p["env_workers"])} for p in placements
    ]
    assert not used[0] & used[1]  # each trial's actors on its own workers
    # both trials were runs on the scheduler's /apex page (its run selector), now done
    shown = {r["out"]: r for r in runs}
    assert {str(f.resolve()) for f in folders} <= set(shown), runs
    assert all(shown[str(f.resolve())]["done"] for f in folders)
    assert group_left(proc.pid) == []


@pytest.mark.timeout(600)
def test_sigterm_stops_the_running_trials_which_save_and_leaves_nothing_running(tmp_path):
    optuna = pytest.importorskip("optuna")
    space = tmp_path / "long.yaml"
    space.write_text(
        f"base: {{preset: cartpole, set: {SET}}}\n"
        "space: {replay.alpha: {uniform: [0.4, 0.7]}}\n"
        "budget: {time_s: 300}\n"
    )
    out = tmp_path / "long"
    proc = start(str(space), "--trials", "4", "--concurrent", "2", "--out", str(out))
    deadline = time.monotonic() + 400
    logs = [out / f"trial-{i:04d}" / "results.jsonl" for i in (0, 1)]
    while time.monotonic() < deadline and proc.poll() is None:
        if all(p.is_file() and p.stat().st_size > 0 for p in logs):
            break  # both trials are training
        time.sleep(0.5)
    assert proc.poll() is None, proc.communicate()[0]
    os.kill(proc.pid, signal.SIGTERM)
    log = proc.communicate(timeout=180)[0]
    assert proc.returncode == 75, log
    assert f"continue with apex-dask-sweep --resume {out}" in log.splitlines()[-1]
    assert group_left(proc.pid) == [], "the stopped sweep left processes running"
    for i in (0, 1):
        folder = out / f"trial-{i:04d}"
        status = json.loads((folder / "status.json").read_text())
        assert status["state"] == "interrupted", status
        assert (folder / "weights.npz").is_file() and (folder / "final.json").is_file()
        assert status["steps"] > 0
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    study = optuna.load_study(
        study_name="apex-sweep",
        storage=JournalStorage(JournalFileBackend(str(out / "study.journal"))),
    )
    states = [(t.number, t.state.name, t.user_attrs.get("interrupted")) for t in study.trials]
    assert states == [
        (0, "FAIL", True),
        (1, "FAIL", True),
        (2, "WAITING", None),
        (3, "WAITING", None),
    ]
    queued = [study.trials[n].system_attrs["fixed_params"] for n in (2, 3)]
    ran = [study.trials[n].params for n in (0, 1)]
    assert sorted(queued, key=str) == sorted(ran, key=str)  # queued again, the same values
