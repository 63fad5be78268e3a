"""A sweep killed after each of its journal writes, then resumed, runs every grid point
exactly once.

``tests/sweep_kill.py K`` is the real ``apex-dask-sweep`` whose study journal writer
SIGKILLs the process right after its K-th record. A two-point grid of tiny CartPole
trials on a real ``dask scheduler`` + ``dask worker`` (started once, so each sweep only
connects) first runs whole, which counts its N journal writes; then for every K in
1 ... N a fresh sweep is killed after write K and ``--resume``d. Each time: both grid
points completed exactly once (one finished trial per slot, with that slot's value), no
trial left waiting or running, every trial folder that wrote a complete status is a
COMPLETE trial (none lost, none run twice), and a second ``--resume`` changes nothing.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dask_procs import spawn as _spawn
from dask_procs import stop as _stop

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SPACE = """\
base:
  preset: cartpole
  set:
    workers.num_workers: 1
    replay.num_shards: 1
    replay.capacity: 2000
    replay.learning_starts: 64
    learner.batch_size: 32
    dqn.hiddens: [16]
    report.min_iter_time_s: 0
    report.timesteps_per_iteration: 100
    eval.episodes: 0
    checkpoint.interval_s: 0
space:
  learner.n_step: {grid: [1, 2]}
objective: {metric: env/episode_return_mean}
budget: {env_steps: 300}
pruner: {name: none, reports: 1}
"""
POINTS = [1, 2]


@pytest.fixture(scope="module")
def scheduler_file(tmp_path_factory):
    """A real scheduler and one worker process for every sweep of this module."""
    where = tmp_path_factory.mktemp("cluster")
    sched = where / "scheduler.json"
    procs = [
        _spawn(
            [str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", "0",
             "--dashboard-address", ":0", "--scheduler-file", str(sched)],
            where / "scheduler.log",
        )
    ]  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not sched.exists():
            assert time.monotonic() < deadline and procs[0].poll() is None, (
                where / "scheduler.log"
            ).read_text()
            time.sleep(0.2)
        procs.append(
            _spawn(
                [str(BIN / "dask"), "worker", "--scheduler-file", str(sched), "--nthreads", "1",
                 "--no-dashboard", "--host", "127.0.0.1", "--name", "w0"],
                where / "worker.log",
            )
        )  # fmt: skip
        from distributed import Client

        with Client(json.loads(sched.read_text())["address"], timeout=30) as client:
            client.wait_for_workers(1, timeout=60)
        yield sched
    finally:
        _stop(procs[1:])
        _stop(procs[:1])


def sweep(kill_after: int, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "tests" / "sweep_kill.py"), str(kill_after), *args],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
    )


def _trials(folder: Path) -> list:
    import optuna

    from apex_dask.cli.sweep.study import JOURNAL, STUDY_NAME

    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(folder / JOURNAL))
    )
    return optuna.load_study(study_name=STUDY_NAME, storage=storage).get_trials()


def check_each_point_once(folder: Path, log: str) -> None:
    trials = _trials(folder)
    states = [(t.number, t.state.name, t.params, dict(t.user_attrs)) for t in trials]
    finished = [
        t
        for t in trials
        if t.state.name in ("COMPLETE", "PRUNED")
        or (t.state.name == "FAIL" and not t.user_attrs.get("interrupted"))
    ]
    assert sorted(t.params["learner.n_step"] for t in finished) == POINTS, (states, log)
    assert all(t.state.name == "COMPLETE" for t in finished), (states, log)
    assert not [t for t in trials if t.state.name in ("WAITING", "RUNNING")], (states, log)
    # every trial that wrote a complete result is one of the COMPLETE trials: none lost,
    # none run twice
    written = sorted(
        int(p.parent.name.split("-")[1])
        for p in folder.glob("trial-*/status.json")
        if json.loads(p.read_text())["state"] == "complete"
    )
    assert written == sorted(t.number for t in finished), (written, states, log)


@pytest.mark.timeout(1500)
def test_every_kill_point_then_resume_runs_each_grid_point_exactly_once(tmp_path, scheduler_file):
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    cluster = ["--scheduler-file", str(scheduler_file), "--quiet"]
    whole = sweep(0, str(space), "--out", str(tmp_path / "whole"), *cluster)
    assert whole.returncode == 0, whole.stderr
    check_each_point_once(tmp_path / "whole", whole.stdout)
    writes = int(whole.stderr.rsplit("journal-writes: ", 1)[1].split()[0])
    assert writes >= 8, whole.stderr  # create, attrs, 2 points, 2 x (ask, param, outcome, tell)
    for k in range(1, writes + 1):
        folder = tmp_path / f"kill-{k:02d}"
        killed = sweep(k, str(space), "--out", str(folder), *cluster)
        assert killed.returncode == -signal.SIGKILL, (k, killed.stdout, killed.stderr)
        resumed = sweep(0, "--resume", str(folder), *cluster)
        log = f"k={k}\n{killed.stdout}\n--- resume ---\n{resumed.stdout}\n{resumed.stderr}"
        assert resumed.returncode == 0, log
        check_each_point_once(folder, log)
        before = [(t.number, t.state.name) for t in _trials(folder)]
        again = sweep(0, "--resume", str(folder), *cluster)
        assert again.returncode == 0 and "2 of 2 trials done" in again.stdout, again.stdout
        assert [(t.number, t.state.name) for t in _trials(folder)] == before, log


def test_concurrent_above_trials_is_lowered_with_one_line(tmp_path, scheduler_file):
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    done = sweep(
        0, str(space), "--out", str(tmp_path / "o"), "--concurrent", "4",
        "--scheduler-file", str(scheduler_file),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    note = [line for line in lines if "concurrent " in line]
    assert note == ["apex-dask-sweep: concurrent 4 is more than the sweep's 2 trials: 2 at once"]
    assert "2 trials, 2 at once" in done.stdout
    check_each_point_once(tmp_path / "o", done.stdout)
    checked = sweep(0, str(space), "--out", str(tmp_path / "c"), "--concurrent", "4", "--check")
    assert checked.returncode == 0 and "2 trials, 2 at once" in checked.stdout, checked.stderr
    assert not (tmp_path / "c").exists()  # --check makes nothing
