"""The cluster flags every apex_dask command shares, and the cluster they open.

::

    add_cluster_flags(parser)                 # --scheduler, --scheduler-file, --connect-timeout,
                                              # --no-tls
    add_cluster_flags(parser, jobqueue=True)  # + --cluster slurm|pbs, --jobs, --jobqueue-*,
                                              # --dashboard-address
    check_cluster_flags(args)                 # (:mod:`.checks`) before anything starts
    client, cluster = open_cluster(args, cfg, prefix="apex-dask-eval:")
    ...
    close_cluster(client, cluster)            # the cluster only if it was ours (not None)

With none of the cluster flags an embedded ``LocalCluster`` is started, in a
helper thread so that the main thread stays free for signals; its workers
ignore the terminal's Ctrl-C (the command decides how it ends). It listens on
127.0.0.1 and requires TLS with credentials made for it alone, so no other
user of the machine gets in; ``--no-tls`` gives plain TCP (for this cluster
or the jobqueue one) with a one-line warning. ``cluster`` is None for a
scheduler that was already running: it is not this command's to close.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from apex_dask.config import ApexConfig

__all__ = ["add_cluster_flags", "close_cluster", "is_embedded", "open_cluster", "tunnel_hint"]


def add_cluster_flags(parser: argparse.ArgumentParser, *, jobqueue: bool = False) -> None:
    """Add the cluster group: a running scheduler by address or file (and, with
    ``jobqueue``, workers as batch jobs); default an embedded LocalCluster."""
    c = parser.add_argument_group("cluster (pick at most one; default: embedded LocalCluster)")
    c.add_argument("--scheduler", metavar="ADDRESS", help="address of a running `dask scheduler`")
    c.add_argument(
        "--scheduler-file", metavar="PATH", help="scheduler file written by `dask scheduler`"
    )
    if jobqueue:
        c.add_argument(
            "--cluster",
            choices=["slurm", "pbs"],
            help="start workers as batch jobs via dask-jobqueue",
        )
        c.add_argument(
            "--jobs",
            type=int,
            default=2,
            help="with --cluster: number of CPU worker jobs (default 2)",
        )
        c.add_argument(
            "--jobqueue-opt",
            metavar="KEY=VALUE",
            action="append",
            default=[],
            help="with --cluster: option for the jobqueue cluster, e.g. queue=gpu (repeatable)",
        )
        c.add_argument(
            "--adapt",
            metavar="MIN:MAX",
            help="with --cluster: let dask-jobqueue's adapt keep MIN to MAX env-worker jobs "
            "(beside the learner job) as the load asks; implies --elastic (with "
            "--jobqueue-opt lifetime=50m, worker jobs retire and are replaced)",
        )
        c.add_argument(
            "--jobqueue-wait",
            type=float,
            default=None,
            metavar="S",
            help="with --cluster: give up if the jobs' workers have not all joined after S "
            "seconds (default: wait for the queue)",
        )
    c.add_argument(
        "--no-tls",
        action="store_true",
        help="the cluster this command starts (embedded or --cluster) uses plain TCP: any user "
        "who can reach it can run code as you (default: TLS with credentials made for the run)",
    )
    if jobqueue:
        c.add_argument(
            "--dashboard-address",
            metavar="HOST:PORT",
            help="where the dashboard of the cluster this command starts listens (default "
            "127.0.0.1:8787, this machine only; reach it through an SSH tunnel)",
        )
    c.add_argument(
        "--connect-timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds to wait for the scheduler (default 10)",
    )


def is_embedded(args: argparse.Namespace) -> bool:
    """No cluster flag: the command starts (and owns) a LocalCluster."""
    return not (args.scheduler or args.scheduler_file or getattr(args, "cluster", None))


def open_cluster(
    args: argparse.Namespace,
    cfg: ApexConfig,
    *,
    prefix: str,
    local_workers: int | None = None,
    local_kwargs: dict[str, Any] | None = None,
    tls_dir: Path | None = None,
) -> tuple[Any, Any]:
    """``(client, cluster)`` for the flags; ``cluster`` is ours to close (embedded,
    jobqueue) or None. ``local_workers`` sizes an embedded cluster (default the
    config's ``topology.local_workers``, else one per core); ``local_kwargs`` go to
    its ``LocalCluster`` (e.g. ``dashboard_address=None``); ``tls_dir`` is where jobqueue
    runs keep their per-run TLS credentials unless the options name a folder."""
    from apex_dask.runtime.orchestration.cluster import connect

    if getattr(args, "cluster", None):
        from distributed import Client

        from apex_dask.cli.jobqueue import (
            make_jobqueue_cluster,
            parse_jobqueue_opts,
            wait_for_jobqueue_workers,
        )

        opts = parse_jobqueue_opts(args.jobqueue_opt)
        if tls_dir is not None:
            opts.setdefault("tls_dir", str(tls_dir))
        if getattr(args, "no_tls", False):
            opts.setdefault("tls", "off")
        if getattr(args, "dashboard_address", None):
            opts.setdefault("dashboard_address", args.dashboard_address)

        def say(line: str) -> None:
            print(f"{prefix} {line}", flush=True)

        cluster = make_jobqueue_cluster(args.cluster, args.jobs, cfg, say=say, **opts)
        try:
            say(
                f"Dask scheduler at {cluster.scheduler_address}, dashboard {cluster.dashboard_link}"
            )
            wait = "no limit" if args.jobqueue_wait is None else f"{args.jobqueue_wait:g} s"
            say(f"submitted {args.cluster} jobs; waiting for their workers ({wait})")
            wait_for_jobqueue_workers(cluster, args.jobqueue_wait, progress=say)
            client = Client(cluster, direct_to_workers=True)
            if getattr(args, "adapt", None):  # + the learner job, which adapt also counts
                from apex_dask.cli.checks import parse_adapt

                lo, hi = parse_adapt(args.adapt)
                cluster.adapt(minimum_jobs=lo + 1, maximum_jobs=hi + 1)
                print(f"{prefix} adapt: {lo} to {hi} env-worker jobs")
        except BaseException:
            close_cluster(None, cluster)
            raise
        return client, cluster
    if args.scheduler or args.scheduler_file:
        client = connect(
            address=args.scheduler,
            scheduler_file=args.scheduler_file,
            timeout=args.connect_timeout,
        )
        return client, None

    def warn(line: str) -> None:
        print(f"{prefix} WARNING: {line}", file=sys.stderr, flush=True)

    kwargs = {"tls": not getattr(args, "no_tls", False), "warn": warn, **(local_kwargs or {})}
    if getattr(args, "dashboard_address", None):
        kwargs.setdefault("dashboard_address", args.dashboard_address)
    return _start_embedded(local_workers or cfg.topology.local_workers, **kwargs)


def _start_embedded(n_workers: int | None, **kwargs: Any) -> tuple[Any, Any]:
    """The embedded LocalCluster, started in a helper thread (the main thread stays free
    for signals); its workers ignore the terminal's Ctrl-C."""
    from apex_dask.runtime.orchestration.cluster import (
        shield_workers_from_ctrl_c,
        start_local_cluster,
    )

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    shield_workers_from_ctrl_c()
    box: dict[str, Any] = {}

    def start() -> None:
        try:
            box["cluster"], box["client"] = start_local_cluster(n_workers, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            box["error"] = exc

    thread = threading.Thread(target=start, name="apex-start-cluster", daemon=True)
    thread.start()
    try:
        while thread.is_alive():
            thread.join(0.1)
    except BaseException:
        thread.join(60.0)  # a start-up still going then is left to the process's end
        if "client" in box:
            close_cluster(box["client"], box["cluster"], timeout_s=20.0)
        raise
    if "error" in box:
        raise box["error"]
    return box["client"], box["cluster"]


def close_cluster(client: Any, cluster: Any, timeout_s: float | None = None) -> None:
    """Close the client, then the cluster if it is ours (a jobqueue cluster's jobs are
    cancelled whatever happens while closing); errors while closing are ignored.
    ``timeout_s``: all of it within that many seconds (default: 10 s for the client,
    30 s for the cluster)."""
    end = time.monotonic() + (40.0 if timeout_s is None else timeout_s)
    if client is not None:
        try:
            client.close(timeout=10 if timeout_s is None else max(0.5, 0.3 * timeout_s))
        except Exception:
            pass
    if cluster is not None:
        try:
            cluster.close(timeout=30 if timeout_s is None else max(0.5, end - time.monotonic()))
        except Exception:
            pass
        finally:
            jobs = getattr(cluster, "apex_jobs", None)  # a jobqueue cluster's batch jobs
            if jobs is not None:
                jobs.cancel()


def tunnel_hint(link: str | None, cluster: Any, embedded: bool) -> str | None:
    """How to open the dashboard of a cluster this command started (``cluster`` not None),
    listening on this machine's loopback, from elsewhere (an SSH tunnel), when that is the
    way in: a jobqueue run's login node, or an embedded run in a session over SSH."""
    from urllib.parse import urlsplit

    url = urlsplit(link or "")
    if cluster is None or url.hostname not in ("127.0.0.1", "localhost", "::1") or not url.port:
        return None
    if embedded and not os.environ.get("SSH_CONNECTION"):
        return None
    import socket

    return (
        f"dashboard from another machine: ssh -N -L {url.port}:127.0.0.1:{url.port} "
        f"{socket.gethostname()}, then open http://localhost:{url.port}{url.path}"
    )
