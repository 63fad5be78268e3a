"""``apex-dask-eval``'s exported policies: ``--export FILE`` writes a run's greedy policy
with its JSON; ``--policy FILE`` reads one back with the env its JSON names, checked
before a cluster starts (one line for each way it can be wrong)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from apex_dask.cli.checks import UsageError
from apex_dask.cli.runfolder import TrainedRun

__all__ = ["PolicySource", "export", "open_policy"]

PREFIX = "apex-dask-eval:"


@dataclass(frozen=True)
class PolicySource:
    """What the report says of an exported file (as :class:`TrainedRun` says of a run)."""

    folder: Path
    source: str
    version: int | None
    env_id: str


def open_policy(path: str) -> tuple[PolicySource, Any, Any]:
    """``(what the report names, the env factory, the loaded policy)`` of ``path``; a
    :class:`UsageError` for a file, JSON or env that does not fit."""
    from apex_dask.algo.play.exported import PolicyFile, PolicyFileError

    try:
        exported = PolicyFile.read(path)
        exported.policy()  # it loads here, before a cluster starts
        factory = exported.env_factory()
    except PolicyFileError as exc:
        raise UsageError(str(exc)) from None
    except ValueError as exc:  # the env id or kwargs of the JSON
        raise UsageError(f"--policy {path}: {exc}") from None
    _check_spaces(exported, factory)
    source = PolicySource(
        folder=Path(path).expanduser().resolve().parent,
        source=exported.name,
        version=exported.doc.get("weights_version"),
        env_id=str(exported.doc["env_id"]),
    )
    return source, factory, exported


def _check_spaces(exported: Any, factory: Any) -> None:
    """The env the JSON names gives the spaces the file was exported for."""
    from apex_dask.algo.play.export import describe_space

    env = factory()
    try:
        have = {
            "observation_space": describe_space(env.observation_space),
            "action_space": describe_space(env.action_space),
        }
    finally:
        env.close()
    for key, space in have.items():
        want = exported.doc[key]
        if space != want:
            raise UsageError(
                f"--policy {exported.name}: {exported.doc['env_id']} here has the "
                f"{key.replace('_', ' ')} {space}, the file was exported for {want} (another "
                "version of the env or its package?)"
            )


def export(trained: TrainedRun, spaces: Any, target: Path, fmt: str | None = None) -> None:
    """Write ``trained``'s greedy policy to ``target`` (its format by suffix or ``fmt``) and
    the JSON beside it; one line that says where."""
    from apex_dask.algo.play.export import ExportError, export_policy
    from apex_dask.experiment.builder import agent_spec

    cfg = trained.config
    about = {
        "env_id": cfg.env.env_id,
        "env_kwargs": dict(cfg.env.env_kwargs),
        "env": {  # what apex-dask-eval --policy makes the env with, as the run's evaluation
            "clip_rewards": cfg.env.clip_rewards,
            "repeat_action_probability": cfg.env.repeat_action_probability,
            "max_episode_steps": cfg.eval.max_episode_steps,
        },
        "algo": cfg.algo,
        "run_dir": str(trained.folder),
        "weights": trained.source,
        "weights_version": trained.version,
    }
    if trained.best is not None:  # weights-best.npz: the evaluation that chose them
        about["best_eval"] = trained.best
    try:
        program, meta = export_policy(
            target,
            agent_spec(cfg),
            spaces.observation_space,
            spaces.action_space,
            trained.weights,
            about=about,
            fmt=fmt,
        )
    except ExportError as exc:
        raise UsageError(f"--export: {exc}") from None
    print(f"{PREFIX} exported the greedy policy to {program} (how to call it: {meta})")
