"""The exit status of ``apex-dask-submit``, one per way a run can end.

=====  ==================  =====================================================
code   name                meaning
=====  ==================  =====================================================
0      ``EXIT_OK``         done: a stop condition was met
2      ``EXIT_USAGE``      bad input (config, flags, env, device, memory, --out,
                           scheduler address, the learner worker's device or
                           memory): nothing was trained (an --out whose disk
                           is full before training counts here)
3      ``EXIT_FAULT``      a runtime fault ended the run (lost learner or shard,
                           lost scheduler, the env raised, non-finite loss, a
                           full disk, a supervised background task that ends
                           the run, a law of the counters broken with
                           ``report.strict_invariants``); what existed was saved
75     ``EXIT_PREEMPTED``  SIGTERM or SIGUSR1 (scancel, a time limit, docker
                           stop): stopped, a checkpoint was written (resumable)
130    ``EXIT_INTERRUPTED`` Ctrl-C: stopped, what existed was saved
143    ``EXIT_TERMINATED`` SIGTERM or SIGUSR1 and no checkpoint could be written
                           (the weights were saved if the learner answered)
=====  ==================  =====================================================

Each ends with one line on stderr naming the cause (0: none). 75 is
``EX_TEMPFAIL`` of ``sysexits.h``: "try again", which is what a preempted run
should do (``--resume``); 130 and 143 are the shell's 128 + SIGINT / SIGTERM.
"""

from __future__ import annotations

import errno

__all__ = [
    "EXIT_FAULT",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_PREEMPTED",
    "EXIT_TERMINATED",
    "EXIT_USAGE",
    "HELP",
    "classify",
]

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_FAULT = 3
EXIT_PREEMPTED = 75
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143

HELP = (
    "exit status: 0 done; 2 bad input (nothing started); 3 a runtime fault ended the run "
    "(lost learner or scheduler, the env raised, non-finite loss, disk full, a background task "
    "failed, a law broken with report.strict_invariants; what existed is saved); 75 preempted by SIGTERM/SIGUSR1 with a checkpoint written; 130 interrupted "
    "(Ctrl-C; a second Ctrl-C exits at once); 143 SIGTERM/SIGUSR1 without a checkpoint "
    "(weights saved)."
)


_BAD_INPUT = {
    "UsageError",
    "ConfigError",
    "RLlibError",
    "UnknownEnvError",
    "TrackingError",
    "JobqueueError",
    "CheckpointError",
    "DamagedCheckpoint",
    "InputError",
    "SpaceError",
}


def classify(exc: BaseException, *, started: bool, log_hint: str) -> tuple[int, str]:
    """``(exit code, the one stderr line)`` for an exception that ended the CLI.

    ``started``: training had begun (a runtime error then is a fault, 3; before,
    an unreachable scheduler or an actor that cannot be made is bad input, 2).
    ``log_hint`` says where the traceback went, for unexpected exceptions.
    """
    name = type(exc).__name__
    if isinstance(exc, KeyboardInterrupt):
        signame = getattr(exc, "signame", "SIGINT")
        code = EXIT_INTERRUPTED if signame == "SIGINT" else EXIT_TERMINATED
        when = "while training" if started else "before training started"
        return code, f"interrupted ({signame}) {when}"
    text = " ".join(str(exc).split())
    if any(c.__name__ in _BAD_INPUT for c in type(exc).__mro__):
        return EXIT_USAGE, f"error: {text}"
    if name in ("ApexRuntimeError", "BackgroundTaskFailed", "InvariantViolated", "OutputError"):
        return (EXIT_FAULT if started else EXIT_USAGE), f"error: {text}"
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        what = f" writing {exc.filename}" if exc.filename else ""
        code = EXIT_FAULT if started else EXIT_USAGE
        return code, f"error: no space left on device{what}; files already written are whole"
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return EXIT_FAULT, f"failed: {name}: {first} ({log_hint})"
