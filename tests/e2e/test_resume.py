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

from apex_dask.experiment.checkpoints.store import read_manifest

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


def start(out: Path, log: Path, *extra: str) -> subprocess.Popen:
    args = submit("--preset", "cartpole", "--out", str(out), "--stop-time", "600", *COMMON, *extra)
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


def tensorboard_scalars(folder: Path, tag: str) -> list[tuple[int, float]]:
    """``(step, value)`` of every event of ``tag``, as TensorBoard shows them (purges applied)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def rising(values: list[float]) -> bool:
    return all(a < b for a, b in zip(values, values[1:], strict=False))


def test_kill_9_of_the_whole_group_then_resume_continues_the_run(tmp_path):
    """kill -9 a few rows past a checkpoint, the newest checkpoint then damaged and a write
    of a later one left half-way: the resume removes the leftover (saying how much was
    freed), skips the damaged checkpoint (naming it), continues from the one before,
    moves the rows past it to a side file, and results.jsonl and TensorBoard only rise."""
    out, log = tmp_path / "run", tmp_path / "first.log"
    proc = start(out, log, "--set", "checkpoint.interval_s=4")
    try:
        wait_for(
            proc, log, lambda: len(sorted((out / "checkpoints").glob("ckpt-*/manifest.json"))) >= 2
        )
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    *_, ckpt, damaged = sorted(p.parent for p in (out / "checkpoints").glob("ckpt-*/manifest.json"))
    part = damaged / "shard_0.npz"
    part.write_bytes(part.read_bytes()[: part.stat().st_size // 2])  # cut short
    left = out / "checkpoints" / ".ckpt-000099.tmp-killed"
    left.mkdir()
    (left / "shard_0.npz").write_bytes(b"\0" * 1_000_000)
    meta = read_manifest(ckpt)["metadata"]
    before = lines(out / "results.jsonl")
    past = [r for r in before if r["iteration"] > meta["iteration"]]
    assert len(past) >= 2, (meta, [r["iteration"] for r in before])  # a few rows past it
    steps_before = tensorboard_scalars(out / "tensorboard", "iteration")
    assert max(s for s, _ in steps_before) > meta["timesteps_total"]
    stop = int(meta["iteration"]) + 3
    resumed = subprocess.run(
        submit("--resume", str(out), "--stop-iterations", str(stop), "--set", "checkpoint.keep=3"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    said = resumed.stdout
    assert resumed.returncode == 0, said[-2000:] + resumed.stderr[-2000:]
    note = "apex-dask-submit: note: "
    assert f"{note}removed 1 unfinished checkpoint write from {out / 'checkpoints'} (1.0 MB" in said
    assert not left.exists()
    assert "checkpoint" not in resumed.stderr  # each said once, on the console's stdout
    skipped = next(x for x in said.splitlines() if x.startswith(f"{note}skipped checkpoint"))
    assert skipped.startswith(f"{note}skipped checkpoint {damaged.name}, it does not verify: ")
    assert f"{part}: " in skipped and skipped.endswith(f"moved it to {damaged.name}.damaged")
    rows = "row" if len(past) == 1 else "rows"
    assert f"{note}moved {len(past)} {rows} of results.jsonl past checkpoint {ckpt.name}" in said
    assert "to results.rewound-1.jsonl" in said
    assert f"resumed from {ckpt}" in said
    # rows past the checkpoint moved aside, whole and in order; the rest kept
    assert lines(out / "results.rewound-1.jsonl") == past
    now = lines(out / "results.jsonl")
    assert now[: len(before) - len(past)] == [r for r in before if r not in past]
    after = now[len(before) - len(past) :]
    assert after, said
    assert after[0]["iteration"] == meta["iteration"] + 1  # counters continue
    assert after[0]["timesteps_total"] > meta["timesteps_total"]
    assert after[-1]["iteration"] == stop
    assert after[0]["replay/size"] > 0  # the replay came back with the checkpoint
    assert rising([r["iteration"] for r in now]) and rising([r["timesteps_total"] for r in now])
    # TensorBoard, read back as it shows them: no fold either
    shown = tensorboard_scalars(out / "tensorboard", "iteration")
    assert rising([s for s, _ in shown]) and rising([v for _, v in shown]), shown
    assert [v for _, v in shown][-3:] == [stop - 2, stop - 1, stop]
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
