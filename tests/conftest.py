"""Fixtures of the bad-input tests (``test_bad_input_sweep.py``, ``e2e/test_bad_input_runs.py``).

``untouched`` is an earlier run's folder that must be byte-identical after the
test; ``small_disk`` is a 2 MiB tmpfs (skipped where it cannot be mounted).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from bad_input import SmallDisk, snapshot


@pytest.fixture(scope="module")
def old_run(tmp_path_factory) -> Path:
    """An earlier run's folder: results, config, weights, final dict."""
    run = tmp_path_factory.mktemp("runs") / "ok"
    run.mkdir()
    (run / "config.yaml").write_text("env:\n  env_id: CartPole-v1\n")
    lines = [json.dumps({"iteration": i, "timesteps_total": 1000 * i}) for i in (1, 2, 3)]
    (run / "results.jsonl").write_text("\n".join(lines) + "\n")
    (run / "final.json").write_text(json.dumps({"iteration": 3}))
    np.savez(run / "weights.npz", __version__=np.asarray(7), w=np.ones(4, np.float32))
    return run


@pytest.fixture
def untouched(old_run):
    before = snapshot(old_run)
    yield old_run
    assert snapshot(old_run) == before, "an earlier run's folder changed"


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    cmd = ["mount", "-t", "tmpfs", "-o", "size=2M", "tmpfs", str(mount)]
    try:
        subprocess.run(cmd, check=True, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): {exc}")
    try:
        yield SmallDisk(mount)
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, timeout=30)
