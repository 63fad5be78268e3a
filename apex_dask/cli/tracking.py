"""Where ``apex-dask-submit`` sends each result besides ``results.jsonl``.

::

    add_tracking_flags(parser_group)                  # --no-tensorboard, --wandb PROJECT
    reporter = RunReporter(args, cfg, out)            # checks the flags; opens W&B
    driver = ApexDriver(cfg, client, tensorboard_dir=reporter.tensorboard_dir)
    reporter.start(driver.run_id)
    for result in driver.iterate():
        reporter.update(result)                       # progress line, W&B
    reporter.close()

TensorBoard event files are written by the driver itself (its
``tensorboard_dir`` argument, the same one a notebook uses) under
``--out DIR/tensorboard/``, when the ``tensorboard`` package is importable
and ``--no-tensorboard`` is not given. ``--wandb PROJECT`` logs every result
and the config to Weights & Biases; without the ``wandb`` package it is a
one-line error before anything starts.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from apex_dask.cli.progress import ProgressPrinter
from apex_dask.config import ApexConfig
from apex_dask.experiment.tracking import (
    TrackingError,
    WandbSink,
    tensorboard_available,
    wandb_available,
)

__all__ = ["RunReporter", "TrackingError", "add_tracking_flags"]

TENSORBOARD_SUBDIR = "tensorboard"


def add_tracking_flags(group: Any) -> None:
    """Add ``--no-tensorboard`` and ``--wandb`` to an argparse group."""
    group.add_argument(
        "--no-tensorboard",
        action="store_true",
        help="with --out: do not write TensorBoard event files to DIR/tensorboard/ "
        "(written by default when the tensorboard package is installed)",
    )
    group.add_argument(
        "--wandb",
        metavar="PROJECT",
        help="also log every result, and the config, to this Weights & Biases project "
        "(pip install 'apex_dask[wandb]'; WANDB_MODE=offline keeps it local)",
    )


class RunReporter:
    """The progress line and the optional W&B run of one ``apex-dask-submit`` run."""

    def __init__(self, args: argparse.Namespace, cfg: ApexConfig, out: Path | None) -> None:
        from apex_dask.experiment.stop import StopRule

        if args.wandb is not None and not args.wandb.strip():
            raise TrackingError("--wandb needs a project name, e.g. --wandb apex-cartpole")
        if args.wandb and not wandb_available():
            raise TrackingError("--wandb needs the wandb package: pip install 'apex_dask[wandb]'")
        self.tensorboard_dir: Path | None = None
        if out is not None and not args.no_tensorboard:
            if tensorboard_available():
                self.tensorboard_dir = out / TENSORBOARD_SUBDIR
            elif not args.quiet:
                print(
                    "apex-dask-submit: no TensorBoard logs (pip install 'apex_dask[tensorboard]' "
                    "to get them, --no-tensorboard to hide this line)",
                    flush=True,
                )
        stop = StopRule(cfg.stop, use_eval=cfg.eval.episodes > 0).stop
        self.progress = ProgressPrinter(stop, quiet=args.quiet)
        self.wandb: WandbSink | None = None
        if args.wandb:
            self.wandb = WandbSink(args.wandb, cfg.to_dict(), dir=out)

    @property
    def outputs(self) -> tuple[str, ...]:
        """Names under ``--out`` this reporter may have written."""
        return (TENSORBOARD_SUBDIR, "wandb")

    def start(self, run_id: str) -> None:
        """Name the W&B run after the driver's run id (the one on the dashboard)."""
        if self.wandb is not None:
            self.wandb.set_name(run_id)

    def update(self, result: dict[str, Any]) -> None:
        self.progress.update(result)
        if self.wandb is not None:
            self.wandb.write(result)

    def close(self, exit_code: int = 0) -> None:
        """End the progress line; finish the W&B run (failed when an error is unwinding)."""
        self.progress.close()
        if exit_code == 0 and sys.exc_info()[0] is not None:  # called from a `finally`
            exit_code = 1
        if self.wandb is not None:
            try:
                self.wandb.close(exit_code)
            except Exception as exc:  # never lose the run's own outputs to the tracker
                print(f"apex-dask-submit: could not finish the W&B run: {exc}", file=sys.stderr)
