"""A trained run read back from its ``--out`` folder: config and weights, verified.

::

    run = load_run("runs/cartpole")                          # config.yaml + weights.npz
    run = load_run("runs/cartpole", checkpoint="latest")     # the newest checkpoint
    run = load_run("runs/cartpole", checkpoint="ckpt-000007")
    run = load_run("runs/cartpole", best=True)               # weights-best.npz
    check_fits(run, spaces)                                  # the config's network takes them

Nothing is unpickled: ``weights.npz`` and ``weights-best.npz`` are loaded
with ``allow_pickle=False`` once their array headers are checked against the
file (:mod:`apex_dask.experiment.checkpoints.npz_check`), and a checkpoint's learner part through :mod:`apex_dask.experiment.checkpoints.store`
(SHA-256 checked). A checkpoint brings its own config (the one the weights
were trained with). Every problem is a one-line :class:`UsageError`.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from apex_dask.cli.checks import EnvSpaces, UsageError
from apex_dask.config import ApexConfig, ConfigError

__all__ = ["TrainedRun", "check_fits", "load_run"]

HINT = "give the --out folder of an apex-dask-submit run"


@dataclass(frozen=True)
class TrainedRun:
    """What an evaluation plays: the run's config and the online net's weights."""

    folder: Path
    config: ApexConfig
    weights: dict[str, np.ndarray]
    version: int
    source: str
    """``weights.npz``, ``weights-best.npz`` or ``checkpoints/<name>``."""
    best: dict[str, Any] | None = None
    """With ``weights-best.npz``: its evaluation (``eval/return_mean``, ``timesteps_total``,
    ``weights_version``)."""

    @property
    def env_id(self) -> str:
        """The env the run trained on."""
        return self.config.env.env_id


def load_run(run_dir: str, checkpoint: str | None = None, best: bool = False) -> TrainedRun:
    """Read ``run_dir``'s config and weights (``checkpoint``: ``"latest"`` or a name/path;
    ``best``: ``weights-best.npz``, the best greedy evaluation's)."""
    folder = Path(run_dir).expanduser()
    if not folder.exists():
        raise UsageError(f"run folder {run_dir!r} does not exist; {HINT}")
    if not folder.is_dir():
        raise UsageError(f"{run_dir!r} is a file, not a run folder; {HINT}")
    if not (folder / "config.yaml").is_file():
        raise UsageError(f"{run_dir!r} holds no apex-dask-submit run (no config.yaml); {HINT}")
    if checkpoint is not None:
        return _from_checkpoint(folder, checkpoint)
    try:
        cfg = ApexConfig.from_yaml(folder / "config.yaml")
    except ConfigError as exc:
        raise UsageError(f"{folder / 'config.yaml'}: {exc}") from None
    if best:
        return _best(folder, cfg)
    path = folder / "weights.npz"
    if not path.is_file():
        from apex_dask.runtime.orchestration.checkpointing import latest_checkpoint

        has_ckpt = latest_checkpoint(folder / "checkpoints") is not None
        raise UsageError(
            f"{run_dir!r} has no weights.npz (the run has not ended or could not save them); "
            + (
                "use --checkpoint for its newest checkpoint"
                if has_ckpt
                else "it has no checkpoint either"
            )
        )
    weights, version = _read_npz(path)
    return TrainedRun(folder, cfg, weights, version, "weights.npz")


def _best(folder: Path, cfg: ApexConfig) -> TrainedRun:
    from apex_dask.experiment.best_weights import BEST_FILE, read_best_record

    path = folder / BEST_FILE
    if not path.is_file():
        raise UsageError(
            f"{str(folder)!r} has no {BEST_FILE} (written at the first greedy evaluation: "
            "a run with eval.episodes > 0 that evaluated at least once); drop --best"
        )
    weights, version = _read_npz(path)
    return TrainedRun(folder, cfg, weights, version, BEST_FILE, read_best_record(path))


def _read_npz(path: Path) -> tuple[dict[str, np.ndarray], int]:
    from apex_dask.experiment.checkpoints.npz_check import check_npz

    try:
        check_npz(path)  # a header declaring a huge shape: this line, not a MemoryError
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise UsageError(
            f"{path} is not a weights file written by apex-dask-submit "
            f"({type(exc).__name__}: {' '.join(str(exc).split())[:100]})"
        ) from None
    version = arrays.pop("__version__", None)
    arrays.pop("__best__", None)  # weights-best.npz: its evaluation, as JSON
    if version is None or version.shape != () or not arrays:
        raise UsageError(
            f"{path} is not a weights file written by apex-dask-submit (no __version__)"
        )
    return arrays, int(version)


def _from_checkpoint(folder: Path, name: str) -> TrainedRun:
    from apex_dask.experiment.checkpoints.store import CheckpointError, read_manifest, read_part
    from apex_dask.runtime.orchestration.checkpointing import checkpoints_in, latest_checkpoint

    root = folder / "checkpoints"
    if name == "latest":
        path = latest_checkpoint(root)
        if path is None:
            raise UsageError(f"{str(folder)!r} has no checkpoint in {root}; drop --checkpoint")
    else:
        path = Path(name).expanduser()
        if not path.is_absolute() and not path.exists():
            path = root / name
        if not (path / "manifest.json").is_file():
            names = ", ".join(p.name for p in checkpoints_in(root)) or "none"
            raise UsageError(f"--checkpoint {name!r}: no such checkpoint (in {root}: {names})")
    try:
        manifest = read_manifest(path)
        if "learner" not in manifest["parts"]:
            raise CheckpointError(f"{path}: no learner part")
        tree: Any = read_part(path, manifest["parts"]["learner"])
        cfg = ApexConfig.from_dict(manifest["metadata"]["config"])
        weights = {str(k): np.asarray(v) for k, v in tree["online"].items()}
        version = int(tree["counters"]["version"])
    except (CheckpointError, ConfigError) as exc:
        raise UsageError(str(exc)) from None
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise UsageError(f"{path}: not a checkpoint of an apex-dask-submit run ({exc!r})") from None
    try:
        source = f"checkpoints/{path.relative_to(root)}"
    except ValueError:
        source = str(path)
    return TrainedRun(folder, cfg, weights, version, source)


def check_fits(run: TrainedRun, spaces: EnvSpaces) -> None:
    """The config's network for these spaces takes the weights (else one line naming the
    keys that shape it)."""
    from apex_dask.algo.agents.base import WeightsMismatch
    from apex_dask.algo.agents.registry import make_policy
    from apex_dask.experiment.builder import agent_of, agent_spec

    cfg = run.config
    try:
        make_policy(agent_spec(cfg), spaces.observation_space, spaces.action_space, run.weights)
    except WeightsMismatch as exc:
        keys = agent_of(cfg).network_keys(cfg)
        raise UsageError(
            f"{run.source} of {str(run.folder)!r} does not fit the config's network "
            f"(algo {cfg.algo}, env {cfg.env.env_id}, {keys}): {exc}"
        ) from None
