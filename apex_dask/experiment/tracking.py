"""Result sinks: result dicts to TensorBoard event files and to Weights & Biases.

::

    tb = TensorBoardSink("runs/cartpole/tensorboard")   # appends to the folder's log
    wb = WandbSink("my-project", cfg.to_dict(), name=run_id, dir="runs/cartpole")
    for result in driver.iterate():
        tb.write(result)          # one scalar per metric: tag = metric name,
        wb.write(result)          #   step = result["timesteps_total"]
    tb.close(), wb.close()

Both take the flat result dicts of ``docs/metrics.md`` unchanged, so a
metric has the same name in ``results.jsonl``, the dashboard, Prometheus,
TensorBoard and W&B. Only finite numbers are written: a NaN (no episode
finished in the window, no evaluation yet) is a gap in the chart, not a point.

Both packages are optional (extras ``tensorboard`` and ``wandb``) and
imported only when a sink is made; a missing one raises
:class:`TrackingError`, one line naming the extra to install.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = [
    "TensorBoardSink",
    "TrackingError",
    "WandbSink",
    "require_tensorboard",
    "scalar_metrics",
    "tensorboard_available",
    "wandb_available",
]

STEP_KEY = "timesteps_total"


class TrackingError(RuntimeError):
    """A sink cannot be made (package missing, bad folder): one line for the user."""


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ValueError:  # sys.modules[name] is None: imports of it are blocked
        return False


def tensorboard_available() -> bool:
    """True when the ``tensorboard`` package (the writer's backend) can be imported."""
    return _importable("tensorboard")


def require_tensorboard() -> None:
    """:class:`TrackingError` (one line naming the extra) unless tensorboard is importable."""
    if not tensorboard_available():
        raise TrackingError(
            "TensorBoard logging needs the tensorboard package: "
            "pip install 'apex_dask[tensorboard]'"
        )


def wandb_available() -> bool:
    """True when the ``wandb`` package can be imported."""
    return _importable("wandb")


def scalar_metrics(result: Mapping[str, Any]) -> dict[str, float]:
    """The finite numeric entries of ``result`` (booleans and NaN/inf left out)."""
    out = {}
    for key, value in result.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if math.isfinite(value):
            out[key] = float(value)
    return out


def result_step(result: Mapping[str, Any]) -> int:
    """The x-axis of every sink: ``timesteps_total`` (``iteration`` if it is missing)."""
    return int(result.get(STEP_KEY, result.get("iteration", 0)))


class TensorBoardSink:
    """TensorBoard event files in ``log_dir``, written by torch's ``SummaryWriter``.

    Each :meth:`write` adds one scalar per metric of the result dict (tag =
    metric name, step = ``timesteps_total``, wall time = now). A new sink on
    a folder that already has event files appends a new file next to them,
    and TensorBoard shows the files as one run. ``purge_step`` is for a run
    resumed from a checkpoint taken at that step: events at or after it from
    the earlier attempt are hidden, so the curve continues from the
    checkpoint without a fold.
    """

    def __init__(self, log_dir: str | os.PathLike[str], *, purge_step: int | None = None) -> None:
        require_tensorboard()
        from torch.utils.tensorboard import SummaryWriter  # extra: tensorboard

        self.log_dir = os.fspath(log_dir)
        try:
            self._writer = SummaryWriter(self.log_dir, purge_step=purge_step, flush_secs=10)
        except OSError as exc:
            raise TrackingError(
                f"cannot write TensorBoard logs to {self.log_dir!r} ({exc.strerror or exc})"
            ) from None
        self._closed = False
        self.error: OSError | None = None

    def write(self, result: Mapping[str, Any]) -> None:
        """Add one scalar per finite metric of ``result`` and flush."""
        if self._closed:
            return
        step = result_step(result)
        with self._guard():
            for key, value in scalar_metrics(result).items():
                self._writer.add_scalar(key, value, global_step=step)
            self._writer.flush()

    def write_text(self, tag: str, text: str, step: int = 0) -> None:
        """A text entry (shown in TensorBoard's Text tab), e.g. the run's config as YAML."""
        if not self._closed:
            indented = "\n".join("    " + line for line in text.splitlines())  # markdown code
            with self._guard():
                self._writer.add_text(tag, indented, global_step=step)

    def flush(self) -> None:
        if not self._closed:
            with self._guard():
                self._writer.flush()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                self._writer.close()
            except OSError:
                pass

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        """A failed write (a full disk) stops this sink with one warning; the run goes on:
        TensorBoard files are a copy of ``results.jsonl``, never the only record."""
        try:
            yield
        except OSError as exc:
            self.error = exc
            self.close()
            warnings.warn(
                f"TensorBoard logging to {self.log_dir} stopped: {exc.strerror or exc}",
                RuntimeWarning,
                stacklevel=3,
            )


class WandbSink:
    """Every result dict logged to a Weights & Biases run in ``project``.

    ``config`` (the ``ApexConfig`` as a nested dict) becomes the run config.
    ``timesteps_total`` is declared the x-axis of every other metric, so W&B
    charts line up with TensorBoard's. With ``WANDB_MODE=offline`` the run
    is kept under ``dir/wandb/`` for a later ``wandb sync``.
    """

    def __init__(
        self,
        project: str,
        config: Mapping[str, Any],
        *,
        name: str | None = None,
        dir: str | os.PathLike[str] | None = None,
    ) -> None:
        if not wandb_available():
            raise TrackingError("--wandb needs the wandb package: pip install 'apex_dask[wandb]'")
        import wandb  # extra: wandb

        if dir is not None:
            os.makedirs(dir, exist_ok=True)
        self._run = wandb.init(
            project=project,
            config=dict(config),
            name=name,
            dir=None if dir is None else os.fspath(dir),
        )
        self._run.define_metric(STEP_KEY)
        self._run.define_metric("*", step_metric=STEP_KEY)
        self._closed = False

    @property
    def run_dir(self) -> str:
        """The local folder of the W&B run."""
        return os.path.dirname(self._run.dir)

    def set_name(self, name: str) -> None:
        """Rename the run (e.g. to the driver's run id, known once the actors exist)."""
        self._run.name = name

    def write(self, result: Mapping[str, Any]) -> None:
        if not self._closed:
            self._run.log(scalar_metrics(result))

    def close(self, exit_code: int = 0) -> None:
        if not self._closed:
            self._closed = True
            self._run.finish(exit_code=exit_code)
