"""``apex-dask-submit``: train Ape-X on a Dask cluster from the command line.

Examples::

    apex-dask-submit --preset cartpole --stop-reward 475            # embedded LocalCluster
    apex-dask-submit --scheduler tcp://10.0.0.5:8786 --preset cartpole
    apex-dask-submit --scheduler-file ~/sched.json --config run.yaml --set learner.lr=1e-3
    apex-dask-submit --cluster slurm --jobs 4 --preset atari

Bad input (config, flags, env ids, scheduler addresses, output folders)
prints one line on stderr and exits with status 2; nothing is started.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from apex_dask.cli.output import format_summary, merge_final, save_outputs
from apex_dask.cli.tracking import RunReporter, add_tracking_flags
from apex_dask.config import PRESETS, ApexConfig, ConfigError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="apex-dask-submit",
        description="Train Ape-X (distributed prioritized replay DQN) on a Dask cluster. "
        "With no --scheduler/--scheduler-file/--cluster, an embedded LocalCluster is started.",
        epilog="Config keys: apex-dask-submit --list-keys. Metrics: docs/metrics.md.",
    )
    g = p.add_argument_group("configuration")
    g.add_argument(
        "--preset",
        default=None,
        help=f"start from a preset: {', '.join(sorted(PRESETS))} "
        "(default: cartpole, unless --config names one)",
    )
    g.add_argument(
        "--config", metavar="FILE.yaml", help="YAML config (nested sections or dotted keys)"
    )
    g.add_argument(
        "--set",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="override one config key, e.g. --set replay.alpha=0.5 (repeatable)",
    )
    g.add_argument(
        "--list-keys", action="store_true", help="list every config key with its doc and exit"
    )
    c = p.add_argument_group("cluster (pick at most one; default: embedded LocalCluster)")
    c.add_argument("--scheduler", metavar="ADDRESS", help="address of a running `dask scheduler`")
    c.add_argument(
        "--scheduler-file", metavar="PATH", help="scheduler file written by `dask scheduler`"
    )
    c.add_argument(
        "--cluster", choices=["slurm", "pbs"], help="start workers as batch jobs via dask-jobqueue"
    )
    c.add_argument(
        "--jobs", type=int, default=2, help="with --cluster: number of CPU worker jobs (default 2)"
    )
    c.add_argument(
        "--jobqueue-opt",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="with --cluster: option for the jobqueue cluster, e.g. queue=gpu (repeatable)",
    )
    c.add_argument(
        "--jobqueue-wait",
        type=float,
        default=None,
        metavar="S",
        help="with --cluster: give up if the jobs' workers have not all joined after S seconds "
        "(default: wait for the queue)",
    )
    c.add_argument(
        "--connect-timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds to wait for the scheduler (default 10)",
    )
    s = p.add_argument_group("stopping (first met wins)")
    s.add_argument("--stop-timesteps", type=int, metavar="N", help="env steps sampled")
    s.add_argument(
        "--stop-reward", type=float, metavar="R", help="greedy eval return (else episode return)"
    )
    s.add_argument("--stop-time", type=float, metavar="S", help="wall-clock seconds")
    s.add_argument("--stop-iterations", type=int, metavar="N", help="result dicts")
    o = p.add_argument_group("output")
    o.add_argument(
        "--out", metavar="DIR", help="write results.jsonl, config.yaml and weights.npz here"
    )
    o.add_argument("--quiet", action="store_true", help="no per-iteration progress lines")
    o.add_argument("--debug", action="store_true", help="show full tracebacks")
    add_tracking_flags(o)
    return p


# ---------------------------------------------------------------------------
# Input handling: everything is checked before any process starts.
# ---------------------------------------------------------------------------


def resolve_config(args: argparse.Namespace) -> ApexConfig:
    """Build the one ApexConfig from --preset, --config, --set and --stop-*."""
    if args.config:
        cfg = ApexConfig.from_yaml(args.config)
        if args.preset:  # the explicit preset is the base; the file's keys apply on top
            import yaml

            data = yaml.safe_load(Path(args.config).read_text()) or {}
            data["preset"] = args.preset
            cfg = ApexConfig.from_dict(data)
    else:
        cfg = ApexConfig.preset(args.preset or "cartpole")
    overrides: dict[str, Any] = {}
    for item in args.set:
        if "=" not in item:
            raise UsageError(
                f"--set {item!r} must look like KEY=VALUE, e.g. --set replay.alpha=0.5"
            )
        key, value = item.split("=", 1)
        overrides[key.strip()] = value
    for flag, key in (
        ("stop_timesteps", "stop.timesteps"),
        ("stop_reward", "stop.reward"),
        ("stop_time", "stop.time_s"),
        ("stop_iterations", "stop.iterations"),
    ):
        value = getattr(args, flag)
        if value is not None:
            overrides[key] = value
    return cfg.override(overrides) if overrides else cfg


def check_cluster_flags(args: argparse.Namespace) -> None:
    chosen = [f for f in ("scheduler", "scheduler_file", "cluster") if getattr(args, f)]
    if len(chosen) > 1:
        names = " and ".join("--" + f.replace("_", "-") for f in chosen)
        raise UsageError(f"{names} exclude each other; give at most one")
    if args.scheduler_file and not Path(args.scheduler_file).is_file():
        raise UsageError(
            f"scheduler file {args.scheduler_file!r} does not exist; start "
            f"`dask scheduler --scheduler-file {args.scheduler_file}` first or fix the path"
        )
    if args.jobs < 1:
        raise UsageError(f"--jobs {args.jobs} must be >= 1")
    if args.connect_timeout <= 0:
        raise UsageError(f"--connect-timeout {args.connect_timeout} must be > 0")


def prepare_out(out: str | None) -> Path | None:
    """Create --out and prove it is writable, before training starts."""
    if out is None:
        return None
    path = Path(out).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".apex-write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise UsageError(
            f"--out {out!r} is not writable ({reason}); choose another folder"
        ) from None
    return path


def check_env(cfg: ApexConfig) -> None:
    from apex_dask.algo.envs import check_env_id

    check_env_id(cfg.env.env_id)


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------


def _connect(args: argparse.Namespace, cfg: ApexConfig):
    """Return (client, closer) for the chosen cluster, or (None, None) for embedded."""
    from apex_dask.runtime.orchestration.cluster import connect

    if args.cluster:
        from distributed import Client

        from apex_dask.cli.jobqueue import (
            make_jobqueue_cluster,
            parse_jobqueue_opts,
            wait_for_jobqueue_workers,
        )

        opts = parse_jobqueue_opts(args.jobqueue_opt)
        cluster = make_jobqueue_cluster(args.cluster, args.jobs, cfg, **opts)
        try:
            print(
                f"apex-dask-submit: submitted {args.cluster} jobs; waiting for their workers "
                f"({'no limit' if args.jobqueue_wait is None else f'{args.jobqueue_wait:g} s'})",
                flush=True,
            )
            wait_for_jobqueue_workers(cluster, args.jobqueue_wait)
            client = Client(cluster, direct_to_workers=True)
        except BaseException:
            cluster.close()
            raise
        return client, cluster
    if args.scheduler or args.scheduler_file:
        client = connect(
            address=args.scheduler, scheduler_file=args.scheduler_file, timeout=args.connect_timeout
        )
        return client, None
    return start_embedded(cfg)


def start_embedded(cfg: ApexConfig):
    """Start the embedded LocalCluster with worker processes that ignore SIGINT.

    Ctrl-C in a terminal reaches the whole process group; the workers must
    survive it so the driver can halt the run, fetch the weights and then
    close the cluster itself.
    """
    import signal
    import threading

    from apex_dask.runtime.orchestration.cluster import start_local_cluster

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if in_main else None
    try:
        cluster, client = start_local_cluster(cfg.topology.local_workers)
    finally:
        if in_main:
            signal.signal(signal.SIGINT, previous)
    return client, cluster


def run(args: argparse.Namespace) -> int:
    if args.list_keys:
        for key, doc in ApexConfig.field_docs().items():
            print(f"{key:<36} {doc}")
        return EXIT_OK
    check_cluster_flags(args)
    cfg = resolve_config(args)
    out = prepare_out(args.out)
    check_env(cfg)
    reporter = RunReporter(args, cfg, out)  # progress line, W&B; checks --wandb
    if out is not None:
        save_outputs(out, cfg, None)

    from apex_dask.experiment.stop import StopRule
    from apex_dask.runtime.orchestration.driver import ApexDriver

    rule = StopRule(cfg.stop, use_eval=cfg.eval.episodes > 0)

    client, cluster = _connect(args, cfg)
    results: list[dict[str, Any]] = []
    reason = "finished"
    code = EXIT_OK
    driver = None
    jsonl = open(out / "results.jsonl", "w") if out is not None else None  # noqa: SIM115
    try:
        driver = ApexDriver(cfg, client=client, tensorboard_dir=reporter.tensorboard_dir)
        reporter.start(driver.run_id)
        link = getattr(driver, "dashboard_link", None)
        where = (
            "embedded LocalCluster"
            if not (args.scheduler or args.scheduler_file or args.cluster)
            else "cluster"
        )
        print(f"apex-dask-submit: training {cfg.env.env_id} on the {where}", flush=True)
        if link:
            print(f"apex-dask-submit: dashboard {link}", flush=True)
        if not (link or "").rstrip("/").endswith("/apex"):
            print(
                "apex-dask-submit: no Ape-X page on this scheduler (metrics still go to "
                "/apex/metrics.json and /metrics); start it with "
                "`dask scheduler --preload apex_dask.runtime.preload` to get /apex",
                flush=True,
            )
        placement = getattr(driver, "placement", None)
        if placement and not args.quiet:
            learner = placement.get("learner", {})
            print(f"apex-dask-submit: learner on {learner.get('name') or learner}", flush=True)
        if placement and out is not None:
            (out / "placement.json").write_text(json.dumps(placement, indent=2, default=str))
        for result in driver.iterate():
            results.append(result)
            if jsonl is not None:
                jsonl.write(json.dumps(result, default=float) + "\n")
                jsonl.flush()
            reporter.update(result)
            why = rule.after_result(result)
            if why:
                reason = why
                break
    except KeyboardInterrupt:
        reason = "interrupted (Ctrl-C)"
        code = EXIT_INTERRUPTED
        print(
            "\napex-dask-submit: interrupted, saving what we have...", file=sys.stderr, flush=True
        )
    finally:
        reporter.close(code)
        weights = None
        if driver is not None:
            try:
                final = driver.halt()  # finish calls in flight: every hop's counters agree
                if final:
                    merged = merge_final(results[-1] if results else {}, final)
                    if results:
                        results[-1] = merged
                    if out is not None:
                        (out / "final.json").write_text(json.dumps(merged, indent=1, default=float))
            except Exception as exc:
                print(f"apex-dask-submit: could not halt cleanly: {exc}", file=sys.stderr)
            try:
                weights = driver.learner_weights()
            except Exception as exc:  # the learner may be gone; keep what is saved
                print(f"apex-dask-submit: could not fetch final weights: {exc}", file=sys.stderr)
            if out is not None:
                save_outputs(out, cfg, weights)
            try:
                driver.stop()
            except Exception as exc:
                print(f"apex-dask-submit: error while releasing actors: {exc}", file=sys.stderr)
        if jsonl is not None:
            jsonl.close()
        _quiet_teardown_logs()
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.close()
    print(format_summary(results, reason), flush=True)
    if out is not None:
        names = ("results.jsonl", "final.json", "config.yaml", "weights.npz", "placement.json")
        wrote = [n for n in names + reporter.outputs if (out / n).exists()]
        print(f"apex-dask-submit: wrote {', '.join(wrote)} to {out}", flush=True)
    return code


def _quiet_teardown_logs() -> None:
    """Closing a cluster whose actors hold threads makes Dask log kill warnings; they are expected."""
    import logging

    for name in (
        "distributed.nanny",
        "distributed.worker",
        "distributed.core",
        "distributed.client",
    ):
        logging.getLogger(name).setLevel(logging.ERROR)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except (UsageError, ConfigError) as exc:
        print(f"apex-dask-submit: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("apex-dask-submit: interrupted before training started", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:
        known = {"UnknownEnvError", "ApexRuntimeError", "JobqueueError", "TrackingError"}
        if type(exc).__name__ in known and not args.debug:
            print(f"apex-dask-submit: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        if args.debug:
            raise
        first = str(exc).splitlines()[0] if str(exc) else ""
        print(
            f"apex-dask-submit: failed: {type(exc).__name__}: {first} (rerun with --debug "
            "for the traceback)",
            file=sys.stderr,
        )
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
