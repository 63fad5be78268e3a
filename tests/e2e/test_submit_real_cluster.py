"""apex-dask-submit against real `dask scheduler` + `dask worker` processes on loopback."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from dask_procs import spawn as _spawn
from dask_procs import stop as _kill

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent


@pytest.fixture
def real_cluster(tmp_path):
    sched_file = tmp_path / "scheduler.json"
    procs = [
        _spawn(
            [
                str(BIN / "dask"),
                "scheduler",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--dashboard-address",
                ":0",
                "--scheduler-file",
                str(sched_file),
                "--preload",
                "apex_dask.runtime.preload",
            ],
            tmp_path / "scheduler.log",
        )
    ]
    try:
        deadline = time.monotonic() + 60
        while not sched_file.exists():
            assert time.monotonic() < deadline, (tmp_path / "scheduler.log").read_text()
            assert procs[0].poll() is None, (tmp_path / "scheduler.log").read_text()
            time.sleep(0.2)
        common = [
            "--scheduler-file",
            str(sched_file),
            "--nthreads",
            "1",
            "--no-dashboard",
            "--host",
            "127.0.0.1",
        ]
        procs.append(
            _spawn(
                [str(BIN / "dask"), "worker", *common, "--name", "cpu-0"], tmp_path / "cpu-0.log"
            )
        )
        procs.append(
            _spawn(
                [str(BIN / "dask"), "worker", *common, "--name", "learner", "--resources", "GPU=1"],
                tmp_path / "learner.log",
            )
        )
        address = json.loads(sched_file.read_text())["address"]
        from distributed import Client

        with Client(address, timeout=30) as client:
            client.wait_for_workers(2, timeout=60)
        yield address, tmp_path
    finally:
        _kill(procs[1:])
        _kill(procs[:1])


def test_submit_trains_cartpole_on_real_scheduler_and_workers(real_cluster):
    address, tmp_path = real_cluster
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            str(BIN / "apex-dask-submit"),
            "--scheduler",
            address,
            "--preset",
            "cartpole",
            "--stop-timesteps",
            "12000",
            "--stop-time",
            "150",
            "--out",
            str(out),
            "--set",
            "report.min_iter_time_s=2",
            "--set",
            "eval.interval_s=2",
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "/apex" in proc.stdout and "no Ape-X page" not in proc.stdout  # the preload ran
    results = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert results, proc.stdout
    last = results[-1]
    placement = json.loads((out / "placement.json").read_text())
    assert placement["learner"]["name"] == "learner"
    for shard in range(2):
        assert f"replay/{shard}/size" in last, sorted(last)
        assert last[f"replay/{shard}/added"] > 0
    assert last["sync/weight_syncs"] > 0
    assert last["flow/batches_lost"] == 0
    assert last["learner/steps_trained"] > 0
    best_eval = max(r["eval/return_mean"] for r in results if "eval/return_mean" in r)
    trace = [
        (r["timesteps_total"], r["learner/steps_trained"], r.get("eval/return_mean"))
        for r in results
    ]
    assert best_eval >= 100, trace  # random play averages ~22
    assert (out / "weights.npz").stat().st_size > 0
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["algo"] == "dqn" and saved["env"]["env_id"] == "CartPole-v1", saved
