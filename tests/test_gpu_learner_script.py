"""``benchmarks/gpu_learner.py``: fails fast without CUDA; its CPU dry run measures every
row of the plain loop and writes the table and the JSON."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest
import torch

SCRIPT = pathlib.Path(__file__).parents[1] / "benchmarks" / "gpu_learner.py"


def run(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(SCRIPT), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_without_a_cuda_device_it_stops_at_once_with_one_line(tmp_path):
    out = tmp_path / "gpu.json"
    res = run("--out", str(out), timeout=60)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "no CUDA device" in lines[0] and "--device cpu --smoke" in lines[0]
    assert not out.exists()


@pytest.mark.slow
def test_the_cpu_dry_run_measures_each_plain_row_and_writes_json(tmp_path):
    out = tmp_path / "gpu.json"
    res = run("--device", "cpu", "--smoke", "--phases", "plain", "--out", str(out))
    assert res.returncode == 0, res.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    combos = {(r["net"], r["batch"], r["amp"]) for r in rows}
    assert combos == {
        (n, b, a) for n in ("atari", "minatar") for b in (8, 16) for a in ("off", "bf16")
    }
    assert all(r["updates_per_s"] > 0 and r["compute_ms"] > 0 for r in rows)
    assert "upd/s" in res.stdout and "(ms per update)" in res.stdout
