"""Who gets into a running scheduler: probes run as separate processes with a clean Dask config."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

PROBE = """
import sys
from apex_dask.runtime.orchestration.cluster import connect
try:
    if sys.argv[1] == "file":
        client = connect(scheduler_file=sys.argv[2], timeout=15)
    else:
        from distributed import Client
        client = Client(sys.argv[2], timeout=8)
    print("CONNECTED", client.scheduler_info(n_workers=0)["type"])
    client.close()
except BaseException as exc:
    print("REFUSED", type(exc).__name__, exc)
"""


def _probe(kind: str, target: str, where: list[str]) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DASK_DISTRIBUTED__COMM__")}
    out = subprocess.run([*where, sys.executable, "-c", PROBE, kind, target], env=env,
                         capture_output=True, text=True, timeout=90)  # fmt: skip
    return out.stdout.strip() or out.stderr.strip()[-300:]


def who_gets_in(sched_file: Path, where: list[str] | None = None) -> dict[str, str]:
    """Probe the scheduler of ``sched_file``: with the run's credentials (found beside the
    file), without any, and over plain TCP; then with the credentials again, which shows
    the scheduler was up throughout. Values start with CONNECTED or REFUSED. ``where``
    prefixes each probe's command (e.g. ``ip netns exec NS``)."""
    address = json.loads(sched_file.read_text())["address"]
    at = where or []
    return {
        "address": address,
        "run_credentials": _probe("file", str(sched_file), at),
        "no_credentials": _probe("address", address, at),
        "plain_tcp": _probe("address", address.replace("tls://", "tcp://"), at),
        "run_credentials_again": _probe("file", str(sched_file), at),
    }


def assert_outsiders_refused(address: str) -> None:
    """Neither a client without credentials nor a plain-TCP one gets into ``address``."""
    assert address.startswith("tls://"), address
    for target in (address, address.replace("tls://", "tcp://")):
        got = _probe("address", target, [])
        assert got.startswith("REFUSED"), (target, got)


def assert_only_the_run_gets_in(sched_file: Path, where: list[str] | None = None) -> None:
    got = who_gets_in(sched_file, where)
    assert got["address"].startswith("tls://"), got
    assert got["run_credentials"].startswith("CONNECTED"), got
    assert got["no_credentials"].startswith("REFUSED"), got
    assert got["plain_tcp"].startswith("REFUSED"), got
    assert got["run_credentials_again"].startswith("CONNECTED"), got


def assert_private_credentials(folder: Path) -> None:
    """The run's ``tls/``: its three files, mode 0600, in a 0700 folder."""
    assert sorted(f.name for f in folder.iterdir()) == ["ca.pem", "cert.pem", "key.pem"]
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in folder.iterdir())


HTTP_PROBE = """
import sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=10) as r:
        print(r.status)
except Exception as exc:
    print(type(exc).__name__, exc)
"""


def http_get(where: list[str], url: str) -> str:
    """GET ``url`` (from inside a namespace: ``where`` = ``ip netns exec NS``): the status,
    or the error."""
    out = subprocess.run([*where, sys.executable, "-c", HTTP_PROBE, url], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    return out.stdout.strip() or out.stderr.strip()[-300:]
