"""The CLI's last step: every process it started has ended before it returns
(``apex_dask.cli.watch.reap_children``), run in a process of its own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psutil

ROOT = Path(__file__).parents[2]

SCRIPT = r"""
import json, subprocess, sys
from pathlib import Path
from apex_dask.cli.watch import child_pids, reap_children
log = Path(sys.argv[1])
before = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
spare = child_pids()  # there before the run: not the run's to end
quick = subprocess.Popen([sys.executable, "-c", "pass"])
stuck = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
killed = reap_children(log, grace_s=1.0, spare=spare)
spared = before.poll() is None
before.kill()
print(json.dumps({"killed": killed, "pids": [quick.pid, stuck.pid], "spared": spared}))
"""


def test_processes_left_after_the_grace_are_killed_and_logged(tmp_path):
    log = tmp_path / "apex-dask-submit.log"
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(log)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(out["killed"]) == 1 and "SIG_IGN" in out["killed"][0]
    assert out["spared"]  # a process that was there before the run is left alone
    assert not [p for p in out["pids"] if psutil.pid_exists(p) and _alive(p)]
    assert "killed 1 process(es) still running 1 s after the cluster closed" in log.read_text()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
