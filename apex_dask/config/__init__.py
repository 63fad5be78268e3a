"""One configuration tree for every way apex_dask is driven.

::

    from apex_dask.config import ApexConfig

    cfg = ApexConfig.preset("cartpole")
    cfg = cfg.override({"replay.alpha": 0.5, "learner.lr": 1e-3})
    cfg = ApexConfig.from_yaml("my_run.yaml")   # may name a preset: `preset: cartpole`

- :mod:`.tree`: the frozen dataclasses, documented at every field;
- :mod:`.presets`: ``atari`` (RLlib's Ape-X defaults), ``minatar``, ``cartpole``;
  ``pendulum`` and ``halfcheetah`` for the DPG agent (:mod:`.dpg`: its section);
  ``cartpole_pomdp`` and ``minatar_r2d2`` for the R2D2 agent (:mod:`.r2d2`: its section);
- :mod:`.validate`: the checks run whenever a config is built;
- :mod:`.plumbing`: dicts, dotted keys, YAML scalars and type coercion.
"""

from apex_dask.config.plumbing import ConfigError
from apex_dask.config.presets import PRESETS
from apex_dask.config.tree import (
    ApexConfig,
    CheckpointConfig,
    DPGConfig,
    EnvConfig,
    EnvWorkersConfig,
    EvalConfig,
    LearnerConfig,
    R2D2Config,
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
    "DPGConfig",
    "EnvConfig",
    "EnvWorkersConfig",
    "EvalConfig",
    "LearnerConfig",
    "R2D2Config",
    "ReplayConfig",
    "ReportConfig",
    "StopConfig",
    "TopologyConfig",
]
