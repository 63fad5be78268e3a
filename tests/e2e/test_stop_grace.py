"""A stop inside ``checkpoint.grace_s`` on the embedded cluster, with a replay too big for it.

``apex-dask-submit`` trains an env of large observations (``tests/bulky_envs.py``:
64 KiB each, a few hundred MB of replay) with ``checkpoint.grace_s=6``. SIGTERM:
the process must end within the grace, exit 75 with a committed checkpoint that
kept the newest replay items that fit (its manifest and one console line say
what it left out), and ``--resume`` must continue from it with those items.
"""

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

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
SUBMIT = str(Path(sys.executable).parent / "apex-dask-submit")
GRACE_S = 6.0
SLACK_S = 1.5  # the process's own end after the watchdog's moment, on a loaded machine
BULKY = [
    "--no-tensorboard", "--set", "env.env_id=bulky_envs:Bulky-v0",
    "--set", "env.env_kwargs.obs_dim=16384", "--set", "replay.capacity=4000",
    "--set", "replay.learning_starts=64", "--set", "learner.batch_size=8",
    "--set", "dqn.hiddens=[16]", "--set", "learner.min_replay_ratio=null",
    "--set", "learner.max_replay_ratio=null", "--set", "eval.episodes=0",
    "--set", f"checkpoint.grace_s={GRACE_S}", "--set", "checkpoint.interval_s=0",
    "--set", "report.min_iter_time_s=1", "--set", "topology.local_workers=2",
]  # fmt: skip


def env() -> dict[str, str]:
    path = os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path}


def rows(out: Path) -> list[dict]:
    path = out / "results.jsonl"
    return (
        [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    )


def test_sigterm_with_a_replay_too_big_for_the_grace_ends_inside_it_and_resumes(tmp_path):
    out, log = tmp_path / "run", tmp_path / "run.log"
    argv = [SUBMIT, "--preset", "cartpole", "--out", str(out), "--stop-time", "600", *BULKY]
    proc = subprocess.Popen(
        argv, env=env(), stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 240
        while not (rows(out) and rows(out)[-1]["replay/size"] >= 1600):  # ~200 MB
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    text = log.read_text()
    assert code == 75, text[-3000:]
    assert took <= GRACE_S + SLACK_S, (took, text[-3000:])
    found = sorted((out / "checkpoints").glob("ckpt-*/manifest.json"))
    assert len(found) == 1, found  # no periodic one: the stop's own
    ckpt = found[0].parent
    # the run's last line, or the watchdog's if closing the cluster took the rest of the grace
    assert f"apex-dask-submit: preempted (SIGTERM); checkpoint {ckpt}" in text
    meta = read_manifest(ckpt)["metadata"]
    assert meta["reason"] == "preempted" and meta["within_s"] < GRACE_S
    left = meta["left_out"]
    assert 0 <= left["items_saved"] < left["items_held"] >= 1600, left
    note = f"note: checkpoint {ckpt.name} keeps what fit in the stop's {GRACE_S:g} s: "
    assert note + left["summary"] in text
    assert (out / "weights.npz").exists()  # from the checkpoint's learner part

    resumed = subprocess.run(
        [SUBMIT, "--resume", str(out), "--stop-iterations", str(int(meta["iteration"]) + 1)],
        env=env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"resumed from {ckpt}" in resumed.stdout
    assert f"{ckpt.name} was written inside a stop's grace: {left['summary']}" in resumed.stdout
    after = [r for r in rows(out) if r["iteration"] > meta["iteration"]]
    assert after and after[0]["timesteps_total"] > meta["timesteps_total"]
    # each shard went on from the items it kept (not from empty, not from all of them)
    assert after[0]["replay/size"] >= left["items_saved"]
    evicted = sum(after[0][f"replay/{k}/evicted"] for k in (0, 1))  # added - size
    assert evicted >= left["items_held"] - left["items_saved"]
