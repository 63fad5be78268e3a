"""Bad input and signals during real runs, through the real entry point (``python -m apex_dask``).

Every test checks the exit code, at most 3 lines on stderr, no traceback on
the console, a time bound, and that an earlier run's folder is byte-identical
afterwards. The Ctrl-C tests start the CLI's embedded cluster; the runs below
them share one explicit cluster (a ``dask scheduler`` and a ``dask worker
--nworkers 2`` process, started once for the module; the last test kills its
scheduler). The full-disk case writes into a 2 MiB tmpfs mounted by the test.
The rows that fail before any cluster starts are in ``test_bad_input_sweep.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "runtime"))
from bad_input import (  # noqa: E402
    FAST_S,
    SUBMIT,
    Done,
    check_console,
    check_no_empty_or_temporary_files,
    has_cuda,
    submit,
)
from polling import poll  # noqa: E402

pytestmark = pytest.mark.slow  # CLI runs on real clusters, killed and signalled mid-run


def test_ctrl_c_while_the_embedded_cluster_starts_stops_the_run(untouched, tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [*SUBMIT, "--set", "topology.local_workers=2", "--out", str(out), "--stop-time", "300"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        cwd=ROOT,
    )
    try:
        poll(lambda: (out / "config.yaml").exists(), timeout_s=60)  # checks done: starting
        os.killpg(proc.pid, signal.SIGINT)
        t0 = time.monotonic()
        stdout, stderr = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    done = Done(proc.returncode, stdout, stderr, took)
    check_console(done, 130, "interrupted")
    assert took < 60, took  # the cluster being started is closed first (a CPU hog slows it)
    results = out / "results.jsonl"
    assert not results.exists() or not results.read_bytes()
    names = {p.name for p in out.iterdir()}
    assert "config.yaml" in names
    assert names <= {"config.yaml", "results.jsonl", "apex-dask-submit.log"}, names


def test_a_second_ctrl_c_at_start_up_exits_at_once_in_one_line(untouched, tmp_path):
    # Before: the second Ctrl-C could land after the handlers were put back (the stop
    # itself finishing, interpreter shutdown) and end the process with -2 or a traceback.
    import psutil

    out = tmp_path / "run"
    err_file = tmp_path / "stderr.txt"
    with open(err_file, "w") as err:
        proc = subprocess.Popen(
            [*SUBMIT, "--set", "topology.local_workers=2", "--out", str(out)]
            + ["--stop-time", "300"],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            start_new_session=True,
            cwd=ROOT,
        )

    def stopping() -> bool:
        return proc.poll() is not None or "stopping while the run starts" in err_file.read_text()

    def forkserver() -> list:  # started: past the moment SIGINT is ignored (see cluster.py)
        kids = psutil.Process(proc.pid).children(recursive=True)
        try:
            return kids if any("forkserver" in " ".join(p.cmdline()) for p in kids) else []
        except psutil.NoSuchProcess:
            return []

    try:
        children = poll(forkserver, timeout_s=60)
        os.killpg(proc.pid, signal.SIGINT)
        poll(stopping, timeout_s=30)
        t0 = time.monotonic()
        _killpg(proc.pid, signal.SIGINT)  # while it stops, or as it exits
        stdout, _ = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    done = Done(proc.returncode, stdout, err_file.read_text(), took)
    check_console(done, 130, "SIGINT")  # never -2, never a traceback
    assert took < 10, took
    _, alive = psutil.wait_procs(children, timeout=30)  # the cluster being started is gone
    assert not alive, [p.cmdline() for p in alive]


# ---------------------------------------------------------------------------
# runs on one shared cluster
# ---------------------------------------------------------------------------

HOOKS = '''
import numpy as np

CALLS = 0


def nan_rewards_after_20(batch, shard_id):
    """Rewards turn NaN from the 21st replayed batch on (the loss then does too)."""
    global CALLS
    CALLS += 1
    if CALLS <= 20:
        return batch
    data = dict(batch["data"])
    data["reward"] = np.full(np.shape(data["reward"]), np.nan, np.float32)
    return {**batch, "data": data}
'''

RUN = [
    "--preset",
    "cartpole",
    "--quiet",
    "--set",
    "report.min_iter_time_s=1",
    "--set",
    "topology.call_timeout_s=10",
]


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """``(scheduler file, env)``: a ``dask scheduler`` and 2 worker processes with nannies;
    ``env`` puts the test hooks on PYTHONPATH of the workers and of the CLI."""
    from distributed import Client

    root = tmp_path_factory.mktemp("shared")
    (root / "sweep_hooks.py").write_text(HOOKS)
    sched_file = root / "scheduler.json"
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    bindir = Path(sys.executable).parent
    procs = [
        subprocess.Popen(
            [str(bindir / "dask"), "scheduler", "--scheduler-file", str(sched_file), "--port", "0"]
            + ["--dashboard-address", ":0", "--preload", "apex_dask.runtime.preload"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    ]
    try:
        poll(sched_file.exists, timeout_s=60)
        procs.append(
            subprocess.Popen(
                [str(bindir / "dask"), "worker", "--scheduler-file", str(sched_file)]
                + ["--nworkers", "2", "--nthreads", "1", "--memory-limit", "2GiB"],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        )
        with Client(scheduler_file=str(sched_file), timeout=30) as client:
            client.wait_for_workers(2, timeout=120)
        yield sched_file, {"PYTHONPATH": env["PYTHONPATH"]}
    finally:
        for p in reversed(procs):
            _killpg(p.pid, signal.SIGTERM)  # the last test kills the scheduler itself
        for p in reversed(procs):
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                _killpg(p.pid, signal.SIGKILL)


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_stop_time_is_checked_within_an_iteration(shared, untouched, tmp_path):
    sched_file, env = shared
    out = tmp_path / "run"
    args = [*RUN, "--scheduler-file", str(sched_file), "--out", str(out), "--stop-time", "6"]
    done = submit(*args, "--set", "report.timesteps_per_iteration=100000000", env=env, timeout=240)
    check_console(done, 0)
    results = _lines(out / "results.jsonl")
    assert len(results) == 1, results  # the partial iteration, recorded at the stop
    assert 6 <= results[0]["time_s"] < 6 + 4, results[0]["time_s"]
    assert "mid-iteration" in done.stdout
    final = json.loads((out / "final.json").read_text())
    assert final["timesteps_total"] == results[0]["timesteps_total"] > 0
    assert final["flow/rollouts_sent"] == final["flow/rollouts_stored"] > 0
    assert final["flow/rollouts_lost"] == 0
    assert (out / "weights.npz").exists() and (out / "placement.json").exists()


def start_on_shared(sched_file, env: dict, out, *flags: str) -> subprocess.Popen:
    """A CartPole run on the shared cluster, writing to ``out`` (stdout, stderr piped);
    ``flags`` (default: a 300 s stop time) go to the CLI."""
    return subprocess.Popen(
        [*SUBMIT, *RUN, "--scheduler-file", str(sched_file), "--out", str(out)]
        + list(flags or ("--stop-time", "300")),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
        cwd=ROOT,
    )


def test_sigterm_mid_run_saves_and_exits_with_the_preemption_code(shared, untouched, tmp_path):
    sched_file, env = shared
    out = tmp_path / "run"
    proc = start_on_shared(sched_file, env, out)
    try:
        poll(lambda: len(_lines(out / "results.jsonl")) >= 1 or proc.poll() is not None, 180)
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    done = Done(proc.returncode, stdout, stderr, time.monotonic() - t0)
    check_console(done, {75, 143}, "SIGTERM")
    assert done.seconds < 60, done.seconds
    with np.load(out / "weights.npz") as w:
        assert int(w["__version__"]) > 0
        assert all(np.isfinite(w[k]).all() for k in w.files)
    assert (out / "final.json").exists()
    text = (out / "results.jsonl").read_text()
    assert text.endswith("\n") and all(json.loads(x) for x in text.splitlines())


def test_a_non_finite_loss_stops_the_run_and_keeps_finite_weights(shared, untouched, tmp_path):
    sched_file, env = shared
    out = tmp_path / "run"
    hook = "learner.before_learn_on_batch=sweep_hooks:nan_rewards_after_20"
    args = [*RUN, "--scheduler-file", str(sched_file), "--out", str(out), "--stop-time", "120"]
    done = submit(*args, "--set", hook, env=env, timeout=240)
    check_console(done, 3, "non-finite loss", "update 21")
    with np.load(out / "weights.npz") as w:
        assert int(w["__version__"]) == 20
        assert all(np.isfinite(w[k]).all() for k in w.files)


@pytest.mark.parametrize(
    "device",
    [
        pytest.param("cuda", marks=pytest.mark.skipif(has_cuda(), reason="this machine has CUDA")),
        "cuda:63",
    ],
)
def test_a_device_missing_on_the_learners_worker_is_refused_before_any_actor(
    shared, untouched, tmp_path, device
):
    # the check runs on the worker, not the driver: here both lack the device
    sched_file, env = shared
    out = tmp_path / "run"
    args = [*RUN, "--scheduler-file", str(sched_file), "--set", f"learner.device={device}"]
    done = submit(*args, "--out", str(out), env=env, timeout=120)
    check_console(done, 2, f"learner.device={device!r}", "the learner's worker tcp://")
    assert "CUDA device" in done.stderr
    assert done.seconds < 30 + FAST_S, done.seconds
    assert "training" not in done.stdout  # refused before the driver made any actor
    assert not out.exists()  # nothing trained: the folder is free for the corrected run


def test_a_replay_too_large_for_the_learners_worker_is_refused_before_any_actor(shared, untouched):
    sched_file, env = shared  # its workers have 2 GiB each; 1e8 CartPole items need ~8 GB
    args = [*RUN, "--scheduler-file", str(sched_file), "--set", "replay.capacity=100000000"]
    done = submit(*args, env=env, timeout=120)
    check_console(done, 2, "replay.capacity=100,000,000", "the learner's worker tcp://", "lower it")
    assert done.seconds < 30 + FAST_S, done.seconds
    assert "training" not in done.stdout


def test_a_full_disk_mid_run_keeps_whole_files_and_exits_3(shared, untouched, small_disk):
    sched_file, env = shared
    out = small_disk.path / "run"
    proc = start_on_shared(sched_file, env, out)
    try:
        poll(lambda: len(_lines(out / "results.jsonl")) >= 1 or proc.poll() is not None, 180)
        config = (out / "config.yaml").read_bytes()
        small_disk.fill()
        t0 = time.monotonic()
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    done = Done(proc.returncode, stdout, stderr, time.monotonic() - t0)
    check_console(done, 3, "No space left on device")
    assert done.seconds < 60, done.seconds
    text = (out / "results.jsonl").read_text()
    assert text.endswith("\n") and all(json.loads(x) for x in text.splitlines()), text[-300:]
    assert (out / "config.yaml").read_bytes() == config
    if (out / "final.json").exists():
        json.loads((out / "final.json").read_text())
    check_no_empty_or_temporary_files(out)


def test_a_lost_env_worker_is_announced_and_accounted(shared, untouched, tmp_path):
    # Near the end: it kills a worker process of the shared cluster (its nanny restarts it).
    from distributed import Client

    sched_file, env = shared
    out = tmp_path / "run"
    proc = start_on_shared(sched_file, env, out, "--stop-time", "25", "--set", "eval.episodes=0")
    try:
        poll(lambda: len(_lines(out / "results.jsonl")) >= 1 or proc.poll() is not None, 180)
        before = json.loads((out / "placement.json").read_text())
        victim = before["env_workers"][0]["address"]
        assert victim != before["learner"]["address"]
        with Client(scheduler_file=str(sched_file), timeout=30) as client:
            pid = client.run(os.getpid, workers=[victim])[victim]
        os.kill(pid, signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    check_console(Done(proc.returncode, stdout, stderr, 0.0), 0)
    assert "env worker 0 was lost with its Dask worker" in stdout
    after = json.loads((out / "placement.json").read_text())
    assert victim not in {w["address"] for w in after["env_workers"]}
    final = json.loads((out / "final.json").read_text())
    assert final["faults/env_workers_replaced"] >= 1
    sent, stored, lost = (final[f"flow/rollouts_{k}"] for k in ("sent", "stored", "lost"))
    assert sent == stored + lost
    assert 0 <= lost <= final["faults/rollouts_failed"]


def test_a_restarted_scheduler_ends_the_run_in_one_line_and_keeps_what_was_written(
    shared, untouched, tmp_path
):
    # Last: it kills the shared cluster's scheduler and starts another at its address, as a
    # supervisor would. Whichever the CLI meets first (no answer, or a scheduler with another
    # id: the client reconnects, the actors are gone), it names the lost scheduler.
    from distributed import Client

    from apex_dask.experiment.checkpoints.store import load_checkpoint

    sched_file, env = shared
    with Client(scheduler_file=str(sched_file), timeout=30) as client:
        address = client.scheduler.address
        pid = client.run_on_scheduler(os.getpid)
    out = tmp_path / "run"
    proc = start_on_shared(
        sched_file, env, out, "--stop-time", "300", "--set", "checkpoint.interval_s=1"
    )

    def checkpoints() -> list[Path]:  # complete ones (a staged one is hidden: ".name")
        found = (out / "checkpoints").glob("*/manifest.json")
        return sorted(p.parent for p in found if not p.parent.name.startswith("."))

    def written() -> bool:
        return proc.poll() is not None or bool(
            checkpoints() and len(_lines(out / "results.jsonl")) >= 1
        )

    restarted = None
    try:
        poll(written, 180)
        assert proc.poll() is None, proc.communicate()
        before = {n: (out / n).read_bytes() for n in ("config.yaml", "results.jsonl")}
        os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        restarted = subprocess.Popen(
            [str(Path(sys.executable).parent / "dask"), "scheduler"]
            + ["--port", address.rsplit(":", 1)[1], "--dashboard-address", ":0"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        if restarted is not None:
            _killpg(restarted.pid, signal.SIGKILL)
            restarted.wait(timeout=30)
    done = Done(proc.returncode, stdout, stderr, time.monotonic() - t0)
    check_console(done, 3, f"lost the Dask scheduler at {address}")
    assert len(done.err_lines) == 1, done.stderr
    assert "learner is unreachable" not in done.stdout + done.stderr
    assert done.seconds < 60, done.seconds
    assert (out / "config.yaml").read_bytes() == before["config.yaml"]
    text = (out / "results.jsonl").read_text()
    assert text.startswith(before["results.jsonl"].decode()) and text.endswith("\n")
    assert all(json.loads(x) for x in text.splitlines())
    assert checkpoints(), list(out.rglob("*"))
    parts, _ = load_checkpoint(checkpoints()[-1])  # whole: every checksum verified
    assert all(np.isfinite(w).all() for w in parts["learner"]["online"].values())
