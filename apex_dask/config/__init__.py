"""One configuration tree for every way apex_dask is driven.

::

    from apex_dask.config import ApexConfig

    cfg = ApexConfig.preset("cartpole")
    cfg = cfg.override({"replay.alpha": 0.5, "dqn.lr": 1e-3})
    cfg = ApexConfig.from_yaml("my_run.yaml")   # may name a preset: `preset: cartpole`

- :mod:`.tree`: the frozen dataclasses, documented at every field;
- :mod:`.presets`: ``atari`` (RLlib's Ape-X defaults), ``minatar``, ``cartpole``;
  ``pendulum`` and ``halfcheetah`` for the DPG agent; ``cartpole_pomdp`` and
  ``minatar_r2d2`` for the R2D2 agent (each agent's own section is its config class,
  ``apex_dask/algo/agents/<name>/config.py``);
- :mod:`.validate`: the checks run whenever a config is built;
- :mod:`.renames`: keys that moved (old files and checkpoints still load);
- :mod:`.plumbing`: dicts, dotted keys, YAML scalars and type coercion.
"""

from apex_dask.config.plumbing import ConfigError
from apex_dask.config.presets import PRESETS
from apex_dask.config.tree import (
    ApexConfig,
    CheckpointConfig,
    EnvConfig,
    EnvWorkersConfig,
    EvalConfig,
    LearnerConfig,
    ReplayConfig,
    ReportConfig,
    StopConfig,
    TopologyConfig,
)

__all__ = [
    "PRESETS",
    "ApexConfig",
    "CheckpointConfig",
    "ConfigError",
    "EnvConfig",
    "EnvWorkersConfig",
    "EvalConfig",
    "LearnerConfig",
    "ReplayConfig",
    "ReportConfig",
    "StopConfig",
    "TopologyConfig",
]
