"""``apex-dask-eval``: watch, measure and ship a trained agent.

Examples::

    apex-dask-eval runs/cartpole                              # 10 greedy episodes, embedded cluster
    apex-dask-eval runs/cartpole --episodes 100 --seed 7 --epsilon 0.05
    apex-dask-eval runs/breakout --checkpoint                 # the newest checkpoint
    apex-dask-eval runs/breakout --checkpoint ckpt-000012 --scheduler-file ~/sched.json
    apex-dask-eval runs/cartpole --video videos/ --video-episodes 2
    apex-dask-eval runs/cartpole --export cartpole.pt --episodes 0   # export only
    apex-dask-eval runs/cartpole --best                       # the best evaluation's weights
    apex-dask-eval runs/cartpole --best --export best.pt --episodes 0
    apex-dask-eval runs/pendulum --export pendulum.pt                # a dpg run: its actor
    apex-dask-eval runs/breakout --export breakout.onnx --episodes 0  # ONNX (onnxruntime)
    apex-dask-eval runs/breakout --export breakout.pt2 --episodes 0   # torch.export
    apex-dask-eval --policy breakout.onnx --episodes 10 --seed 7      # play an exported file

It reads ``RUN_DIR/config.yaml`` and ``RUN_DIR/weights.npz`` (or
``weights-best.npz``, the weights of the run's best greedy evaluation, or a
checkpoint), checks them (the env can be made here, the weights fit the
config's network), plays the episodes over the cluster's workers
(:mod:`apex_dask.runtime.orchestration.episodes`), prints a table and writes
``RUN_DIR/eval-<time>.json``. With ``--policy FILE`` it plays an exported
policy (``.onnx``, ``.pt2`` or ``.pt``) in that format's runtime instead, on the
env its JSON names (:mod:`apex_dask.algo.play.exported`), and writes the report
beside FILE. Bad input is one line on stderr and exit 2; a
failed episode exit 3; Ctrl-C exit 130, SIGTERM 143 (the cluster it started is
closed on every way out).
"""

from __future__ import annotations

import argparse
import logging
import secrets
import sys
import time
from pathlib import Path
from typing import Any

from apex_dask.cli.checks import UsageError, check_cluster_flags, probe_env
from apex_dask.cli.clusterflags import add_cluster_flags, close_cluster
from apex_dask.cli.exitcodes import (
    EXIT_FAULT,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TERMINATED,
    classify,
)
from apex_dask.cli.policyfiles import PolicySource, export
from apex_dask.cli.runfolder import TrainedRun, check_fits, load_run
from apex_dask.cli.watch import quiet_teardown_logs, route_logs

__all__ = ["build_parser", "main", "run"]

PREFIX = "apex-dask-eval:"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="apex-dask-eval",
        description="Play a trained Ape-X agent's episodes on a Dask cluster, record videos, "
        "export the greedy policy. With no --scheduler/--scheduler-file, an embedded "
        "LocalCluster is started.",
        epilog="exit status: 0 done; 2 bad input (nothing played); 3 an episode failed; "
        "130 interrupted (Ctrl-C); 143 terminated (SIGTERM). The cluster it started is "
        "closed on every way out.",
    )
    p.add_argument(
        "run_dir",
        metavar="RUN_DIR",
        nargs="?",
        help="the --out folder of an apex-dask-submit run (or give --policy FILE)",
    )
    p.add_argument(
        "--policy",
        metavar="FILE",
        help="play an exported policy instead of a run: FILE.onnx (onnxruntime), FILE.pt2 "
        "(torch.export) or FILE.pt (TorchScript), with FILE.json beside it naming the env",
    )
    w = p.add_argument_group("weights")
    w.add_argument(
        "--checkpoint",
        nargs="?",
        const="latest",
        metavar="NAME",
        help="play a checkpoint's weights instead of weights.npz: the newest, or NAME "
        "(e.g. ckpt-000007, or a path)",
    )
    w.add_argument(
        "--best",
        action="store_true",
        help="play weights-best.npz instead of weights.npz: the weights of the run's best "
        "greedy evaluation (written whenever the evaluation mean improved)",
    )
    e = p.add_argument_group("episodes")
    e.add_argument("--episodes", type=int, default=10, metavar="N", help="episodes (default 10)")
    e.add_argument(
        "--epsilon",
        type=float,
        default=0.0,
        metavar="E",
        help="random action with probability E (default 0: greedy; a dpg run: uniform "
        "within the action bounds)",
    )
    e.add_argument(
        "--seed",
        type=int,
        default=None,
        help="episode i resets with SEED+i; the same seed gives the same episodes on any "
        "number of workers (default: drawn, and written to the JSON)",
    )
    e.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="worker processes of the embedded LocalCluster (default: the config's "
        "topology.local_workers, else one per core)",
    )
    o = p.add_argument_group("output")
    o.add_argument("--video", metavar="DIR", help="record episodes to MP4 files in DIR")
    o.add_argument(
        "--video-episodes",
        type=int,
        default=1,
        metavar="K",
        help="with --video: how many (default 1)",
    )
    o.add_argument(
        "--export",
        metavar="FILE",
        help="write the greedy policy to FILE (and FILE.json, saying how to call it), in the "
        "format of its suffix: .onnx (ONNX: onnxruntime, no torch), .pt2 (torch.export.load), "
        ".pt (TorchScript: torch.jit.load, libtorch)",
    )
    o.add_argument(
        "--format",
        choices=["onnx", "pt2", "torchscript"],
        default=None,
        help="with --export: the format, whatever FILE's suffix",
    )
    o.add_argument("--debug", action="store_true", help="show full tracebacks")
    add_cluster_flags(p)
    return p


def check_args(args: argparse.Namespace) -> None:
    """The flags, before anything is read or started (one-line :class:`UsageError`)."""
    import math

    check_cluster_flags(args)
    if (args.run_dir is None) == (args.policy is None):
        raise UsageError(
            "give a run folder (apex-dask-eval RUN_DIR) or an exported policy (--policy FILE), "
            "one of them"
        )
    if args.policy is not None:
        for flag, given in (
            ("--export", args.export),
            ("--checkpoint", args.checkpoint),
            ("--best", args.best),
        ):
            if given:
                raise UsageError(f"{flag} reads a run folder; --policy plays an exported file")
    if args.format is not None and not args.export:
        raise UsageError("--format goes with --export FILE")
    if getattr(args, "best", False) and args.checkpoint is not None:
        raise UsageError("--best and --checkpoint each choose the weights: give one of them")
    if args.episodes < 0 or (args.episodes == 0 and not args.export):
        raise UsageError(f"--episodes {args.episodes} must be >= 1 (0 only with --export)")
    if not (math.isfinite(args.epsilon) and 0.0 <= args.epsilon <= 1.0):
        raise UsageError(f"--epsilon {args.epsilon} must be in [0, 1]")
    if args.workers is not None and (args.workers < 1 or args.scheduler or args.scheduler_file):
        raise UsageError(
            f"--workers {args.workers} sizes the embedded cluster: give N >= 1, "
            "without --scheduler/--scheduler-file"
        )
    if args.video is not None:
        if not 1 <= args.video_episodes <= max(1, args.episodes):
            raise UsageError(
                f"--video-episodes {args.video_episodes} must be in [1, --episodes {args.episodes}]"
            )
        video = Path(args.video).expanduser()
        if video.exists() and not video.is_dir():
            raise UsageError(f"--video {args.video!r} is a file; give a folder")
        from apex_dask.algo.play.video import video_problem

        problem = video_problem()
        if problem:
            raise UsageError(problem)
    if args.export is not None:
        target = Path(args.export).expanduser()
        if target.is_dir():
            raise UsageError(
                f"--export {args.export!r} is a folder; give a file name, e.g. policy.onnx"
            )
        from apex_dask.algo.play.export import ExportError, format_of

        try:
            format_of(target, args.format)
        except ExportError as exc:
            raise UsageError(f"--export: {exc}") from None


def run(args: argparse.Namespace) -> int:
    check_args(args)
    if args.policy is not None:
        return play_exported(args)
    trained = load_run(args.run_dir, args.checkpoint, best=args.best)
    if trained.best is not None:
        b = trained.best
        print(
            f"{PREFIX} {trained.source}: greedy eval {b.get('eval/return_mean', float('nan')):.1f} "
            f"at {int(b.get('timesteps_total', 0)):,} env steps "
            f"(weights version {trained.version}; seed {b.get('eval/seed')}, "
            f"{b.get('eval/episodes')} episodes)",
            flush=True,
        )
    cfg = trained.config
    spaces = probe_env(cfg)
    check_fits(trained, spaces)
    if args.export:
        export(trained, spaces, Path(args.export).expanduser(), args.format)
    if args.episodes == 0:
        return EXIT_OK
    from apex_dask.experiment.builder import agent_spec, env_factory

    return play(
        args,
        trained,
        cfg,
        env_factory(cfg),
        agent_spec(cfg),
        trained.weights,
        cfg.eval.max_episode_steps,
    )


def play_exported(args: argparse.Namespace) -> int:
    """``--policy FILE``: the exported file's episodes, on the env its JSON names."""
    from apex_dask.cli.policyfiles import open_policy
    from apex_dask.config import ApexConfig

    source, factory, exported = open_policy(args.policy)
    # no run config: the embedded cluster one worker per core, a jobqueue's defaults
    return play(args, source, ApexConfig(), factory, exported, {}, exported.max_episode_steps)


def play(
    args: argparse.Namespace,
    trained: TrainedRun | PolicySource,
    cfg: Any,
    factory: Any,
    agent: Any,
    weights: Any,
    max_steps: int | None,
) -> int:
    """Play ``args.episodes`` on the cluster, print the table, write the report."""
    seed = args.seed if args.seed is not None else secrets.randbelow(2**31)
    from apex_dask.cli.clusterflags import open_cluster

    render = None
    if args.video:
        from dataclasses import replace

        render = replace(factory, env_kwargs={**factory.env_kwargs, "render_mode": "rgb_array"})
    route_logs(None, debug=args.debug)  # Dask's own log records: not on the console
    client = cluster = None
    try:
        quiet = {} if args.debug else {"silence_logs": logging.ERROR}  # one line per way out
        client, cluster = open_cluster(
            args,
            cfg,
            prefix=PREFIX,
            local_workers=args.workers,
            local_kwargs={"dashboard_address": None, **quiet},
        )
        from apex_dask.runtime.orchestration.episodes import play_on_cluster

        played = play_on_cluster(
            client,
            factory,
            agent,
            weights,
            episodes=args.episodes,
            base_seed=seed,
            epsilon=args.epsilon,
            max_steps=max_steps,
            record=range(args.video_episodes) if args.video else (),
            render_factory=render,
            cancel_on_error=cluster is None,  # ours is closed at once
        )
    finally:
        quiet_teardown_logs()
        if cluster is not None and client is not None:
            try:  # its workers: closing one mid-episode is expected, not worth a log line
                client.run(quiet_teardown_logs, callback_timeout=10)
            except Exception:
                pass
        close_cluster(client, cluster)
    from apex_dask.cli.evalreport import format_table, summarize, write_report

    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    videos = _write_videos(played.rows, Path(args.video).expanduser(), stamp) if args.video else []
    summary = summarize(played.rows, played.wall_s)
    print(format_table(trained, summary, args, seed, played.workers), flush=True)
    path = write_report(trained, summary, played, args, seed, stamp, videos)
    for v in videos:
        print(f"{PREFIX} video {v}", flush=True)
    print(f"{PREFIX} wrote {path}", flush=True)
    return EXIT_OK


def _write_videos(rows: list[dict[str, Any]], folder: Path, stamp: str) -> list[str]:
    from apex_dask.cli.outdir import write_bytes

    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for row in rows:
        data = row.pop("video", None)
        if data is not None:
            path = folder / f"eval-{stamp}-episode-{row['index']}.mp4"
            write_bytes(path, data)
            row["video"] = str(path)
            out.append(str(path))
    return out


def _classify(exc: BaseException) -> tuple[int, str]:
    """``(exit code, line)``: bad input 2 (an unreachable scheduler, an env a worker cannot
    make included), a failed episode 3, Ctrl-C 130."""
    from apex_dask.runtime.orchestration.episodes import EpisodeFailed

    if isinstance(exc, KeyboardInterrupt):
        if getattr(exc, "signame", "SIGINT") == "SIGTERM":
            return EXIT_TERMINATED, "terminated (SIGTERM)"
        return EXIT_INTERRUPTED, "interrupted (Ctrl-C)"
    if isinstance(exc, EpisodeFailed):
        return EXIT_FAULT, f"error: {exc}"
    return classify(exc, started=False, log_hint="rerun with --debug for the traceback")


def _terminated(signum: int, frame: Any) -> None:
    exc = KeyboardInterrupt()
    exc.signame = "SIGTERM"  # type: ignore[attr-defined]
    raise exc


def main(argv: list[str] | None = None) -> int:
    import signal
    import threading

    args = build_parser().parse_args(argv)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminated)  # the cluster is closed on the way out
    try:
        code = run(args)
    except BaseException as exc:  # noqa: BLE001 - one line for every way it can end
        if isinstance(exc, SystemExit):
            raise
        if args.debug:
            raise
        code, line = _classify(exc)
        print(f"{PREFIX} {line}", file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
