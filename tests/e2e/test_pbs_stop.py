"""``qdel`` of cluster/pbs/apex.pbs mid-run, through the PBS stand-ins (``tests/e2e/shims``).

``qdel`` sends SIGTERM to the job's process group -- the job script, the Dask
scheduler and workers, the driver -- and SIGKILL 10 s later, as PBS does with its
``kill_delay``. The Dask processes ignore the SIGTERM (``apex_dask.runtime.shield``),
the job script passes it on to the driver and waits, so the driver writes a
checkpoint before the cluster is closed, exits 75 and nothing is left running.
"""

from __future__ import annotations

import json
import subprocess
import uuid

import pytest
from proctrack import assert_nothing_left
from test_hpc_scripts import ROOT, job_env, poll

pytestmark = pytest.mark.slow


def test_qdel_mid_run_leaves_a_checkpoint_and_the_driver_exits_75(tmp_path):
    marker, state = uuid.uuid4().hex, tmp_path / "state"
    env = job_env(marker, state)
    args = "--stop-time 600 --quiet --set report.min_iter_time_s=1 --set checkpoint.grace_s=7"
    settings = f"APEX_PRESET=cartpole,APEX_WORKERS_PER_NODE=1,APEX_DASHBOARD=:0,APEX_ARGS={args}"
    script = ROOT / "cluster" / "pbs" / "apex.pbs"
    try:
        proc = subprocess.run(["qsub", "-v", settings, str(script)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=30)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        job_id = proc.stdout.strip()
        seq = job_id.split(".")[0]
        out, log = tmp_path / f"apex-{seq}" / "results", tmp_path / f"apex.o{seq}"

        def training() -> bool:
            path = out / "results.jsonl"
            return path.exists() and bool(path.read_text().strip())

        poll(training, 180, 0.5)
        assert subprocess.run(["qdel", job_id], env=env, timeout=60).returncode == 0
    finally:
        assert_nothing_left(marker, grace_s=30, what="qdel")  # SIGKILL came 10 s after
    text = log.read_text()
    found = sorted((out / "checkpoints").glob("ckpt-*/manifest.json"))
    assert found, text[-3000:]
    assert json.loads(found[-1].read_text())["metadata"]["reason"] == "preempted"
    assert f"apex-dask-submit: preempted (SIGTERM); checkpoint {found[-1].parent}" in text
    assert "apex.pbs: the driver exited 75" in text
    assert "apex.pbs: stopping the Dask cluster" in text.split("the driver exited 75")[-1]
