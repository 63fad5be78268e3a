"""What every agent's config shares: the ``learner`` section and the base of each agent's own.

An :class:`~apex_dask.config.ApexConfig` holds the shared sections (``env``,
``replay``, ``learner``, ``workers``, ...) and the run's agent's own section,
named by the agent (``dqn:``, ``dpg:``, ``r2d2:`` in YAML; ``cfg.agent`` in
Python). Each agent's section is a frozen dataclass deriving
:class:`AgentConfig`, in ``agents/<name>/config.py``; it is the one object its
learner, env workers and policy read, beside :class:`LearnerConfig`::

    cfg = ApexConfig.preset("cartpole").override({"dqn.lr": 1e-3})
    cfg.agent                     # DQNConfig(lr=0.001, hiddens=(128, 128), ...)
    cfg.learner.batch_size        # shared by every agent

Every field carries its docstring (``--list-keys`` prints it); a field whose
value shapes the agent's network is named in the config class's
``network_keys`` (what a user compares when saved weights do not fit).

No torch here: the config is read before anything heavy is imported.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar

from apex_dask.algo.rollout.spec import RolloutSpec

__all__ = ["AMP_MODES", "ENCODERS", "MEMORY_FORMATS", "AgentConfig", "LearnerConfig", "Problem"]

_ROLLOUT = RolloutSpec()  # the acting settings' defaults, written once

Problem = tuple[str, Any, str]
"""A setting an agent cannot run with: ``(key, value, why)``, the key relative to the
section that holds it (an agent's own) or dotted from the root (a shared one)."""

ENCODERS = ("auto", "impala")
"""Image encoders of the conv torsos (:mod:`apex_dask.algo.agents.torsos`): ``auto``
(Nature CNN, or the MinAtar conv for small frames) or ``impala``."""
AMP_MODES = ("off", "bf16")
"""Autocast of a learner's forward passes: none, or to bfloat16."""
MEMORY_FORMATS = ("contiguous", "channels_last")
"""Layouts of a CNN's weights and image inputs."""


@dataclass(frozen=True)
class LearnerConfig:
    """The learner: what every agent's learner reads (the batch, the optimizer's shared
    keys, the device) and how replayed batches reach it. An agent's networks, learning
    rates and losses are in its own section."""

    batch_size: int = 512
    """Replay items per sampled batch (RLlib ``train_batch_size``): transitions, or
    sequences with ``algo: r2d2``."""
    adam_eps: float = 1e-8
    """Adam epsilon."""
    grad_clip: float = 40.0
    """Gradient norm clip (> 0)."""
    gamma: float = _ROLLOUT.gamma
    """Discount factor, in (0, 1]."""
    n_step: int = _ROLLOUT.n_step
    """Steps summed in the return before bootstrapping (>= 1)."""
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
    before_learn_on_batch: str | None = None
    """Import path ``pkg.module:function`` of a hook ``f(batch, shard_id) -> batch`` run on
    every replayed batch before the update (``batch``: ``indices``, ``weights``,
    ``data``). None: no hook. A hook given in Python takes precedence."""


@dataclass(frozen=True)
class AgentConfig:
    """The base of every agent's own section (a frozen dataclass with a docstring under
    each field). An agent checks its own fields in :meth:`check`."""

    network_keys: ClassVar[tuple[str, ...]] = ()
    """The fields that shape the agent's network (named when saved weights do not fit)."""

    def check(self) -> Problem | None:
        """The first of this section's values the agent cannot run with, as ``(field,
        value, why)`` (the field's name without the section), or None."""
        return None

    def shaping(self) -> dict[str, Any]:
        """``{field: value}`` of :attr:`network_keys`."""
        names = {f.name for f in fields(self)}
        return {k: getattr(self, k) for k in self.network_keys if k in names}


def positive(name: str, value: Any) -> Problem | None:
    """``(name, value, "must be > 0")`` unless ``value > 0``."""
    return None if value is not None and value > 0 else (name, value, "must be > 0")


def nonneg(name: str, value: Any) -> Problem | None:
    """``(name, value, "must be >= 0")`` unless ``value >= 0``."""
    return None if value is not None and value >= 0 else (name, value, "must be >= 0")


def unit(name: str, value: float, lo_open: bool = False) -> Problem | None:
    """Unless ``value`` is in [0, 1] (``lo_open``: (0, 1])."""
    ok = (0 < value <= 1) if lo_open else (0 <= value <= 1)
    return None if ok else (name, value, "must be in " + ("(0, 1]" if lo_open else "[0, 1]"))


def layer_sizes(name: str, sizes: tuple[int, ...]) -> Problem | None:
    """Unless ``sizes`` is a non-empty list of positive layer sizes."""
    if sizes and all(h > 0 for h in sizes):
        return None
    return name, sizes, "must be a non-empty list of positive layer sizes"


def first(*problems: Problem | None) -> Problem | None:
    """The first problem of ``problems`` that is not None."""
    return next((p for p in problems if p is not None), None)
