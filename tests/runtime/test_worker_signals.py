"""Worker processes of local clusters ignore Ctrl-C: the driver stops them itself."""

from __future__ import annotations

import subprocess
import sys


def test_a_process_that_imports_the_forkserver_preload_survives_sigint():
    # The forkserver of a local cluster imports this module first; each worker it forks
    # inherits the ignored SIGINT a terminal's Ctrl-C sends to the whole process group.
    code = (
        "import os, signal\n"
        "assert signal.getsignal(signal.SIGINT) is signal.default_int_handler\n"
        "import apex_dask.runtime.sigint\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"
        "print('still running')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "still running\n"
