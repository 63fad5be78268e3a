"""A real SLURM site for the tests: ``cluster/slurm_site.sh`` in the background.

munged, slurmctld and one slurmd per node (gpu1 in partition ``gpu`` with a GRES
``gpu``; cpu1, cpu2 in partition ``cpu``), each node a network namespace; the
config, state and port are the site's own. ``SlurmSite.env()`` is the
environment that reaches it (``SLURM_CONF``); ``stop()`` cancels every job and
removes everything, and fails the test if a namespace or the bridge is left.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from netnsprobe import namespaces_unavailable

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "cluster" / "slurm_site.sh"
BIN = Path(sys.executable).parent
TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sinfo")


def unavailable() -> str | None:
    """Why the site cannot be built here (None: it can): root and namespaces only."""
    return namespaces_unavailable(("ip", "nsenter"), "a SLURM site with namespace nodes:")


def missing_tools() -> list[str]:
    return [t for t in TOOLS if shutil.which(t) is None]


class SlurmSite:
    """The running site: its workdir, nodes (``site.json``) and environment."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.log = (workdir / "site.out").open("w")
        self.proc = subprocess.Popen(
            [str(SCRIPT), "--workdir", str(workdir)],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 120
        while not (workdir / "env").exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the SLURM site did not start: {self.output()[-3000:]}")
            time.sleep(0.2)
        self.conf = str(workdir / "slurm.conf")
        self.nodes: dict[str, dict[str, str]] = json.loads((workdir / "site.json").read_text())

    def output(self) -> str:
        return (self.workdir / "site.out").read_text()

    def env(self, **extra: str) -> dict[str, str]:
        """This environment, with the site's SLURM_CONF and the venv's scripts first on PATH."""
        path = os.pathsep.join([str(BIN), os.environ["PATH"]])
        return dict(os.environ, SLURM_CONF=self.conf, PATH=path, **extra)

    def run(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(
            list(argv), env=self.env(), capture_output=True, text=True, timeout=timeout
        )

    def jobs(self) -> list[dict[str, str]]:
        """Jobs in squeue (pending, running, completing): id, name, state, reason."""
        out = self.run("squeue", "-h", "-o", "%i|%j|%T|%r").stdout
        keys = ("id", "name", "state", "reason")
        return [
            dict(zip(keys, line.split("|"), strict=False))
            for line in out.splitlines()
            if line.strip()
        ]

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job`` as a dict (the first component of a heterogeneous job)."""
        out = self.run("scontrol", "-o", "show", "job", job_id).stdout.splitlines()
        fields: dict[str, str] = {}
        for token in (out[0] if out else "").split():
            key, _, value = token.partition("=")
            fields.setdefault(key, value)
        return fields

    def node_of(self, address: str) -> str | None:
        """The node whose address appears in a Dask address such as ``tls://198.19.7.21:4000``."""
        for name, node in self.nodes.items():
            if f"//{node['address']}:" in address:
                return name
        return None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # the script stops its daemons in order
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.log.close()
        namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
        left = [
            n["ns"] for n in getattr(self, "nodes", {}).values() if n["ns"] in namespaces.stdout
        ]
        assert not left, f"namespaces outlived the SLURM site: {left}"
