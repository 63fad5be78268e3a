"""The weights of the best greedy evaluation so far, kept as ``weights-best.npz``.

CartPole runs stopped at a greedy 475 sometimes end with weights that score
200 a moment later: the last weights are not the best ones. Both runners keep
the weights of the best evaluation (as SB3's ``EvalCallback`` keeps its
``best_model``)::

    best = BestWeights(out_dir)              # None: kept in memory only
    best.bar                                 # the mean to beat (-inf before any)
    if best.offer(record, version, weights): # True when it improved (and was written)
        print(best.record)                   # {"eval/return_mean": ..., "timesteps_total": ...}

:meth:`BestWeights.offer` takes an evaluation whose mean is above :attr:`bar`,
not timed out, and whose weights are all finite. With a folder it writes
``weights-best.npz`` atomically (temporary file, fsync, rename): the arrays of
``weights.npz`` (``__version__`` and the network's arrays) plus ``__best__``,
the record as JSON; then ``weights-best.json``, the same record for people and
scripts. The record: ``eval/return_mean``, ``eval/return_std``,
``eval/episodes``, ``eval/returns``, ``eval/seed`` (episode i was reset with
seed + i: ``apex-dask-eval RUN --best --seed S --episodes N`` plays the same
episodes again), ``timesteps_total``, ``weights_version`` and ``time``. ``apex-dask-eval RUN --best`` plays the file, ``--export`` takes it.
A folder that already holds a best (a resumed run) sets the bar: its file is
replaced only by a better evaluation.
"""

from __future__ import annotations

import io
import json
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from apex_dask.experiment.checkpoints.npz_check import NpzProblem, check_npz

__all__ = ["BEST_FILE", "BEST_JSON", "BestWeights", "read_best_record"]

BEST_FILE = "weights-best.npz"
BEST_JSON = "weights-best.json"
RECORD_KEY = "__best__"
"""The array of ``weights-best.npz`` that holds the record (JSON, uint8)."""


def read_best_record(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The record inside a ``weights-best.npz`` (None if the file is missing or unreadable)."""
    try:
        check_npz(path)
        with np.load(path, allow_pickle=False) as npz:
            if RECORD_KEY not in npz.files:
                return None
            record = json.loads(npz[RECORD_KEY].tobytes().decode())
    except (OSError, ValueError, NpzProblem, UnicodeDecodeError):
        return None
    return record if isinstance(record, dict) else None


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class BestWeights:
    """The best greedy evaluation's weights and record; see the module docstring."""

    def __init__(self, folder: str | os.PathLike[str] | None = None) -> None:
        self.folder = None if folder is None else Path(folder)
        self.record: dict[str, Any] | None = None
        self.weights: tuple[int, dict[str, np.ndarray]] | None = None
        if self.folder is not None:
            self.record = read_best_record(self.folder / BEST_FILE)

    @property
    def path(self) -> Path | None:
        """Where the best weights are written (None: in memory only)."""
        return None if self.folder is None else self.folder / BEST_FILE

    @property
    def bar(self) -> float:
        """The greedy mean return an evaluation must exceed to be the new best."""
        if self.record is None:
            return -math.inf
        value = self.record.get("eval/return_mean")
        return float(value) if isinstance(value, int | float) else -math.inf

    def offer(
        self, evaluation: Mapping[str, Any], version: int, weights: Mapping[str, Any]
    ) -> bool:
        """Keep ``weights`` if ``evaluation`` (``return_mean``, ``return_std``, ``returns``,
        ``timed_out``, ``timesteps_total`` or ``timesteps``, ``seed``: episode i reset with
        seed + i) beats :attr:`bar`; whether it did. A failed write
        raises ``OSError`` with the previous file in place."""
        mean = evaluation.get("return_mean")
        if not isinstance(mean, int | float) or not math.isfinite(mean) or mean <= self.bar:
            return False
        if evaluation.get("timed_out"):
            return False
        arrays = {str(k): np.array(v) for k, v in weights.items()}  # a copy, kept as it is
        if not arrays or not all(np.isfinite(a).all() for a in arrays.values()):
            return False
        seed = evaluation.get("seed")
        record = {
            "eval/return_mean": float(mean),
            "eval/return_std": float(evaluation.get("return_std", math.nan)),
            "eval/episodes": len(evaluation.get("returns", ())),
            "eval/returns": [float(x) for x in evaluation.get("returns", ())],
            "eval/seed": None if seed is None else int(seed),
            "timesteps_total": int(
                evaluation.get("timesteps_total", evaluation.get("timesteps", 0))
            ),
            "weights_version": int(version),
            "time": time.time(),
        }
        if self.folder is not None:
            text = json.dumps(record)
            buf = io.BytesIO()
            extra = {RECORD_KEY: np.frombuffer(text.encode(), np.uint8)}
            np.savez(buf, __version__=np.asarray(int(version)), **extra, **arrays)
            _write_atomically(self.folder / BEST_FILE, buf.getvalue())
            _write_atomically(
                self.folder / BEST_JSON, (json.dumps(record, indent=1) + "\n").encode()
            )
        self.record, self.weights = record, (int(version), arrays)
        return True

    def summary(self) -> str | None:
        """One line: the best evaluation and where its weights are (None before one)."""
        r = self.record
        if r is None:
            return None
        where = f": {self.path}" if self.path is not None else " (kept in memory)"
        return (
            f"{r['eval/return_mean']:.1f} at {int(r.get('timesteps_total', 0)):,} env steps "
            f"(weights version {r.get('weights_version', '?')}){where}"
        )
