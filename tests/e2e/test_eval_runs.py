"""apex-dask-eval end to end: episodes spread over a real cluster's worker processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from trained_runs import cartpole_run, pendulum_run

sys.path.insert(0, str(Path(__file__).parents[1] / "runtime"))
from polling import poll  # noqa: E402

pytestmark = pytest.mark.slow

EVAL = str(Path(sys.executable).parent / "apex-dask-eval")


def evaluate(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    proc = subprocess.run([EVAL, *args], capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def newest_report(run: Path) -> dict:
    return json.loads(sorted(run.glob("eval-*.json"))[-1].read_text())


def test_eval_on_embedded_and_running_clusters_gives_the_same_episodes(tmp_path):
    from distributed import LocalCluster

    run = cartpole_run(tmp_path / "cp")
    videos = tmp_path / "videos"
    common = ["--episodes", "12", "--seed", "7", "--epsilon", "0.2"]
    proc = evaluate(
        str(run), *common, "--workers", "2", "--video", str(videos), "--video-episodes", "2"
    )
    for line in ("return mean", "return std", "length max", "episodes/s", "2 worker(s)"):
        assert line in proc.stdout, proc.stdout
    first = newest_report(run)
    assert first["workers"] == 2 and first["seed"] == 7 and first["episodes"] == 12
    assert len(set(first["lengths"])) > 1  # epsilon 0.2: episodes differ
    assert first["summary"]["return_max"] == max(first["returns"])
    assert len(first["videos"]) == 2

    import imageio.v2 as imageio

    for index, path in enumerate(sorted(first["videos"])):
        reader = imageio.get_reader(path)
        assert sum(1 for _ in reader) == first["lengths"][index] + 1
        reader.close()

    with LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=None) as cluster:
        evaluate(str(run), *common, "--scheduler", cluster.scheduler_address)
    second = newest_report(run)
    assert second["workers"] == 1
    assert second["returns"] == first["returns"]  # the same seed: the same episodes
    assert second["lengths"] == first["lengths"]


def test_a_dpg_run_plays_on_the_cluster_as_in_one_process(tmp_path):
    from apex_dask.algo.play.episodes import play_episodes
    from apex_dask.cli.runfolder import load_run
    from apex_dask.experiment.builder import agent_spec, env_factory

    run = pendulum_run(tmp_path / "pd")
    proc = evaluate(str(run), "--episodes", "6", "--seed", "5", "--workers", "2")
    assert "6 episodes of Pendulum-v1" in proc.stdout, proc.stdout
    report = newest_report(run)
    trained = load_run(str(run))
    rows = play_episodes(
        env_factory(trained.config),
        agent_spec(trained.config),
        trained.weights,
        range(6),
        base_seed=5,
    )
    assert report["returns"] == pytest.approx([r["return"] for r in rows], rel=1e-9)
    assert report["lengths"] == [200] * 6


@pytest.mark.parametrize(
    ("sig", "code", "line"),
    [("SIGINT", 130, "interrupted (Ctrl-C)"), ("SIGTERM", 143, "terminated (SIGTERM)")],
)
def test_a_stopped_eval_says_one_line_and_leaves_no_process(tmp_path, sig, code, line):
    import signal

    import psutil

    run = cartpole_run(tmp_path / "cp")
    proc = subprocess.Popen(
        [EVAL, str(run), "--episodes", "100000", "--workers", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        # playing: its two workers run episodes (each near a full core)
        def busy_workers() -> list[psutil.Process]:
            kids = psutil.Process(proc.pid).children(recursive=True)
            return [k for k in kids if k.cpu_percent(0.2) > 30] if len(kids) >= 3 else []

        workers = poll(
            lambda: len(busy_workers()) >= 2 and psutil.Process(proc.pid).children(recursive=True),
            timeout_s=120,
        )
        proc.send_signal(getattr(signal, sig))
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, err
    assert err.strip() == f"apex-dask-eval: {line}"
    assert not list(run.glob("eval-*.json"))  # nothing half-written
    poll(
        lambda: not [w for w in workers if w.is_running() and w.status() != "zombie"], timeout_s=30
    )
