"""``python tests/sweep_kill.py K SWEEP-ARGS...``: ``apex-dask-sweep`` that SIGKILLs itself
right after its K-th journal write (K = 0: never), for ``test_sweep_kill.py``.

The study journal's writer (Optuna's ``JournalFileBackend.append_logs``, one call per
record) is wrapped: the record is written and synced as usual, then the count is checked.
Nothing else changes; the sweep and its trials are the real ones. The number of records
written is printed to stderr as ``journal-writes: N`` when the sweep ends by itself.
"""

from __future__ import annotations

import os
import signal
import sys


def main() -> int:
    limit, argv = int(sys.argv[1]), sys.argv[2:]
    from optuna.storages.journal import JournalFileBackend  # extra: sweep

    write = JournalFileBackend.append_logs
    count = [0]

    def counted(self, logs):  # type: ignore[no-untyped-def]
        write(self, logs)
        count[0] += 1
        if count[0] == limit:
            os.kill(os.getpid(), signal.SIGKILL)

    JournalFileBackend.append_logs = counted  # type: ignore[method-assign]
    from apex_dask.cli.sweep.main import main as sweep

    code = sweep(argv)
    print(f"journal-writes: {count[0]}", file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
