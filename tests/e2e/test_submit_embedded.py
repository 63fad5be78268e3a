"""apex-dask-submit on its embedded LocalCluster: a short run, and Ctrl-C mid-run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _run_args(out: Path, *extra: str) -> list[str]:
    return [
        str(BIN / "apex-dask-submit"),
        "--preset",
        "cartpole",
        "--out",
        str(out),
        "--set",
        "report.min_iter_time_s=1",
        "--set",
        "topology.local_workers=2",
        *extra,
    ]


def test_short_embedded_run_writes_results_config_and_weights(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        _run_args(out, "--stop-timesteps", "4000"), capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "dashboard http" in proc.stdout
    assert "Summary" in proc.stdout
    results = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in results] == list(range(1, len(results) + 1))
    assert results[-1]["timesteps_total"] >= 4000
    final = json.loads((out / "final.json").read_text())
    assert final["flow/batches_lost"] == 0
    assert final["flow/batches_trained"] > 0
    with np.load(out / "weights.npz") as weights:
        assert int(weights["__version__"]) > 0
        assert len(weights.files) > 2
    assert "CartPole-v1" in (out / "config.yaml").read_text()


def test_ctrl_c_saves_what_it_has_and_releases_the_cluster(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen(
        _run_args(out, "--stop-time", "600"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        results = out / "results.jsonl"
        while not (results.exists() and results.read_text().count("\n") >= 2):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no results within 180 s"
            time.sleep(0.5)
        children = _descendants(proc.pid)
        assert children, "the embedded cluster should run worker processes"
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal does: the whole process group
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stdout + stderr
    assert "interrupted" in stderr
    assert "Traceback" not in stderr, stderr
    assert "Summary" in stdout
    with np.load(out / "weights.npz") as weights:
        assert int(weights["__version__"]) > 0
    assert (out / "config.yaml").exists()
    gone, alive = psutil.wait_procs(children, timeout=30)
    assert not alive, [p.cmdline() for p in alive]
    assert os.path.getsize(results) > 0
