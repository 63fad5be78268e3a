"""Running ``python -m apex_dask`` on bad input and checking what it leaves behind.

Shared by ``test_bad_input_sweep.py`` (rows that fail before any cluster
starts) and ``e2e/test_bad_input_runs.py`` (runs on a real cluster): the
console checks (exit code, at most 3 lines on stderr, no traceback), an
earlier run's folder that must stay byte-identical, and a 2 MiB tmpfs for the
full-disk cases. The fixtures that go with them are in ``conftest.py``.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
SUBMIT = [sys.executable, "-m", "apex_dask"]
FAST_S = 10.0  # a row that fails before anything starts (about 1 s unloaded)


@dataclass
class Done:
    code: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def err_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]


def submit(*args: str, env: dict | None = None, timeout: float = 120) -> Done:
    t0 = time.monotonic()
    proc = subprocess.run(
        [*SUBMIT, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=ROOT,
    )
    return Done(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - t0)


def check_console(done: Done, code: int | set[int], *needles: str) -> None:
    codes = {code} if isinstance(code, int) else code
    assert done.code in codes, (done.code, done.stdout[-2000:], done.stderr)
    assert "Traceback" not in done.stderr and "Traceback" not in done.stdout, done.stderr
    assert len(done.err_lines) <= 3, done.stderr
    for needle in needles:
        assert needle in done.stderr, (needle, done.stderr)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


class SmallDisk:
    """A 2 MiB tmpfs at ``path``; :meth:`fill` takes every byte left."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fill(self) -> None:
        block = b"\0" * 65536
        with open(self.path / "filler", "ab", buffering=0) as f:
            try:
                while True:
                    f.write(block)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
        with pytest.raises(OSError):  # full: not even one more byte
            with open(self.path / "filler", "ab", buffering=0) as f:
                f.write(b"x")


def check_no_empty_or_temporary_files(out: Path) -> None:
    files = [p for p in out.rglob("*") if p.is_file()]
    assert not [p for p in files if p.stat().st_size == 0], files
    assert not [p for p in out.rglob("*") if ".tmp" in p.name], list(out.rglob("*"))
