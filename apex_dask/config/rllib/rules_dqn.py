"""RLlib keys of Ape-X DQN (``run: APEX``), and those APEX_DDPG shares with it.

Workers, replay, learner, the value head and exploration. One :class:`Rule` per
key; its first spelling names it, the others are the same key in other eras
(``buffer_size`` / ``replay_buffer_config.capacity``, ``sample_batch_size`` /
``rollout_fragment_length``, ...).
"""

from __future__ import annotations

from typing import Any

from apex_dask.config.rllib.rules import (
    Ctx,
    Ignored,
    Mapped,
    Outcome,
    Refused,
    group,
    ignore,
    integer,
    noop,
    number,
    rule,
    to,
)

__all__ = ["DQN_RULES", "q_hiddens"]

APEX = ("APEX",)
DEPRECATED = -1
"""RLlib's DEPRECATED_VALUE, as params.json files hold it for retired keys."""

_UNIFORM = ("MultiAgentReplayBuffer", "ReplayBuffer")
_PRIORITIZED = ("MultiAgentPrioritizedReplayBuffer", "PrioritizedReplayBuffer")
NO_CLIP = 1e9
"""``learner.grad_clip`` for RLlib's ``grad_clip: null`` (no clipping): never reached."""


def prioritized(ctx: Ctx) -> bool:
    """RLlib replayed by priority (else uniformly)."""
    flag = ctx.value("prioritized_replay", True)
    kind = str(ctx.value("replay_buffer_config.type") or "").rsplit(".", 1)[-1]
    return flag is not False and kind not in _UNIFORM


def _workers(value: Any, ctx: Ctx) -> Outcome:
    if not integer(value) or value < 1:
        return Refused(
            "Ape-X needs env workers (RLlib sampled on its driver with 0); give 1 or more"
        )
    return Mapped({"workers.num_workers": int(value)})


def _fragment(value: Any, ctx: Ctx) -> Outcome:
    if not integer(value) or value < 1:
        return Refused("give a number of env steps per rollout (1 or more)")
    return Mapped(
        {"workers.rollout_fragment_length": int(value)}, "env steps of each env per rollout"
    )


def _capacity(value: Any, ctx: Ctx) -> Outcome:
    if not integer(value):
        return Refused("give a number of transitions")
    return Mapped({"replay.capacity": int(value)}, "all shards together, as RLlib split it")


def _replay_number(key: str):
    def handle(value: Any, ctx: Ctx) -> Outcome:
        if not prioritized(ctx):
            return Ignored("replay is uniform (prioritized_replay: false or a uniform buffer type)")
        return Mapped({key: value})

    return handle


def _uniform(value: Any, ctx: Ctx) -> Outcome:
    if prioritized(ctx):
        return Mapped({}, "prioritized replay, as apex_dask's")
    return Mapped(
        {"replay.alpha": 0.0}, "uniform replay: alpha 0 gives equal priorities, weights 1"
    )


def _buffer_type(value: Any, ctx: Ctx) -> Outcome:
    kind = str(value or "").rsplit(".", 1)[-1]
    if kind in _PRIORITIZED + _UNIFORM:
        return _uniform(value, ctx)
    return Refused("apex_dask's shards are prioritized replay buffers (alpha 0: uniform)")


def _learning_starts(value: Any, ctx: Ctx) -> Outcome:
    per_shard = ctx.value("replay_buffer_config.min_size_for_sampling") or 0
    total = ctx.value("num_steps_sampled_before_learning_starts", 0) or 0
    if per_shard and not ctx.has("num_steps_sampled_before_learning_starts"):
        total = 0  # the RLlib versions that had min_size_for_sampling read it alone
    shards = ctx.value("optimizer.num_replay_buffer_shards", 4)
    if not integer(total) or not integer(per_shard) or not integer(shards):
        return Refused("give a number of transitions")
    starts = max(int(total), int(per_shard) * int(shards))
    return Mapped(
        {"replay.learning_starts": starts},
        "transitions stored over all shards before sampling"
        + (" (min_size_for_sampling is per shard)" if per_shard else ""),
    )


def _grad_clip(value: Any, ctx: Ctx) -> Outcome:
    if value is None:
        return Mapped({"learner.grad_clip": NO_CLIP}, "no clipping: a bound never reached")
    return Mapped({"learner.grad_clip": value})


def _target_freq(value: Any, ctx: Ctx) -> Outcome:
    if ctx.ddpg:
        from apex_dask.config.rllib.rules_ddpg import ddpg_targets

        return ddpg_targets(ctx)
    if not integer(value) or value < 0:
        return Refused("give a number of transitions trained")
    if value == 0:
        batch = ctx.value("train_batch_size", 512)
        return Mapped({"learner.target_update_freq": batch}, "0: a copy after every batch")
    return Mapped({"learner.target_update_freq": int(value)}, "counted in transitions trained")


def q_hiddens(ctx: Ctx) -> Outcome:
    """RLlib's Q-net hidden layers as apex_dask's ``dqn.hiddens``."""
    head = list(ctx.value("hiddens") or [])
    if ctx.image:
        if not head:
            return Refused("apex_dask puts at least one layer after the conv net; give hiddens")
        return Mapped({"dqn.hiddens": head}, "the layer(s) after the conv net")
    trunk = list(ctx.value("model.fcnet_hiddens") or [])
    trunk += list(ctx.value("model.post_fcnet_hiddens") or [])
    layers = trunk + head
    if not layers:
        return Refused("apex_dask's Q-net needs at least one hidden layer")
    return Mapped(
        {"dqn.hiddens": layers},
        f"model.fcnet_hiddens {trunk} then hiddens {head}, one shared stack "
        "(RLlib put the hiddens layers in each dueling stream)",
    )


def _hiddens(value: Any, ctx: Ctx) -> Outcome:
    return q_hiddens(ctx)


def _training_intensity(value: Any, ctx: Ctx) -> Outcome:
    if value is None:
        return Mapped(
            {"learner.min_replay_ratio": None, "learner.max_replay_ratio": None},
            "replay as fast as the learner goes (RLlib's execution-plan Ape-X)",
        )
    if not number(value) or value <= 0:
        return Refused("give a replay ratio > 0 (transitions trained per env step sampled)")
    note = (
        "transitions trained per env step sampled, held both ways as RLlib's round-robin "
        "(and 2.x's blocking learner queue) held it"
    )
    if ctx.era == "2022" and not float(value).is_integer():
        note += f"; RLlib 2.x replayed int({value:g}) batches per batch sampled"
    return Mapped(
        {"learner.min_replay_ratio": float(value), "learner.max_replay_ratio": float(value)}, note
    )


DQN_RULES = [
    rule(
        ("num_workers", "num_rollout_workers", "num_env_runners"), _workers, "workers.num_workers"
    ),
    rule(
        ("num_envs_per_worker", "num_envs_per_env_runner"),
        to("workers.envs_per_worker"),
        "workers.envs_per_worker",
        "envs one worker steps with one batched forward pass",
    ),
    rule(
        ("rollout_fragment_length", "sample_batch_size"),
        _fragment,
        "workers.rollout_fragment_length",
        "env steps of each env per rollout (RLlib's fragment, per env)",
    ),
    rule(
        ("optimizer.max_weight_sync_delay", "max_weight_sync_delay"),
        to("workers.max_weight_sync_delay"),
        "workers.max_weight_sync_delay",
        "env steps a worker makes before it takes new weights",
    ),
    rule(
        ("optimizer.num_replay_buffer_shards", "num_replay_buffer_shards"),
        to("replay.num_shards"),
        "replay.num_shards",
    ),
    rule(("train_batch_size",), to("learner.batch_size"), "learner.batch_size"),
    rule(
        ("replay_buffer_config.capacity", "buffer_size"),
        _capacity,
        "replay.capacity",
        "total over all shards, as RLlib split it evenly",
    ),
    rule(
        ("replay_buffer_config.prioritized_replay_alpha", "prioritized_replay_alpha"),
        _replay_number("replay.alpha"),
        "replay.alpha",
    ),
    rule(
        ("replay_buffer_config.prioritized_replay_beta", "prioritized_replay_beta"),
        _replay_number("replay.beta"),
        "replay.beta",
        "constant, as RLlib's Ape-X shards used it",
    ),
    rule(
        ("replay_buffer_config.prioritized_replay_eps", "prioritized_replay_eps"),
        _replay_number("replay.eps"),
        "replay.eps",
    ),
    rule(
        ("prioritized_replay", "replay_buffer_config.prioritized_replay"),
        lambda v, ctx: (
            Mapped({}, "deprecated placeholder") if v == DEPRECATED else _uniform(v, ctx)
        ),
        "(replay.alpha)",
        "false: uniform replay, i.e. replay.alpha 0",
    ),
    rule(
        ("replay_buffer_config.type",),
        _buffer_type,
        "(replay.alpha)",
        "prioritized types change nothing; `MultiAgentReplayBuffer` / `ReplayBuffer`: "
        "replay.alpha 0 (uniform); others refused",
    ),
    group(
        (
            "final_prioritized_replay_beta",
            "beta_annealing_fraction",
            "prioritized_replay_beta_annealing_timesteps",
        ),
        ignore(
            "RLlib's Ape-X replay shards kept prioritized_replay_beta constant; "
            "this only annealed DQN's local buffer"
        ),
        "ignored",
        "RLlib's Ape-X shards used a constant beta",
    ),
    rule(
        ("replay_buffer_config.worker_side_prioritization", "worker_side_prioritization"),
        noop(
            (True, DEPRECATED),
            "env workers compute initial priorities, as apex_dask's always do",
            "apex_dask's env workers always compute the initial priorities",
        ),
        "-",
        "true: what apex_dask does; false refused",
    ),
    rule(
        (
            "num_steps_sampled_before_learning_starts",
            "learning_starts",
            "replay_buffer_config.learning_starts",
        ),
        _learning_starts,
        "replay.learning_starts",
        "transitions stored over all shards before sampling starts",
    ),
    rule(
        ("replay_buffer_config.min_size_for_sampling",),
        _learning_starts,
        "replay.learning_starts",
        "per shard in RLlib: times the shard count",
    ),
    rule(("n_step",), to("learner.n_step"), "learner.n_step"),
    rule(("gamma",), to("learner.gamma"), "learner.gamma"),
    rule(
        ("lr",),
        lambda v, ctx: (
            Ignored("RLlib's DDPG trains with actor_lr and critic_lr")
            if ctx.ddpg
            else Mapped({"dqn.lr": v})
        ),
        "dqn.lr",
        "APEX_DDPG: ignored (actor_lr, critic_lr)",
    ),
    rule(
        ("adam_epsilon",),
        lambda v, ctx: (
            Ignored("RLlib's DDPG optimizers did not read it")
            if ctx.ddpg
            else Mapped({"learner.adam_eps": v})
        ),
        "learner.adam_eps",
        "APEX_DDPG: ignored",
    ),
    rule(
        ("grad_clip", "grad_norm_clipping"),
        _grad_clip,
        "learner.grad_clip",
        f"null (no clipping): {NO_CLIP:g}, a bound never reached",
    ),
    rule(
        ("target_network_update_freq",),
        _target_freq,
        "learner.target_update_freq",
        "transitions trained between target copies, as RLlib's Ape-X counted them; "
        "APEX_DDPG: see tau",
    ),
    rule(
        ("hiddens",),
        _hiddens,
        "dqn.hiddens",
        "vector observations: model.fcnet_hiddens + post_fcnet_hiddens + hiddens as one "
        "stack; Atari: hiddens after the conv net",
        APEX,
    ),
    rule(("dueling",), to("dqn.dueling"), "dqn.dueling", "", APEX),
    rule(("double_q",), to("dqn.double_q"), "dqn.double_q", "", APEX),
    rule(
        ("training_intensity",),
        _training_intensity,
        "learner.min_replay_ratio, learner.max_replay_ratio",
        "a replay ratio (transitions trained per env step sampled), held both ways as RLlib "
        "held it; null: unbounded. RLlib 2.x's default 1 applies to 2022-era files",
    ),
]
