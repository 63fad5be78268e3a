"""``apex-dask-submit``: train Ape-X on a Dask cluster from the command line.

Examples::

    apex-dask-submit --preset cartpole --stop-eval-return 475           # embedded LocalCluster
    apex-dask-submit --scheduler tcp://10.0.0.5:8786 --preset cartpole
    apex-dask-submit --scheduler-file ~/sched.json --config run.yaml --set dqn.lr=1e-3
    apex-dask-submit --cluster slurm --jobs 4 --preset atari

Bad input (config, flags, env ids and spaces, devices, replay memory,
scheduler addresses, output folders) prints one line on stderr and exits
with status 2 before anything starts (:mod:`.checks`, :mod:`.outdir`; on a
remote cluster the learner worker's device and memory, :mod:`.remote`); the
run itself is :mod:`.session`; every exit code is in :mod:`.exitcodes`.
"""

from __future__ import annotations

import argparse
import sys
import warnings

from apex_dask.cli.checks import (
    EnvSpaces,
    UsageError,
    check_cluster_flags,
    check_device,
    probe_env,
)
from apex_dask.cli.clusterflags import add_cluster_flags, is_embedded
from apex_dask.cli.exitcodes import (
    EXIT_FAULT,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PREEMPTED,
    EXIT_TERMINATED,
    EXIT_USAGE,
    HELP,
    classify,
)
from apex_dask.cli.outdir import check_out, discard_unstarted, make_out, remove_if_empty
from apex_dask.cli.resolve import DEFAULT_PRESET, resolve_config
from apex_dask.cli.resume import ResumePoint
from apex_dask.cli.rllib import add_rllib_flags, check_rllib_flags
from apex_dask.cli.signals import exit_now_if_signalled
from apex_dask.cli.tracking import RunReporter, add_tracking_flags
from apex_dask.config import PRESETS, ApexConfig

__all__ = [
    "EXIT_FAULT",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_PREEMPTED",
    "EXIT_TERMINATED",
    "EXIT_USAGE",
    "UsageError",
    "build_parser",
    "main",
    "run",
]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="apex-dask-submit",
        description="Train Ape-X (distributed prioritized replay DQN) on a Dask cluster. "
        "With no --scheduler/--scheduler-file/--cluster, an embedded LocalCluster is started.",
        epilog="Config keys: apex-dask-submit --list-keys. Metrics: docs/metrics.md. " + HELP,
    )
    g = p.add_argument_group("configuration")
    g.add_argument(
        "--preset",
        default=None,
        help=f"start from a preset: {', '.join(sorted(PRESETS))} "
        f"(default: {DEFAULT_PRESET}, unless the --config file names one)",
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
    add_rllib_flags(g)
    g.add_argument(
        "--print-config",
        action="store_true",
        help="print the resolved config as YAML (which --config runs as it is) and exit; "
        "with --from-rllib the table of RLlib keys heads it as comments, and Tune samplers "
        "give an apex-dask-sweep file",
    )
    g.add_argument(
        "--elastic",
        action="store_true",
        help="follow the cluster as Dask workers join and retire (topology.elastic; "
        "workers.per_process env workers per worker, workers.num_workers at most)",
    )
    add_cluster_flags(p, jobqueue=True)
    s = p.add_argument_group("stopping (first met wins)")
    s.add_argument("--stop-timesteps", type=int, metavar="N", help="env steps sampled")
    s.add_argument(
        "--stop-train-return",
        type=float,
        metavar="R",
        help="training episodes' mean return (env/episode_return_mean, the least-exploring "
        "third of the env workers)",
    )
    s.add_argument(
        "--stop-eval-return",
        type=float,
        metavar="R",
        help="greedy evaluation's mean return (eval/return_mean; needs eval.episodes > 0)",
    )
    s.add_argument(
        "--stop-reward",
        type=float,
        metavar="R",
        help="deprecated: --stop-eval-return with evaluation on, else --stop-train-return",
    )
    s.add_argument("--stop-time", type=float, metavar="S", help="wall-clock seconds")
    s.add_argument("--stop-iterations", type=int, metavar="N", help="result dicts")
    o = p.add_argument_group("output")
    o.add_argument(
        "--out",
        metavar="DIR",
        help="write results.jsonl, final.json, config.yaml, weights.npz, placement.json and "
        "the log here; DIR must be new or empty (a run never writes over another's files)",
    )
    o.add_argument(
        "--resume",
        metavar="DIR",
        help="continue the run that wrote DIR from its newest checkpoint that verifies (its "
        "config; --stop-* and --set stop.*/topology.*/checkpoint.* may change); rows of "
        "results.jsonl past it move to results.rewound-N.jsonl",
    )
    o.add_argument("--quiet", action="store_true", help="no per-iteration progress lines")
    o.add_argument(
        "--debug",
        action="store_true",
        help="show full tracebacks and Dask's log on the console (else they go to DIR's log)",
    )
    add_tracking_flags(o)
    return p


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------


def check_local_memory(cfg: ApexConfig, spaces: EnvSpaces) -> None:
    """What each worker of the embedded LocalCluster will hold against what it may use
    (Dask's ``auto`` limit), placed as the driver will place it (:mod:`.memory`)."""
    import os

    from apex_dask.cli.memory import check_memory, plan_holdings
    from apex_dask.runtime.orchestration.placement import WorkerInfo, plan_placement

    n = int(cfg.topology.local_workers or os.cpu_count() or 1)
    workers = [WorkerInfo(f"local worker {i}", str(i), "localhost") for i in range(n)]
    placement = plan_placement(
        workers,
        num_shards=cfg.replay.num_shards,
        num_env_workers=cfg.workers.num_workers,
        replay_placement=cfg.replay.placement,
    )
    names = {w.address: f"{w.address} of the embedded cluster" for w in workers}
    names[placement.learner.address] = f"the learner's {names[placement.learner.address]}"

    def check(held: dict) -> None:
        if max(sum(p.nbytes for p in parts) for parts in held.values()) <= 2**28:
            return  # fits any machine: no need to import Dask to ask
        from distributed.system import MEMORY_LIMIT

        check_memory(cfg, spaces, held, {w.address: MEMORY_LIMIT / n for w in workers}, names)

    # the replay and the batches alone first: what they refuse needs no torch (the
    # networks' sizes are counted on the networks, built on torch's meta device)
    check(plan_holdings(cfg, spaces, placement, networks=False))
    check(plan_holdings(cfg, spaces, placement))


def _from_rllib(args: argparse.Namespace) -> ApexConfig | None:
    """The config of ``--from-rllib FILE`` (the table printed); None when ``--print-config``
    printed it already (or the sweep file for Tune samplers)."""
    from apex_dask.cli.resolve import cli_overrides
    from apex_dask.cli.rllib import conversion, print_conversion, sampler_refusal

    conv = conversion(args, "apex-dask-submit")
    cfg = conv.config()
    overrides = cli_overrides(args)
    if overrides:
        cfg = cfg.override(overrides)
    if args.print_config:
        print_conversion(conv, cfg, yaml_out=True)
        return None
    if conv.space:
        raise sampler_refusal(conv, args)
    print_conversion(conv, cfg, yaml_out=False)
    return cfg


def run(args: argparse.Namespace) -> int:
    """Check everything, then run; the exit code (:mod:`apex_dask.cli.exitcodes`)."""
    if args.list_keys:
        for key, doc in ApexConfig.field_docs().items():
            print(f"{key:<36} {doc}")
        return EXIT_OK
    # 1. input: nothing is created or started until all of it is checked
    check_cluster_flags(args)
    check_rllib_flags(args, exclusive=("config", "preset", "resume"))
    resume = args.resume
    resuming: ResumePoint | None = None
    with warnings.catch_warnings(record=True) as retired:  # a retired key: one line each
        warnings.simplefilter("always", FutureWarning)
        if resume is not None:
            from apex_dask.cli.resume import resolve_resume

            cfg, resuming = resolve_resume(args)
        elif args.from_rllib:
            cfg = _from_rllib(args)
            if cfg is None:
                return EXIT_OK
        else:
            cfg = resolve_config(args)
    for line in dict.fromkeys(str(w.message) for w in retired):
        print(f"apex-dask-submit: note: {line}", flush=True)
    if args.print_config:
        sys.stdout.write(cfg.to_yaml())
        return EXIT_OK
    out = check_out(resume or args.out, resume=resume is not None)
    spaces = probe_env(cfg)
    embedded = is_embedded(args)
    if embedded:  # remote clusters: checked against their workers once connected
        check_device(cfg)
        check_local_memory(cfg, spaces)
    # 2. the run
    from apex_dask.cli.session import RunSession

    created = make_out(out)
    try:
        reporter = RunReporter(args, cfg, out)  # progress line, W&B; checks --wandb
    except BaseException:
        if created:
            remove_if_empty(out)
        raise
    session = RunSession(args, cfg, out, reporter, spaces, resume=resuming)
    code = session.run()
    if code == EXIT_USAGE and not session.started and resume is None:
        discard_unstarted(out, created)  # e.g. no CUDA on the learner's worker: free the folder
    return code


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code = run(args)
    except BaseException as exc:  # noqa: BLE001 - input errors and Ctrl-C before the run
        if isinstance(exc, SystemExit):
            raise
        if args.debug:
            raise
        code, line = classify(exc, started=False, log_hint="rerun with --debug for the traceback")
        print(f"apex-dask-submit: {line}", file=sys.stderr)
    exit_now_if_signalled(code)  # a stopped run: no shutdown window for a second Ctrl-C
    return code


if __name__ == "__main__":
    sys.exit(main())
