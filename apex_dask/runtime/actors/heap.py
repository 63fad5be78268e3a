"""glibc heap settings for the learner's process.

Dask's nanny starts each worker with ``MALLOC_TRIM_THRESHOLD_=65536``
(``distributed.nanny.pre-spawn-environ``) so that freed memory goes back to the
OS. Setting any glibc threshold also turns off its dynamic mmap threshold, so
every allocation over 128 KiB becomes an ``mmap`` and every free an
``munmap``: each activation and gradient tensor of an update is then fresh
pages that the kernel must fault in and zero. On the MinAtar network at batch
128 that alone took a plain update loop from 8.8 to 13.8 ms
(``benchmarks/learner_overhead.py``).

:func:`keep_freed_heap` gives the learner's process back a reusable heap:
blocks up to ``mmap_bytes`` come from the heap, and up to ``trim_bytes`` of
free heap is kept rather than returned. Replay arrays (allocated once, far
larger) are unaffected. Process-wide; a no-op off glibc.
"""

from __future__ import annotations

import ctypes
import sys

__all__ = ["keep_freed_heap"]

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def keep_freed_heap(trim_bytes: int = 256 << 20, mmap_bytes: int = 32 << 20) -> bool:
    """Raise glibc's trim and mmap thresholds for this process; True if applied.

    ``mmap_bytes`` is capped by glibc at 32 MiB on 64-bit systems.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, int(mmap_bytes))) and bool(
        mallopt(_M_TRIM_THRESHOLD, int(trim_bytes))
    )
