"""``apex-dask-sweep``: search config keys with Optuna, K trials at once on one Dask cluster.

Examples::

    apex-dask-sweep space.yaml --trials 20 --concurrent 2 --out sweeps/lr
    apex-dask-sweep --resume sweeps/lr                 # after a crash, SIGKILL or preemption
    apex-dask-sweep space.yaml --scheduler-file ~/sched.json --concurrent 8 --out sweeps/big
    apex-dask-sweep space.yaml --cluster slurm --concurrent 4 --out sweeps/slurm

The file format is in :mod:`.spec` and docs/sweeps.md. Everything is checked
before any trial starts (a bad space is one line, exit 2). Exit status: 0
done, 2 bad input, 3 a fault ended the sweep (lost scheduler, every trial
failed), 75 stopped by SIGTERM/SIGUSR1 (resume it), 130 Ctrl-C.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

from apex_dask.cli.checks import UsageError, check_cluster_flags, check_device, probe_env
from apex_dask.cli.clusterflags import add_cluster_flags, close_cluster, is_embedded
from apex_dask.cli.exitcodes import (
    EXIT_FAULT,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PREEMPTED,
    EXIT_USAGE,
    classify,
)
from apex_dask.cli.outdir import check_out, make_out
from apex_dask.cli.signals import StopSignals, exit_now_if_signalled
from apex_dask.cli.sweep.spec import SweepError, SweepSpec, load_sweep
from apex_dask.cli.sweep.start import DEFAULT_TRIALS, open_sweep, plan_trials

__all__ = ["build_parser", "main", "run"]

PREFIX = "apex-dask-sweep:"
LOG_NAME = "apex-dask-sweep.log"


def say(line: str) -> None:
    print(f"{PREFIX} {line}", flush=True)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="apex-dask-sweep",
        description="Search Ape-X config keys with Optuna: K trials at once on one Dask "
        "cluster, weak ones pruned early, resumable. With no --scheduler/--scheduler-file/"
        "--cluster, an embedded LocalCluster sized to K trials is started.",
        epilog="File format: docs/sweeps.md. Exit status: 0 done; 2 bad input (nothing "
        "started); 3 a fault ended the sweep; 75 SIGTERM/SIGUSR1 (--resume it); 130 Ctrl-C.",
    )
    p.add_argument("space", nargs="?", metavar="SPACE.yaml", help="the sweep file")
    from apex_dask.cli.rllib import add_rllib_flags

    add_rllib_flags(p.add_argument_group("from RLlib (docs/rllib.md)"))
    p.add_argument(
        "--trials",
        type=int,
        metavar="N",
        help="trials in all (default: the file's trials:, else the grid's size, else "
        f"{DEFAULT_TRIALS}); with --resume, raises the total",
    )
    p.add_argument(
        "--concurrent",
        type=int,
        metavar="K",
        help="trials running at once (default: the file's concurrent:, else 1)",
    )
    p.add_argument("--out", metavar="DIR", help="the sweep folder (new or empty)")
    p.add_argument(
        "--resume",
        metavar="DIR",
        help="continue the sweep in DIR: interrupted trials run again, then the rest",
    )
    p.add_argument(
        "--workers-per-trial",
        type=int,
        metavar="W",
        help="embedded cluster: worker processes per trial (default: the base's "
        "topology.local_workers, else 2); the cluster has K x W",
    )
    add_cluster_flags(p, jobqueue=True)
    p.set_defaults(jobs=None)
    p.add_argument(
        "--check",
        action="store_true",
        help="check the sweep file, the flags and the space, print the plan and exit 0; "
        "nothing is made or started (the env is made when the sweep runs)",
    )
    p.add_argument("--quiet", action="store_true", help="no per-trial start lines")
    p.add_argument("--debug", action="store_true", help="tracebacks and Dask's log on the console")
    return p


def _positive(flag: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise UsageError(f"{flag} {value} must be >= 1")


def _prepare(args: argparse.Namespace) -> tuple[Path, SweepSpec, bool]:
    """``(folder, spec, resuming)``, every input checked; nothing created yet."""
    for flag in ("trials", "concurrent", "workers_per_trial"):
        _positive("--" + flag.replace("_", "-"), getattr(args, flag))
    if getattr(args, "adapt", None):
        raise UsageError("--adapt is not for sweeps: each trial keeps the workers it starts on")
    if args.resume:
        if args.space or args.out or args.from_rllib:
            raise UsageError(
                "--resume DIR takes the sweep from DIR; drop SPACE.yaml, --from-rllib and --out"
            )
        from apex_dask.cli.sweep.study import check_resumable

        folder = Path(args.resume).expanduser()
        check_resumable(folder)
        spec = load_sweep(folder / "sweep.yaml")
        return folder, spec, True
    from apex_dask.cli.rllib import check_rllib_flags

    check_rllib_flags(args, exclusive=("space",))
    if args.from_rllib:
        from apex_dask.cli.rllib import sweep_spec

        spec = sweep_spec(args)
    elif not args.space:
        raise UsageError(
            "give a sweep file (SPACE.yaml), --from-rllib FILE or --resume DIR; see docs/sweeps.md"
        )
    else:
        spec = load_sweep(args.space)
    out = args.out or f"sweep-{time.strftime('%Y%m%d-%H%M%S')}"
    folder = check_out(out)
    assert folder is not None
    return folder, spec, False


def _probe(spec: SweepSpec, embedded: bool) -> None:
    """The env (each env id the space names too) and, here, the learner's device."""
    probe_env(spec.base)
    for p in spec.space.params:
        if p.key == "env.env_id":
            for env_id in getattr(p, "values", ()):
                probe_env(spec.base.override({"env.env_id": env_id}))
    if embedded:
        check_device(spec.base)


def run(args: argparse.Namespace) -> int:
    """Check everything, then sweep; the exit code."""
    from apex_dask.cli.sweep.study import SweepLock, import_optuna

    with warnings.catch_warnings(record=True) as moved:  # a moved or retired key: one line
        warnings.simplefilter("always", FutureWarning)
        folder, spec, resuming = _prepare(args)
    for line in dict.fromkeys(str(w.message) for w in moved if w.category is FutureWarning):
        print(f"{PREFIX} note: {line}", flush=True)
    import_optuna()
    trials = plan_trials(args.trials, folder, spec, resuming)
    k = args.concurrent or spec.concurrent or 1
    if k > trials:
        say(f"concurrent {k} is more than the sweep's {trials} trials: {trials} at once")
        k = trials
    if args.jobs is None:
        args.jobs = k  # --cluster: one env-worker job per trial ...
    if getattr(args, "cluster", None) and not any(
        o.replace("-", "_").startswith("learner_processes=") for o in args.jobqueue_opt
    ):
        args.jobqueue_opt.append(f"learner_processes={k}")  # ... and a learner process each
    check_cluster_flags(args)
    embedded = is_embedded(args)
    if args.check:
        say(
            f"{'resuming ' if resuming else ''}{trials} trials, {k} at once, in {folder}; "
            "space: " + "; ".join(spec.space.describe())
        )
        return EXIT_OK
    # signals: a stop during the checks raises; from the first journal write on, it only
    # asks the sweep to stop (between writes), so the journal never holds half a step
    signals = StopSignals.install(PREFIX)
    signals.saving = {"SIGINT": "each running trial", "SIGTERM": "each running trial"}
    try:
        _probe(spec, embedded)
        signals.phase = "running"
        if not resuming:
            make_out(folder)
        lock = SweepLock(folder)
        try:
            study = open_sweep(folder, spec, trials, k, resuming, say)
            return _sweep(args, folder, spec, study, trials, k, embedded, signals)
        finally:
            lock.release()
    finally:
        signals.restore()  # kept after a stop: a second signal still exits at once


def _sweep(
    args: argparse.Namespace,
    folder: Path,
    spec: SweepSpec,
    study: Any,
    trials: int,
    k: int,
    embedded: bool,
    signals: StopSignals,
) -> int:
    from apex_dask.cli.sweep.report import draw_plots, format_table, trial_rows, write_best
    from apex_dask.cli.sweep.study import counted
    from apex_dask.cli.watch import child_pids, quiet_teardown_logs, reap_children, route_logs

    before = child_pids()
    route_logs(folder / LOG_NAME, debug=args.debug)
    stop = threading.Event()
    client = cluster = runner = None
    error: BaseException | None = None
    try:
        done, _ = counted(study)
        if done < trials and not signals.requested:
            signals.phase = "startup"  # a stop while the cluster starts: release it
            client, cluster = _open(args, folder, spec, k, embedded)
            signals.phase = "running"
            runner = _runner(folder, spec, study, client, k, trials, stop, args)

            def poll() -> None:
                if signals.requested:
                    stop.set()

            runner.run(poll)
    except BaseException as exc:  # noqa: BLE001 - classified below
        error = exc
        stop.set()
    finally:
        signals.phase = "saving"
        quiet_teardown_logs()
        close_cluster(client, cluster)
        reap_children(folder / LOG_NAME, spare=before)
    rows = trial_rows(study, spec)
    if rows:
        print("\n" + format_table(rows, spec) + "\n", flush=True)
    best = write_best(folder, study, spec, rows)
    say(
        f"best: {best}; wrote {folder / 'best.yaml'}"
        if best
        else "no trial completed: no best.yaml"
    )
    for note in draw_plots(folder, study):
        say(note)
    return _exit_code(folder, study, signals, runner, error, args)


def _open(
    args: argparse.Namespace, folder: Path, spec: SweepSpec, k: int, embedded: bool
) -> tuple[Any, Any]:
    from apex_dask.cli.clusterflags import open_cluster

    w = args.workers_per_trial or spec.base.topology.local_workers or 2
    client, cluster = open_cluster(
        args, spec.base, prefix=PREFIX, local_workers=k * w, tls_dir=folder / "tls"
    )
    from apex_dask.runtime.observability.preload import dashboard_url

    where = f"embedded LocalCluster ({k * w} workers)" if embedded else "cluster"
    try:
        link = dashboard_url(client)
    except Exception:  # no dashboard
        link = None
    say(f"running on the {where}" + (f"; trials on {link}" if link else ""))
    return client, cluster


def _runner(
    folder: Path,
    spec: SweepSpec,
    study: Any,
    client: Any,
    k: int,
    trials: int,
    stop: threading.Event,
    args: argparse.Namespace,
) -> Any:
    from apex_dask.cli.sweep.groups import split_workers
    from apex_dask.cli.sweep.runner import SweepRunner
    from apex_dask.runtime.orchestration.cluster import wait_for_workers

    workers = wait_for_workers(client, 1, max(30.0, args.connect_timeout))
    groups = split_workers(workers, k)
    if len(workers) < k:
        say(f"{len(workers)} worker(s) for {k} slots: trials share workers")
    for i, g in enumerate(groups):
        say(f"slot {i}: {g.describe()}")
    return SweepRunner(
        folder, spec, study, client, groups, trials=trials, stop=stop, say=say, quiet=args.quiet
    )


def _exit_code(
    folder: Path,
    study: Any,
    signals: StopSignals,
    runner: Any,
    error: BaseException | None,
    args: argparse.Namespace,
) -> int:
    from apex_dask.cli.sweep.study import counted

    done, _ = counted(study)
    if error is not None and not isinstance(error, KeyboardInterrupt):
        if args.debug:
            raise error
        code, line = classify(
            error, started=runner is not None, log_hint=f"see {folder / LOG_NAME}"
        )
        print(f"{PREFIX} {line}", file=sys.stderr, flush=True)
        return code
    resume = f"apex-dask-sweep --resume {folder}"
    if signals.requested or isinstance(error, KeyboardInterrupt):
        name = signals.requested or getattr(error, "signame", "SIGINT")
        code = EXIT_INTERRUPTED if name == "SIGINT" else EXIT_PREEMPTED
        print(
            f"{PREFIX} stopped ({name}) with {done} trial(s) done; continue with {resume}",
            file=sys.stderr,
        )
        return code
    if runner is not None and runner.lost_scheduler:
        print(f"{PREFIX} error: lost the Dask scheduler; continue with {resume}", file=sys.stderr)
        return EXIT_FAULT
    states = [t.state.name for t in study.get_trials(deepcopy=False)]
    if states and all(s == "FAIL" for s in states):
        print(
            f"{PREFIX} error: every trial failed; see {folder}/trial-*/status.json", file=sys.stderr
        )
        return EXIT_FAULT
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code = run(args)
    except BaseException as exc:  # noqa: BLE001 - input errors and Ctrl-C before the sweep
        if isinstance(exc, SystemExit):
            raise
        if args.debug:
            raise
        if isinstance(exc, UsageError | SweepError):
            code, line = EXIT_USAGE, f"error: {' '.join(str(exc).split())}"
        else:
            code, line = classify(
                exc, started=False, log_hint="rerun with --debug for the traceback"
            )
        print(f"{PREFIX} {line}", file=sys.stderr)
    exit_now_if_signalled(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
