"""Find the processes an end-to-end test started, by a marker in their environment.

Every process a launcher starts inherits the marker variable, including the
worker processes a Dask nanny spawns, which a command-line match would miss.
"""

from __future__ import annotations

import time

import psutil
import pytest

MARK = "APEX_E2E_MARKER"


def processes_marked(marker: str) -> list[psutil.Process]:
    """Live (non-zombie) processes whose environment carries ``MARK=marker``."""
    found = []
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get(MARK) == marker:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


def assert_nothing_left(marker: str, grace_s: float = 5.0, what: str = "the run") -> None:
    """Fail (after killing them) if processes started under ``marker`` outlive ``grace_s``."""
    deadline = time.monotonic() + grace_s
    while (left := processes_marked(marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    if left:
        described = []
        for proc in left:
            try:
                described.append(" ".join(proc.cmdline())[:160])
                proc.kill()
            except psutil.Error:
                pass
        pytest.fail(f"{len(left)} process(es) outlived {what}: {described}")
