"""One configuration tree for every way apex_dask is driven.

``ApexConfig`` is a frozen dataclass tree. The CLI (``apex-dask-submit``),
the notebook, YAML files and the HPC job scripts all build the same object::

    cfg = ApexConfig.preset("cartpole")
    cfg = cfg.override({"replay.alpha": 0.5, "dqn.lr": 1e-3})
    cfg = ApexConfig.from_yaml("my_run.yaml")   # may name a preset: `preset: cartpole`

The shared sections (``env``, ``replay``, ``learner``, ``workers``, ...) are here;
the run's agent's own section (``cfg.agent``; ``dqn:``, ``dpg:`` or ``r2d2:`` in
YAML, named by ``algo``) is its config class, found through the agent registry.
A key of another agent's section is refused, naming the agent it belongs to.

Defaults are RLlib's Ape-X defaults (the ``atari`` preset); smaller machines
use the ``cartpole`` and ``minatar`` presets. Every invalid value raises one
:class:`ConfigError` whose message names the field, the bad value and what is
allowed.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from apex_dask.algo.agents import config as _shared
from apex_dask.algo.agents.config import AgentConfig, LearnerConfig
from apex_dask.algo.agents.registry import UnknownAgentError, agent, agents, is_agent
from apex_dask.algo.rollout.spec import RolloutSpec
from apex_dask.config import sections
from apex_dask.config.plumbing import (
    ConfigError,
    build,
    coerce,
    collect_docs,
    flatten,
    plain,
    set_dotted,
)
from apex_dask.config.presets import PRESETS
from apex_dask.config.reader import read_document, shown
from apex_dask.config.renames import MOVED_TO_AGENT, route, set_reward_stop
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
    "key_annotation",
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
    "PRESETS",
]

_ROLLOUT = RolloutSpec()  # the acting settings' defaults, written once


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
    make_timeout_s: float = _ROLLOUT.make_timeout_s
    """Seconds making one env may take (the probe before start, each env worker's envs,
    the evaluator's env). A constructor that does not return in time: exit 2 before start,
    an env error during the run."""
    step_timeout_s: float | None = _ROLLOUT.step_timeout_s
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
    frame_stack: int | None = _ROLLOUT.frame_stack
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
class EnvWorkersConfig:
    """The env workers (RLlib rollout workers): epsilon-greedy for DQN, noisy for DPG."""

    num_workers: int = 32
    """Number of env worker actors; with ``topology.elastic``, the most there may be (the
    epsilon ladder's slots, filled ends first, then widest gaps: ``ladder_fill_order``)."""
    per_process: int = 1
    """With ``topology.elastic``: env workers each Dask worker process hosts (the learner's
    process hosts none unless it is the only one); a worker that joins gets this many,
    up to ``num_workers`` in all."""
    rollout_fragment_length: int = _ROLLOUT.fragment_length
    """Env steps per rollout each worker returns."""
    max_weight_sync_delay: int = 400
    """A worker gets new weights after producing this many env steps (if newer exist)."""
    epsilon_base: float = 0.4
    """Ape-X epsilons: eps_i = base ** (1 + alpha * i / (N - 1)). In (0, 1]."""
    epsilon_alpha: float = 7.0
    """Ape-X epsilon exponent spread (>= 0)."""
    epsilon_with_noisy: bool = False
    """With ``dqn.noisy``: keep the epsilon ladder on top of the noise (RLlib's Ape-X
    did). false: every env worker acts greedily on its own noise draws (NoisyNet, Rainbow)."""
    rollouts_in_flight: int = 2
    """Sample requests kept in flight per env worker (RLlib num_async=2)."""
    rollouts_per_call: int = 1
    """Rollouts one sample request makes (each to its own random shard), summarised in one
    reply: fewer, smaller driver messages (Dask runner; weights still sync between calls)."""
    envs_per_worker: int = _ROLLOUT.num_envs
    """Envs each env worker steps, choosing all their actions with one forward pass per
    step; each keeps its own n-step state and episode stats, all use the worker's epsilon.
    A rollout is ``rollout_fragment_length`` steps of every env (RLlib ``num_envs_per_worker``)."""
    vector_mode: str = _ROLLOUT.vector_mode
    """How a worker steps its ``envs_per_worker`` envs. ``sync``: gymnasium envs, one after
    the other (any env id). ``native``: for ``ALE/<Game>-v5`` ids, ale-py's C++
    ``AtariVectorEnv`` with the DQN preprocessing built in (about 3x the env steps/s of the
    gymnasium pipeline on one core; its few differences are listed in docs/algorithm.md);
    other ids fall back to ``sync``. Default ``sync``, exactly the gymnasium pipeline; the
    ``atari`` preset sets ``native``."""
    restart_failed_envs: bool = _ROLLOUT.restart_failed_envs
    """An env that raises, hangs (``env.step_timeout_s``) or returns a non-finite observation
    or reward is counted (``faults/env_errors``), closed and made again; its partial episode
    is dropped, complete n-step transitions are kept. false: the first env error ends the run."""
    max_env_errors_per_1k_steps: int = _ROLLOUT.max_env_errors_per_1k_steps
    """With ``restart_failed_envs``: more env errors than this within the last 1,000 env
    steps of one env worker (all its envs) end the run. Relative to the work done: an env
    that fails once every few thousand steps is survived at any step rate. (Replaces
    ``max_env_errors_per_min``, which ended fast envs' runs and let slow broken ones go on.)"""
    max_consecutive_env_errors: int = _ROLLOUT.max_consecutive_env_errors
    """With ``restart_failed_envs``: an env that fails this many times in a row, made again
    each time, without completing a step in between ends the run (a broken env, however
    slow)."""


@dataclass(frozen=True)
class ApexConfig:
    """Everything an Ape-X run needs."""

    algo: str = "dqn"
    """The agent: ``dqn`` (Ape-X DQN, Discrete actions), ``dpg`` (Ape-X DPG, a bounded
    Box of actions) or ``r2d2`` (recurrent replay, Discrete actions), or one an installed
    package registers (entry point group ``apex_dask.agents``). Its settings are in its
    own section, named as the agent (``dqn.lr``, ``dpg.actor_hiddens``, ...)."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """The environment."""
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    """Prioritized replay shards."""
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    """The learner (what every agent's learner reads)."""
    agent: AgentConfig | None = None
    """The agent's own section (``<algo>.*``: its networks, losses, exploration); None:
    its defaults."""
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
        if self.agent is None:
            object.__setattr__(self, "agent", _builder(self.algo).config())
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

        Nested sections and dotted keys (``replay.alpha``) both work. A dict written by
        an older apex_dask (agent keys in ``learner``, every agent's section) loads: its
        keys move to the agent's section, with one ``FutureWarning`` line.
        """
        if not isinstance(data, dict):
            raise ConfigError(f"config must be a mapping of sections, got {type(data).__name__}")
        data = dict(data)
        preset = data.pop("preset", None)
        base = cls.preset(preset) if preset is not None else cls()
        flat = flatten(ApexConfig, data, agent_section=is_agent)
        older = any(key in MOVED_TO_AGENT for key in flat)  # every section was written then
        return base._apply(flat, saved=older)

    @classmethod
    def from_yaml(cls, path: str | Path) -> ApexConfig:
        """Load a YAML file (nested sections, dotted keys, optional ``preset``)."""
        if not isinstance(path, str | os.PathLike):
            raise ConfigError(f"config file must be a path, got {shown(path)}")
        return cls.from_dict(read_document(Path(path), "config file") or {})

    def override(self, overrides: dict[str, Any]) -> ApexConfig:
        """A copy with dotted-key overrides applied, e.g. ``{"replay.alpha": 0.5}``.

        String values (from ``--set key=value``) are parsed as YAML scalars and
        then checked against the field's type. An ``algo`` override comes first: the
        agent's section then starts from the new agent's defaults.
        """
        if not isinstance(overrides, Mapping):
            raise ConfigError(
                f"overrides must be a mapping of dotted keys to values, got {shown(overrides)}"
            )
        return self._apply(dict(overrides), saved=False)

    def _apply(self, flat: dict[str, Any], *, saved: bool) -> ApexConfig:
        tree = self.to_dict()
        algo = self.algo
        if "algo" in flat:
            algo = coerce("algo", flat["algo"], str)
            if algo != self.algo:
                tree.pop(self.algo)
                tree[algo] = plain(dataclasses.asdict(_builder(algo).config()))
            tree["algo"] = algo
        names = _Keys()  # every key, read only for an unknown key's message
        reward: list[Any] = []
        for key, value in route(flat, algo, saved=saved, stacklevel=4):
            if key == "stop.reward":  # its meaning depends on eval.episodes: set last
                reward.append(value)
                continue
            set_dotted(tree, key, value, names)
        if reward:
            set_reward_stop(tree, reward[0], set(map(str, flat)), names)
        section = tree.pop(algo)
        if not isinstance(section, dict):
            raise ConfigError(f"{algo} must be a section (mapping), got {shown(section)}")
        tree["agent"] = build(_builder(algo).config, section, f"{algo}.", names)
        return build(ApexConfig, tree, "", names)

    def to_dict(self) -> dict[str, Any]:
        """A nested dict of plain values (YAML/JSON friendly); the agent's section under
        its name (``algo``)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            name = self.algo if f.name == "agent" else f.name
            out[name] = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
        return plain(out)

    def to_yaml(self) -> str:
        """The config as YAML that :meth:`from_yaml` (and ``--config``) reads back."""
        import yaml

        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    @staticmethod
    def field_docs() -> dict[str, str]:
        """Dotted field name -> its docstring (for ``--help`` and docs); every agent's
        section under its name."""
        return dict(_field_docs())

    def key_type(self, dotted: str) -> Any:
        """The annotation of the key ``dotted`` (this config's agent's section under its
        name), or None when there is no such key (a section is its dataclass)."""
        head, _, rest = dotted.partition(".")
        if head == self.algo and rest:
            return _annotation(type(self.agent), rest)
        return None if is_agent(head) else key_annotation(dotted)


def key_annotation(dotted: str) -> Any:
    """The annotation of ``dotted`` in any agent's section or the shared tree (or None)."""
    head, _, rest = dotted.partition(".")
    if rest and is_agent(head):
        return _annotation(_builder(head).config, rest)
    return _annotation(ApexConfig, dotted)  # None for "agent.*": named by the agent


def _builder(algo: Any):
    """The agent ``algo`` (a :class:`ConfigError` naming the agents if there is none)."""
    try:
        return agent(algo)
    except UnknownAgentError as exc:
        raise ConfigError(f"algo={algo!r} is invalid: {exc}") from None


def _annotation(root: Any, dotted: str) -> Any:
    import typing

    cls = root
    for part in dotted.split("."):
        if not dataclasses.is_dataclass(cls):
            return None
        hints = typing.get_type_hints(cls)
        if part not in hints or part == "agent":
            return None
        cls = hints[part]
    return cls


class _Keys:
    """Every key of the tree, iterated when asked (an unknown key's closest match): the
    agents of other packages are looked up only then."""

    def __iter__(self):
        return iter(_field_docs())


@functools.cache
def _field_docs() -> dict[str, str]:
    """Every key's docstring, in the tree's order; each agent's section where ``agent``
    is (read once: entry point agents included)."""
    shared = collect_docs(sys.modules[__name__], "ApexConfig", sections, _shared)
    out: dict[str, str] = {}
    for key, doc in shared.items():
        if key != "agent":
            out[key] = doc
            continue
        for name, builder in agents().items():
            cls = builder.config
            docs = collect_docs(sys.modules[cls.__module__], cls.__name__)
            out.update({f"{name}.{k}": v for k, v in docs.items()})
    return out
