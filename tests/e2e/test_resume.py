"""apex-dask-submit --resume: after kill -9 of the whole process group, and after SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from apex_dask.experiment.checkpoint import read_manifest

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
COMMON = [
    "--set",
    "report.min_iter_time_s=1",
    "--set",
    "topology.local_workers=2",
    "--set",
    "checkpoint.interval_s=2",
    "--set",
    "eval.interval_s=2",
]


def submit(*args: str) -> list[str]:
    return [str(BIN / "apex-dask-submit"), *args]


def lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def newest(out: Path) -> Path | None:
    found = sorted((out / "checkpoints").glob("ckpt-*/manifest.json"))
    return found[-1].parent if found else None


def start(out: Path, log: Path) -> subprocess.Popen:
    args = submit("--preset", "cartpole", "--out", str(out), "--stop-time", "600", *COMMON)
    return subprocess.Popen(
        args, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True
    )


def wait_for(proc: subprocess.Popen, log: Path, condition, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert proc.poll() is None, log.read_text()[-2000:]
        assert time.monotonic() < deadline, log.read_text()[-2000:]
        time.sleep(0.5)


def test_resume_of_a_folder_without_a_checkpoint_is_one_line(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("env:\n  env_id: CartPole-v1\n")
    proc = subprocess.run(
        submit("--resume", str(tmp_path / "run")), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2, proc.stderr
    assert "no checkpoint in" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_kill_9_of_the_whole_group_then_resume_continues_the_run(tmp_path):
    out, log = tmp_path / "run", tmp_path / "first.log"
    proc = start(out, log)
    try:
        wait_for(
            proc, log, lambda: newest(out) is not None and len(lines(out / "results.jsonl")) >= 3
        )
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    ckpt = newest(out)
    meta = read_manifest(ckpt)["metadata"]
    before = lines(out / "results.jsonl")
    stop = int(meta["iteration"]) + 3
    resumed = subprocess.run(
        submit("--resume", str(out), "--stop-iterations", str(stop), "--set", "checkpoint.keep=3"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert f"resumed from {ckpt}" in resumed.stdout
    after = lines(out / "results.jsonl")[len(before) :]
    assert after, resumed.stdout
    assert after[0]["iteration"] == meta["iteration"] + 1  # counters continue
    assert after[0]["timesteps_total"] > meta["timesteps_total"]
    assert after[-1]["iteration"] == stop
    assert after[0]["replay/size"] > 0  # the replay came back with the checkpoint
    record = lines(out / "resumes.jsonl")
    assert record and record[-1]["checkpoint"] == ckpt.name
    assert record[-1]["overrides"] == {"checkpoint.keep": "3", "stop.iterations": stop}


def test_sigterm_writes_a_checkpoint_and_exits_75(tmp_path):
    out, log = tmp_path / "run", tmp_path / "run.log"
    proc = start(out, log)
    try:
        wait_for(proc, log, lambda: len(lines(out / "results.jsonl")) >= 2)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert code == 75, log.read_text()[-2000:]
    meta = read_manifest(newest(out))["metadata"]
    assert meta["reason"] == "preempted"
    # the stop may add one partial iteration to results.jsonl after the checkpoint
    assert meta["iteration"] >= lines(out / "results.jsonl")[-1]["iteration"] - 1
