"""RLlib experiment files read: Tune experiment YAML (one or more experiments), a bare
config, or the ``params.json`` a finished RLlib run left behind.

::

    experiments = read_experiments("pong-apex.yaml")
    exp = pick(experiments, name=None, path="pong-apex.yaml")   # one, or --experiment NAME
    exp.run, exp.config, exp.stop, exp.tune                       # what the converter reads

The three shapes, told apart by their keys:

* an experiment: ``{run: APEX, env: ..., stop: {...}, config: {...}}`` (Tune's
  experiment keys next to ``run``: ``num_samples``, ``checkpoint_freq``, ...);
* several experiments: ``{name: {run: ..., ...}, other: {run: ..., ...}}``;
* a bare config (``params.json``, or a YAML holding only config keys): the algorithm is
  not written down, so it is told from the keys (``actor_hiddens``, ``critic_lr``, ...
  are APEX_DDPG's), and the table says so.

Every problem is one :class:`RLlibError` line naming the file and the fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from apex_dask.config.plumbing import ConfigError

__all__ = ["RUNS", "TUNE_EXPERIMENT_KEYS", "Experiment", "RLlibError", "pick", "read_experiments"]

RUNS = ("APEX", "APEX_DDPG")
"""The RLlib algorithms (``run:`` names) that convert."""

_EXPERIMENT_KEYS = {"run", "config", "stop", "env"}

TUNE_EXPERIMENT_KEYS = frozenset(
    {
        *_EXPERIMENT_KEYS,
        "name",
        "num_samples",
        "time_budget_s",
        "local_dir",
        "storage_path",
        "upload_dir",
        "sync_config",
        "sync_to_driver",
        "trial_name_creator",
        "trial_dirname_creator",
        "log_to_file",
        "loggers",
        "verbose",
        "checkpoint_freq",
        "checkpoint_at_end",
        "keep_checkpoints_num",
        "checkpoint_score_attr",
        "checkpoint_config",
        "export_formats",
        "max_failures",
        "restore",
        "resources_per_trial",
        "trial_resources",
        "resources",
        "reuse_actors",
        "raise_on_failed_trial",
        "fail_fast",
        "queue_trials",
        "progress_reporter",
    }
)
"""What Tune's experiment takes next to ``run:`` across its versions (its keyword
arguments); anything else there Tune refused, a config key included."""
_DDPG_SIGNS = ("actor_hiddens", "critic_hiddens", "actor_lr", "critic_lr", "twin_q", "tau")


class RLlibError(ConfigError):
    """An RLlib file that cannot be converted; the message is one line."""


@dataclass(frozen=True)
class Experiment:
    """One experiment of an RLlib file, as written (nothing converted yet)."""

    name: str
    run: str
    config: dict[str, Any]
    stop: dict[str, Any] = field(default_factory=dict)
    tune: dict[str, Any] = field(default_factory=dict)
    """Tune's other experiment keys (``num_samples``, ``checkpoint_freq``, ...)."""
    env: Any = None
    """The experiment-level ``env:`` (None: only ``config.env``, if any)."""
    source: str = ""
    run_from: str = ""
    """Why ``run`` is what it is when the file does not say (a bare config), else ''."""


def _load(path: Path) -> Any:
    """The file's document (JSON for ``.json`` names and text that opens with ``{``: a
    params.json's ``NaN`` and ``-Infinity`` are the floats JSON names), read within the
    bounds of :mod:`apex_dask.config.reader`."""
    from apex_dask.config.reader import read_document

    try:
        return read_document(path, "RLlib file")
    except ConfigError as exc:
        raise RLlibError(str(exc)) from None


def _is_experiment(value: Any) -> bool:
    return isinstance(value, Mapping) and "run" in value


def read_experiments(path: str | Path) -> list[Experiment]:
    """Every experiment in the file at ``path`` (a bare config is one experiment)."""
    p = Path(path).expanduser()
    data = _load(p)
    where = p.name
    if not isinstance(data, Mapping) or not data:
        raise RLlibError(
            f"{where}: must hold an RLlib experiment ({{run: APEX, env: ..., config: {{...}}}}), "
            "several of them by name, or a config such as a params.json"
        )
    if _is_experiment(data) or ("config" in data and isinstance(data.get("config"), Mapping)):
        return [_experiment(p.stem, data, where)]
    if all(_is_experiment(v) for v in data.values()):
        return [_experiment(str(name), value, where) for name, value in data.items()]
    named = [str(k) for k, v in data.items() if _is_experiment(v)]
    if named:
        odd = next(str(k) for k, v in data.items() if not _is_experiment(v))
        raise RLlibError(
            f"{where}: {odd!r} sits next to the experiments {', '.join(named)} but has no run: "
            "key; give each experiment a run: (APEX or APEX_DDPG)"
        )
    return [_bare(p.stem, dict(data), where)]


def _experiment(name: str, data: Mapping[str, Any], where: str) -> Experiment:
    config = data.get("config") or {}
    stop = data.get("stop") or {}
    for key, value in (("config", config), ("stop", stop)):
        if not isinstance(value, Mapping):
            raise RLlibError(f"{where}: experiment {name!r}: {key}: must be a mapping")
    run = data.get("run")
    if run is None:
        bare = _bare(name, dict(config), where)
        run, run_from = bare.run, bare.run_from
    else:
        run_from = ""
    if not isinstance(run, str) or run not in RUNS:
        raise RLlibError(
            f"{where}: experiment {name!r}: run: {run!r} does not convert; apex_dask runs "
            f"RLlib's {' and '.join(RUNS)} (Ape-X DQN and Ape-X DDPG)"
        )
    tune = {k: v for k, v in data.items() if k not in _EXPERIMENT_KEYS}
    return Experiment(
        name=name,
        run=run,
        config=dict(config),
        stop=dict(stop),
        tune=tune,
        env=data.get("env"),
        source=where,
        run_from=run_from,
    )


def _bare(name: str, config: dict[str, Any], where: str) -> Experiment:
    """A config without ``run:`` (a params.json): APEX_DDPG if DDPG's keys are in it."""
    signs = [k for k in _DDPG_SIGNS if k in config]
    if signs:
        run, why = "APEX_DDPG", f"the file has no run:; {', '.join(signs[:2])} are DDPG's keys"
    else:
        run, why = "APEX", "the file has no run: and none of DDPG's keys (actor_hiddens, ...)"
    return Experiment(name=name, run=run, config=config, source=where, run_from=why)


def pick(experiments: list[Experiment], name: str | None, where: str) -> Experiment:
    """The experiment named ``name`` (``--experiment``), or the only one."""
    names = [e.name for e in experiments]
    if name is not None:
        for e in experiments:
            if e.name == name:
                return e
        raise RLlibError(
            f"{where}: no experiment named {name!r}; the file holds: {', '.join(names)}"
        )
    if len(experiments) > 1:
        raise RLlibError(
            f"{where} holds {len(experiments)} experiments ({', '.join(names)}); "
            "pick one with --experiment NAME"
        )
    return experiments[0]
