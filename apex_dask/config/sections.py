"""The config tree's run-level sections: evaluation, reporting, topology, checkpoints, stop.

Part of :mod:`apex_dask.config.tree` (which re-exports every class); kept apart so each
module stays short. Every field's docstring is its ``--list-keys`` text.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "GRACE_MAX_S",
    "CheckpointConfig",
    "EvalConfig",
    "ReportConfig",
    "SimulateConfig",
    "StopConfig",
    "TopologyConfig",
]


@dataclass(frozen=True)
class EvalConfig:
    """Greedy (epsilon 0) evaluation on a separate env."""

    interval_s: float = 60.0
    """Evaluate at most once per this many seconds of wall time (0: every iteration)."""
    episodes: int = 10
    """Episodes per evaluation (0 disables evaluation)."""
    max_episode_steps: int | None = 27_000
    """An evaluation episode is cut after this many agent steps (27,000 = 108,000 Atari
    frames, as in the literature); a policy that never loses cannot stall it. None: no cap."""
    timeout_s: float = 300.0
    """Wall-time bound of one evaluation: the episode in progress is then dropped and the
    result reported with ``eval/timed_out`` = 1 (the finished episodes' returns, if any)."""
    animation: bool = False
    """Show the first episode of an evaluation, at most every 30 s, as a small animation on
    the ``/apex`` page (frames from the evaluator's env, ``render_mode="rgb_array"``).
    On in the ``cartpole`` and ``minatar`` presets; off by default (``atari``), where
    rendering costs more."""


@dataclass(frozen=True)
class ReportConfig:
    """When one result dict is emitted (RLlib ``min_iter_time_s`` / ``timesteps_per_iteration``)."""

    min_iter_time_s: float = 30.0
    """An iteration lasts at least this many seconds."""
    timesteps_per_iteration: int = 25_000
    """...and at least this many env steps."""
    strict_invariants: bool = False
    """A violated law of the run's counters (``docs/architecture.md``, "Invariants":
    every flow balances, every shard is sampled and updated, versions never go back,
    evaluation reports) ends the run (exit 3) instead of a warning line and a count in
    ``health/invariant_violations``; the tests turn it on."""
    per_worker_keys: bool = False
    """Also put each env worker's own ``env/<i>/*`` and ``env/<exploration>/<i>`` in every
    result row. Off: a row holds their fixed-size summaries (``env/workers/<x>/min``,
    ``q25``, ``q50``, ``q75``, ``max``, ``low_third_mean``) at any worker count; each env
    worker's own values still reach the ``/apex`` page, ``/apex/metrics.json`` and
    Prometheus (each actor publishes them: ``docs/metrics.md``)."""


@dataclass(frozen=True)
class TopologyConfig:
    """Where actors go on the Dask cluster."""

    learner_worker: str | None = None
    """Name or address of the worker for the learner; None: a worker with a ``GPU``
    resource if any, else the first worker."""
    local_workers: int | None = None
    """Worker processes of the embedded LocalCluster; None: one per CPU core."""
    call_timeout_s: float = 60.0
    """Timeout of every actor-to-actor call (a dead peer never answers)."""
    elastic: bool = False
    """Follow the cluster as workers come and go: a Dask worker that joins gets
    ``workers.per_process`` env workers; one retired on purpose (``retire_workers``,
    ``cluster.scale``, ``adapt``, ``--lifetime``) first hands its replay shards and learner
    over (a fresh snapshot, restored elsewhere) and its env workers stop; no fault is
    counted. Off: env workers are fixed at the start, a worker that leaves is a fault."""
    weight_relays: bool = True
    """One weights relay per host with env workers: each weights version leaves the
    learner's process once per host, and that host's env workers take it from the relay
    (``docs/scaling.md``, "Weights once per host"). Off: every env worker pulls each
    version from the learner itself (one send per actor)."""
    weight_relay_max_age_s: float = 0.0
    """How old a relay's copy may be and still answer an env worker's sync. 0: a relay
    answers only from an ask of the learner that began after the request arrived (an env
    worker gets at least the learner's version at its sync, as without relays; each
    version leaves the learner at most once per host, and a host's syncs share an ask only
    when they arrive together). > 0: a copy asked for at most this many seconds before the
    request answers it, so a relay asks the learner at most about once per this many
    seconds whatever its env workers' sync rate, and an env worker's version may trail the
    learner's at its sync by the versions made in that time (``docs/scaling.md``,
    "Weights once per host")."""


GRACE_MAX_S = 7 * 24 * 3600.0
"""The longest ``checkpoint.grace_s``: well within what a ``threading.Timer`` (the
stop's watchdog) and the stop clock's timestamps hold (``threading.TIMEOUT_MAX`` is
about 9.2e9 s on Linux; past it the timer raises ``OverflowError``)."""


@dataclass(frozen=True)
class CheckpointConfig:
    """Checkpoints of a run with an output folder (``--out DIR``: ``DIR/checkpoints/``)."""

    interval_s: float = 1800.0
    """Write a checkpoint every this many seconds of wall time (also at the end, on
    Ctrl-C and on SIGTERM/SIGUSR1). 0 disables the periodic ones."""
    keep: int = 2
    """Keep the newest this many complete checkpoints (>= 1)."""
    grace_s: float = 120.0
    """Seconds a preemption signal (SIGTERM/SIGUSR1) leaves to write the last checkpoint;
    the SLURM script asks for the signal this long before the time limit. At most
    604,800 (a week), which the stop's watchdog timer can hold."""


@dataclass(frozen=True)
class StopConfig:
    """When training stops; the first condition met wins. None disables one."""

    timesteps: int | None = None
    """Stop after this many env steps sampled."""
    train_return: float | None = None
    """Stop when an iteration's training episodes reach this mean return
    (``env/episode_return_mean``: the episodes the least-exploring third of the env workers
    finished; RLlib's ``episode_reward_mean``)."""
    eval_return: float | None = None
    """Stop when the greedy evaluation's mean return (``eval/return_mean``) reaches this;
    needs ``eval.episodes`` > 0 (RLlib's ``evaluation/episode_reward_mean``). Replaces
    ``stop.reward``, which meant this with evaluation on and ``train_return`` without."""
    time_s: float | None = None
    """Stop after this many seconds of wall time."""
    iterations: int | None = None
    """Stop after this many result dicts."""


@dataclass(frozen=True)
class SimulateConfig:
    """Simulated env workers, for measuring how far one driver, scheduler and shard go
    (``benchmarks/scale.py``, ``docs/scaling.md``) and for tests; off in every preset.

    Each env worker then steps no env and runs no network: it hands over one prebuilt
    rollout of the env's spaces (frame-stacked observations in the compact wire form,
    each frame once) every ``rollout_fragment_length * envs_per_worker /
    env_steps_per_s`` seconds, with the same actor calls, shards, weight syncs and
    learner as a real run. Its observations carry the worker's index, the rollout's
    number and the item's place in it, so what the shards stored can be checked
    against what was offered. Not for training an agent: the data is noise."""

    env_steps_per_s: float | None = None
    """Env steps per second each simulated env worker offers (the Ape-X paper: 139
    frames/s = about 35 env steps/s at frame skip 4). None: real env workers."""
