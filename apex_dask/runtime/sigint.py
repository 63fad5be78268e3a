"""Imported first by the multiprocessing forkserver of local clusters (its preload).

It makes the forkserver ignore SIGINT before the forkserver records the
handlers its children get back, so every worker process forked from it
(nanny restarts included) ignores Ctrl-C, which a terminal sends to the
whole process group: the driver stops the run and closes the workers
itself. The driver's own handler is never touched.
"""

import signal

signal.signal(signal.SIGINT, signal.SIG_IGN)
