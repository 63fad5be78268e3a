"""Real ``dask scheduler`` / ``dask worker`` processes for tests: started in their own
process group, stopped (SIGTERM, then SIGKILL after 15 s) with everything they started."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path


def spawn(args: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        args, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True
    )


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
