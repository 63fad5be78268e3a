"""One configuration tree for every way apex_dask is driven.

``ApexConfig`` is a frozen dataclass tree. The CLI (``apex-dask-submit``),
the notebook, YAML files and the HPC job scripts all build the same object::

    cfg = ApexConfig.preset("cartpole")
    cfg = cfg.override({"replay.alpha": 0.5, "learner.lr": 1e-3})
    cfg = ApexConfig.from_yaml("my_run.yaml")   # may name a preset: `preset: cartpole`

Defaults are RLlib's Ape-X defaults (the ``atari`` preset); smaller machines
use the ``cartpole`` and ``minatar`` presets. Every invalid value raises one
:class:`ConfigError` whose message names the field, the bad value and what is
allowed.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from apex_dask.config import dpg as _dpg
from apex_dask.config import r2d2 as _r2d2
from apex_dask.config import sections
from apex_dask.config.dpg import DPGConfig
from apex_dask.config.plumbing import (
    ConfigError,
    build,
    collect_docs,
    flatten,
    plain,
    set_dotted,
)
from apex_dask.config.presets import PRESETS
from apex_dask.config.r2d2 import R2D2Config
from apex_dask.config.reader import read_document, shown
from apex_dask.config.renames import RETIRED, renamed, set_reward_stop
from apex_dask.config.sections import (
    CheckpointConfig,
    EvalConfig,
    ReportConfig,
    SimulateConfig,
    StopConfig,
    TopologyConfig,
)
from apex_dask.config.validate import validate

__all__ = [
    "ApexConfig",
    "CheckpointConfig",
    "ConfigError",
    "DPGConfig",
    "R2D2Config",
    "EnvConfig",
    "EnvWorkersConfig",
    "EvalConfig",
    "LearnerConfig",
    "ReplayConfig",
    "ReportConfig",
    "StopConfig",
    "TopologyConfig",
    "PRESETS",
]


@dataclass(frozen=True)
class EnvConfig:
    """The environment every env worker (and the evaluator) builds."""

    env_id: str = "ALE/Pong-v5"
    """Gymnasium id, e.g. ``CartPole-v1``. List ids with
    ``python -c "import gymnasium; gymnasium.pprint_registry()"``."""
    env_kwargs: dict = field(default_factory=dict)
    """Keyword arguments passed to ``gymnasium.make``."""
    clip_rewards: bool | None = None
    """Train on rewards clipped to their sign (-1, 0, 1), as DQN/Ape-X on Atari; episode
    returns and evaluation still report raw game scores. None: on for ``ALE/`` ids only."""
    repeat_action_probability: float = 0.0
    """``ALE/`` ids: sticky-action probability of the emulator. 0.0 (the DQN/Ape-X setup)
    unlike ALE v5's default 0.25; set 0.25 to turn sticky actions back on."""
    make_timeout_s: float = 60.0
    """Seconds making one env may take (the probe before start, each env worker's envs,
    the evaluator's env). A constructor that does not return in time: exit 2 before start,
    an env error during the run."""
    step_timeout_s: float | None = None
    """Seconds one env ``step`` or ``reset`` may take; a late one is an env error (the
    hung env and its thread are abandoned, a fresh env is made). None: unbounded (each
    call then runs without a thread hop)."""


@dataclass(frozen=True)
class ReplayConfig:
    """Prioritized replay, split evenly over ``num_shards`` shard actors."""

    capacity: int = 2_000_000
    """Total transitions stored over all shards (RLlib ``buffer_size``)."""
    num_shards: int = 4
    """Number of replay shards (RLlib ``num_replay_buffer_shards``)."""
    alpha: float = 0.6
    """Priority exponent: P(i) = p_i^alpha / sum_k p_k^alpha. In [0, 1]."""
    beta: float = 0.4
    """Importance-sampling exponent, constant: w_i = (N P(i))^-beta / max w. In [0, 1]."""
    eps: float = 1e-6
    """Added to every priority so no item has zero probability (> 0)."""
    learning_starts: int = 50_000
    """Total transitions stored before sampling starts, split evenly over shards."""
    frame_stack: int | None = None
    """With observations that are stacks of k frames (first axis k, as Atari's 4 x 84 x 84),
    store each frame once per rollout (and send it once) instead of whole stacks:
    about 7x less replay memory and wire bytes on Atari. None: store observations whole."""
    placement: str = "learner_process"
    """Where the shards go: ``learner_process`` (in the learner's Dask worker: local
    calls, one event loop and GIL), ``learner_host`` (the other worker processes on the
    learner's host, as RLlib placed them) or ``spread`` (round-robin over all workers).
    Replaces ``colocate_with_learner`` (true: learner_process, false: spread)."""
    shared_memory: bool = True
    """Shards in other processes on the learner's host send batches through /dev/shm (a
    small reference over TCP, read in place; ``prefetch_per_shard + 4`` batches each)."""
    audit_priorities: bool = False
    """A check for tests and debugging (Dask runner): each priority update carries a
    checksum of every item its batch trained on, and the shard compares it with the data
    stored where the update lands (``replay/<k>/audit_checked``,
    ``replay/<k>/audit_mismatches``: 0 in a correct run). Costs a hash per item on the
    learner and on the shard."""

    @property
    def colocate_with_learner(self) -> bool:
        """Whether the shards share the learner's process (the key ``placement`` replaced)."""
        return self.placement == "learner_process"

    @property
    def shard_capacity(self) -> int:
        """Capacity of one shard."""
        return self.capacity // self.num_shards

    @property
    def shard_learning_starts(self) -> int:
        """Items one shard holds before it returns samples."""
        return -(-self.learning_starts // self.num_shards)


@dataclass(frozen=True)
class LearnerConfig:
    """The learner: the batch and queue settings of every agent, and the DQN agent's network
    and optimizer (the DPG agent's networks are in ``dpg``)."""

    batch_size: int = 512
    """Transitions per sampled batch (RLlib ``train_batch_size``)."""
    lr: float = 5e-4
    """Adam learning rate."""
    adam_eps: float = 1e-8
    """Adam epsilon."""
    grad_clip: float = 40.0
    """Gradient norm clip (> 0)."""
    gamma: float = 0.99
    """Discount factor, in (0, 1]."""
    n_step: int = 3
    """Steps summed in the return before bootstrapping (>= 1)."""
    double_q: bool = True
    """Double DQN target: the online net picks the action, the target net values it."""
    dueling: bool = True
    """Dueling head: Q = V + A - mean(A)."""
    hiddens: tuple[int, ...] = (256,)
    """Hidden layer sizes of the MLP (vector observations) or after the CNN (images)."""
    num_atoms: int = 1
    """C51 when > 1 (RLlib ``num_atoms``; the C51 paper: 51): a categorical return
    distribution over this many atoms spanning [v_min, v_max], projected n-step
    double-Q targets, per-item cross-entropy priorities. 1: a scalar Q head."""
    v_min: float = -10.0
    """Lowest atom (C51) or lowest bin edge (HL-Gauss); RLlib ``v_min``."""
    v_max: float = 10.0
    """Highest atom (C51) or highest bin edge (HL-Gauss); RLlib ``v_max``."""
    noisy: bool = False
    """Noisy nets (RLlib ``noisy``): factorised Gaussian noisy layers in the MLP layers and
    the head, new noise per acting pass and per update; evaluation and export use the
    mean weights. The env workers' epsilons are then 0 (``workers.epsilon_with_noisy``)."""
    sigma0: float = 0.5
    """Noisy nets: initial noise scale, sigma = sigma0 / sqrt(fan-in); RLlib ``sigma0``."""
    loss: str = "huber"
    """``huber``: the TD loss of a scalar Q head (C51 has its own cross-entropy);
    ``hl_gauss``: a histogram over ``num_bins`` bins of [v_min, v_max] trained on
    Gaussian-smoothed targets (Farebrother et al. 2024)."""
    num_bins: int = 51
    """HL-Gauss (``loss: hl_gauss``): bins over [v_min, v_max] (>= 2)."""
    hl_gauss_sigma_ratio: float = 0.75
    """HL-Gauss: the smoothing Gaussian's sigma in bin widths (the paper's 0.75)."""
    layer_norm: bool = False
    """LayerNorm before each ReLU of the MLP layers and the image encoder (as PQN)."""
    encoder: str = "auto"
    """Image encoder: ``auto`` (the Nature CNN, or one 16x3x3 conv for frames under 36
    pixels) or ``impala`` (the 15-layer IMPALA ResNet). Images only."""
    impala_scale: int = 1
    """Channel multiplier of the IMPALA encoder's stages (16, 32, 32 times this)."""
    target_update_freq: int = 500_000
    """Copy the online net to the target net every this many transitions trained."""
    inqueue_size: int = 16
    """Bound of the learner's inqueue of replayed batches; a full queue blocks producers."""
    prefetch_per_shard: int = 4
    """Sample requests kept in flight per replay shard."""
    max_replay_ratio: float | None = None
    """If set, the learner waits while transitions trained / transitions sampled
    exceeds this ratio (bounds over-training on a slow sampler). None: unbounded."""
    min_replay_ratio: float | None = None
    """If set, env workers wait while transitions trained / transitions sampled is
    below this ratio (holds fast samplers to the learner's pace, as the
    in-process runner does). Must be <= ``max_replay_ratio``. None: free-running."""
    device: str = "auto"
    """``auto`` (cuda if torch sees one, else cpu), ``cpu`` or ``cuda[:N]``."""
    num_threads: int = 1
    """torch threads in the learner process (>= 1)."""
    amp: str = "off"
    """``off`` or ``bf16`` (autocast of the forward passes; refused on a GPU without bf16)."""
    compile: bool = False
    """``torch.compile`` both networks (needs triton on CUDA, a C compiler on CPU)."""
    memory_format: str = "contiguous"
    """``contiguous`` or ``channels_last``: layout of the CNN's weights and image inputs."""
    before_learn_on_batch: str | None = None
    """Import path ``pkg.module:function`` of a hook ``f(batch, shard_id) -> batch`` run on
    every replayed batch before the update (``batch``: ``indices``, ``weights``,
    ``data``). None: no hook. A hook given in Python takes precedence."""


@dataclass(frozen=True)
class EnvWorkersConfig:
    """The env workers (RLlib rollout workers): epsilon-greedy for DQN, noisy for DPG."""

    num_workers: int = 32
    """Number of env worker actors; with ``topology.elastic``, the most there may be (the
    epsilon ladder's slots, filled ends first, then widest gaps: ``ladder_fill_order``)."""
    per_process: int = 1
    """With ``topology.elastic``: env workers each Dask worker process hosts (the learner's
    process hosts none unless it is the only one); a worker that joins gets this many,
    up to ``num_workers`` in all."""
    rollout_fragment_length: int = 50
    """Env steps per rollout each worker returns."""
    max_weight_sync_delay: int = 400
    """A worker gets new weights after producing this many env steps (if newer exist)."""
    epsilon_base: float = 0.4
    """Ape-X epsilons: eps_i = base ** (1 + alpha * i / (N - 1)). In (0, 1]."""
    epsilon_alpha: float = 7.0
    """Ape-X epsilon exponent spread (>= 0)."""
    epsilon_with_noisy: bool = False
    """With ``learner.noisy``: keep the epsilon ladder on top of the noise (RLlib's Ape-X
    did). false: every env worker acts greedily on its own noise draws (NoisyNet, Rainbow)."""
    rollouts_in_flight: int = 2
    """Sample requests kept in flight per env worker (RLlib num_async=2)."""
    rollouts_per_call: int = 1
    """Rollouts one sample request makes (each to its own random shard), summarised in one
    reply: fewer, smaller driver messages (Dask runner; weights still sync between calls)."""
    envs_per_worker: int = 1
    """Envs each env worker steps, choosing all their actions with one forward pass per
    step; each keeps its own n-step state and episode stats, all use the worker's epsilon.
    A rollout is ``rollout_fragment_length`` steps of every env (RLlib ``num_envs_per_worker``)."""
    vector_mode: str = "sync"
    """How a worker steps its ``envs_per_worker`` envs. ``sync``: gymnasium envs, one after
    the other (any env id). ``native``: for ``ALE/<Game>-v5`` ids, ale-py's C++
    ``AtariVectorEnv`` with the DQN preprocessing built in (about 3x the env steps/s of the
    gymnasium pipeline on one core; its few differences are listed in docs/algorithm.md);
    other ids fall back to ``sync``. Default ``sync``, exactly the gymnasium pipeline; the
    ``atari`` preset sets ``native``."""
    restart_failed_envs: bool = True
    """An env that raises, hangs (``env.step_timeout_s``) or returns a non-finite observation
    or reward is counted (``faults/env_errors``), closed and made again; its partial episode
    is dropped, complete n-step transitions are kept. false: the first env error ends the run."""
    max_env_errors_per_1k_steps: int = 10
    """With ``restart_failed_envs``: more env errors than this within the last 1,000 env
    steps of one env worker (all its envs) end the run. Relative to the work done: an env
    that fails once every few thousand steps is survived at any step rate. (Replaces
    ``max_env_errors_per_min``, which ended fast envs' runs and let slow broken ones go on.)"""
    max_consecutive_env_errors: int = 5
    """With ``restart_failed_envs``: an env that fails this many times in a row, made again
    each time, without completing a step in between ends the run (a broken env, however
    slow)."""


@dataclass(frozen=True)
class ApexConfig:
    """Everything an Ape-X run needs."""

    algo: str = "dqn"
    """The agent: ``dqn`` (Ape-X DQN, Discrete actions), ``dpg`` (Ape-X DPG, a bounded
    Box of actions; its settings in the ``dpg`` section) or ``r2d2`` (recurrent replay,
    Discrete actions; its settings in the ``r2d2`` section)."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """The environment."""
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    """Prioritized replay shards."""
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    """The learner."""
    dpg: DPGConfig = field(default_factory=DPGConfig)
    """The DPG agent (``algo: dpg``)."""
    r2d2: R2D2Config = field(default_factory=R2D2Config)
    """The R2D2 agent (``algo: r2d2``)."""
    workers: EnvWorkersConfig = field(default_factory=EnvWorkersConfig)
    """The env workers."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Greedy evaluation."""
    report: ReportConfig = field(default_factory=ReportConfig)
    """Iteration length."""
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    """Placement on the cluster."""
    stop: StopConfig = field(default_factory=StopConfig)
    """Stop conditions."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Checkpoints: how often, how many kept."""
    simulate: SimulateConfig = field(default_factory=SimulateConfig)
    """Simulated env workers (benchmarks and tests only)."""
    seed: int = 0
    """Base seed; each worker and shard derives its own from it."""

    def __post_init__(self) -> None:
        validate(self)

    # -- construction -------------------------------------------------
    @classmethod
    def preset(cls, name: str) -> ApexConfig:
        """A named preset: one of :data:`PRESETS`."""
        if not isinstance(name, str) or name not in PRESETS:
            raise ConfigError(
                f"unknown preset {shown(name)}; choose one of: {', '.join(sorted(PRESETS))}"
            )
        return cls.from_dict(PRESETS[name])

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ApexConfig:
        """Build from a nested dict (as in YAML); ``preset: NAME`` starts from a preset.

        Nested sections and dotted keys (``replay.alpha``) both work.
        """
        if not isinstance(data, dict):
            raise ConfigError(f"config must be a mapping of sections, got {type(data).__name__}")
        data = dict(data)
        preset = data.pop("preset", None)
        base = cls.preset(preset) if preset is not None else cls()
        return base.override(flatten(ApexConfig, data))

    @classmethod
    def from_yaml(cls, path: str | Path) -> ApexConfig:
        """Load a YAML file (nested sections, dotted keys, optional ``preset``)."""
        if not isinstance(path, str | os.PathLike):
            raise ConfigError(f"config file must be a path, got {shown(path)}")
        return cls.from_dict(read_document(Path(path), "config file") or {})

    def override(self, overrides: dict[str, Any]) -> ApexConfig:
        """A copy with dotted-key overrides applied, e.g. ``{"replay.alpha": 0.5}``.

        String values (from ``--set key=value``) are parsed as YAML scalars and
        then checked against the field's type.
        """
        if not isinstance(overrides, Mapping):
            raise ConfigError(
                f"overrides must be a mapping of dotted keys to values, got {shown(overrides)}"
            )
        tree = self.to_dict()
        reward: list[Any] = []
        for key, value in overrides.items():
            if key in RETIRED:  # accepted and ignored, with one line saying what replaced it
                warnings.warn(RETIRED[key], FutureWarning, stacklevel=2)
                continue
            if key == "stop.reward":  # its meaning depends on eval.episodes: set last
                reward.append(value)
                continue
            key, value = renamed(key, value)
            set_dotted(tree, key, value, list(_FIELD_DOCS))
        if reward:
            set_reward_stop(tree, reward[0], set(map(str, overrides)), list(_FIELD_DOCS))
        return build(ApexConfig, tree, "", list(_FIELD_DOCS))

    def to_dict(self) -> dict[str, Any]:
        """A nested dict of plain values (YAML/JSON friendly)."""
        out = dataclasses.asdict(self)
        return plain(out)

    def to_yaml(self) -> str:
        import yaml

        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    @staticmethod
    def field_docs() -> dict[str, str]:
        """Dotted field name -> its docstring (for ``--help`` and docs)."""
        return dict(_FIELD_DOCS)


_FIELD_DOCS = collect_docs(sys.modules[__name__], "ApexConfig", sections, _dpg, _r2d2)
