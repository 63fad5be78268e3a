"""RLlib keys of the value head, exploration and resources (``run: APEX``, and those
APEX_DDPG shares).

* The value head: ``num_atoms`` > 1 is the C51 head (``dqn.num_atoms`` over
  ``dqn.v_min``..``dqn.v_max``), ``noisy`` noisy nets (``dqn.noisy``,
  ``dqn.sigma0``). RLlib kept its per-worker epsilons on top of noisy layers, so a
  converted ``noisy: true`` keeps them too (``workers.epsilon_with_noisy``). At their
  no-op values (``num_atoms: 1``, ``noisy: false``) they, ``v_min``, ``v_max`` and
  ``sigma0`` change nothing.
* Exploration: RLlib's Ape-X gave worker i of N (0-based) a constant epsilon
  0.4^(1 + 7 i/(N-1)) (``PerWorkerEpsilonGreedy``, using ``worker_index - 1``; the 2018
  ``per_worker_exploration`` with the 0-based index): apex_dask's ladder with
  ``workers.epsilon_base`` 0.4 and ``workers.epsilon_alpha`` 7. Its schedule keys
  (``initial_epsilon``, ``exploration_fraction``, ...) only mattered with 0 workers.
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
)

__all__ = ["EXPLORE_RULES", "epsilon_ladder"]

APEX = ("APEX",)


_PER_WORKER_WHY = (
    "with per-worker exploration RLlib gave each worker a constant epsilon and used this "
    "only with 0 workers or per_worker_exploration: false"
)


def _atoms(ctx: Ctx) -> Any:
    return ctx.value("num_atoms", 1) or 1


def _num_atoms(value: Any, ctx: Ctx) -> Outcome:
    n = value or 1
    if not integer(n) or n < 1:
        return Refused("give a whole number of atoms (1: no distributional head)")
    if n == 1:
        return Mapped({}, "no distributional head")
    return Mapped({"dqn.num_atoms": int(n)}, "the C51 head")


def _value_head(what: str):
    def handle(value: Any, ctx: Ctx) -> Outcome:
        n = _atoms(ctx)
        if number(n) and n > 1:
            if not number(value):
                return Refused(f"give a number for {what}")
            return Mapped({f"dqn.{what}": float(value)}, "the C51 support's end")
        return Mapped({}, f"{what} has no effect with num_atoms: 1")

    return handle


def _noisy(value: Any, ctx: Ctx) -> Outcome:
    if not isinstance(value, bool):
        return Refused("give true or false")
    if not value:
        return Mapped({}, "no noisy nets")
    return Mapped(
        {"dqn.noisy": True, "workers.epsilon_with_noisy": True},
        "noisy layers; RLlib kept the per-worker epsilons on top, and so does this",
    )


def _sigma0(value: Any, ctx: Ctx) -> Outcome:
    if ctx.value("noisy", False) is True:
        if not number(value) or value <= 0:
            return Refused("give a positive sigma0")
        return Mapped({"dqn.sigma0": float(value)})
    return Mapped({}, "no effect with noisy: false")


def epsilon_ladder(ctx: Ctx) -> Outcome:
    return Mapped(
        {"workers.epsilon_base": 0.4, "workers.epsilon_alpha": 7.0},
        "eps_i = 0.4^(1 + 7 i/(N-1)) for worker i = 0..N-1, RLlib's per-worker epsilons",
    )


def _exploration_type(value: Any, ctx: Ctx) -> Outcome:
    if ctx.ddpg:
        from apex_dask.config.rllib.rules_ddpg import ddpg_noise

        return ddpg_noise(ctx)
    kind = str(value or "PerWorkerEpsilonGreedy").rsplit(".", 1)[-1]
    if kind == "PerWorkerEpsilonGreedy":
        return epsilon_ladder(ctx)
    return Refused(
        "Ape-X explores with constant per-worker epsilons (PerWorkerEpsilonGreedy); "
        "an annealed or other exploration is not available"
    )


def _per_worker(value: Any, ctx: Ctx) -> Outcome:
    if value is False:
        return Refused(
            "Ape-X explores with constant per-worker epsilons; a schedule is not available"
        )
    if ctx.ddpg:
        from apex_dask.config.rllib.rules_ddpg import ddpg_noise

        return ddpg_noise(ctx)
    return epsilon_ladder(ctx)


def _gpus(value: Any, ctx: Ctx) -> Outcome:
    n = 1 if value is True else (0 if value is False else value)
    if not number(n) or n < 0:
        return Refused("give a number of GPUs")
    if n == 0:
        return Mapped({"learner.device": "cpu"}, "the learner on the CPU")
    if ctx.value("_fake_gpus") is True:
        return Mapped(
            {"learner.device": "cpu"},
            "_fake_gpus: RLlib's learner ran on the CPU, each batch split over simulated "
            "towers (the same update)",
        )
    if n > 1:
        return Refused("apex_dask's learner uses one GPU (as RLlib's Ape-X, which refused > 1)")
    return Mapped({"learner.device": "cuda"}, "--set learner.device=auto falls back to the CPU")


def _seed(value: Any, ctx: Ctx) -> Outcome:
    if value is None:
        return Mapped({}, "apex_dask seeds every run: seed 0")
    return Mapped({"seed": value})


def _clip_rewards(value: Any, ctx: Ctx) -> Outcome:
    if value is None or isinstance(value, bool):
        return Mapped(
            {"env.clip_rewards": value}, "null: on for Atari ids" if value is None else ""
        )
    return Refused("apex_dask clips training rewards to their sign (true) or not at all (false)")


EXPLORE_RULES = [
    rule(
        ("num_atoms",),
        _num_atoms,
        "dqn.num_atoms",
        "1: nothing; > 1: the C51 head",
        APEX,
    ),
    rule(("v_min",), _value_head("v_min"), "dqn.v_min", "with num_atoms > 1", APEX),
    rule(("v_max",), _value_head("v_max"), "dqn.v_max", "with num_atoms > 1", APEX),
    rule(
        ("noisy",),
        _noisy,
        "dqn.noisy",
        "true: noisy nets, epsilons kept (workers.epsilon_with_noisy)",
        APEX,
    ),
    rule(("sigma0",), _sigma0, "dqn.sigma0", "with noisy: true", APEX),
    rule(
        ("parameter_noise",),
        noop((False,), "no parameter noise", "parameter-space noise is not available"),
        "-",
        "false: nothing; true refused",
    ),
    rule(
        ("soft_q",),
        noop((False,), "", "Ape-X explores epsilon-greedily; soft-Q is not available"),
        "-",
        "false: nothing; true refused",
        APEX,
    ),
    rule(
        ("softmax_temp",),
        lambda v, ctx: Ignored("used only with soft_q: true"),
        "ignored",
        "soft-Q only",
        APEX,
    ),
    rule(
        ("exploration_config.type",),
        _exploration_type,
        "workers.epsilon_base, epsilon_alpha (APEX_DDPG: dpg.noise*)",
        "`PerWorkerEpsilonGreedy`: eps_i = 0.4^(1 + 7 i/(N-1)), apex_dask's ladder; "
        "APEX_DDPG: see the DDPG rows; others refused",
    ),
    group(
        (
            "exploration_config.initial_epsilon",
            "exploration_config.final_epsilon",
            "exploration_config.epsilon_timesteps",
            "exploration_config.warmup_timesteps",
            "exploration_config.epsilon_schedule",
        ),
        ignore(
            "PerWorkerEpsilonGreedy gives each worker a constant epsilon; RLlib used this "
            "only with num_workers: 0"
        ),
        "ignored",
        "unused by RLlib's per-worker epsilons",
        APEX,
    ),
    rule(
        ("per_worker_exploration",),
        _per_worker,
        "workers.epsilon_base, epsilon_alpha (APEX_DDPG: dpg.noise*)",
        "true: the per-worker ladder; false (a schedule) refused",
    ),
    group(
        (
            "schedule_max_timesteps",
            "exploration_fraction",
            "exploration_final_eps",
            "exploration_initial_eps",
            "exploration_final_scale",
        ),
        ignore(_PER_WORKER_WHY),
        "ignored",
        "unused with per-worker exploration",
    ),
    rule(("num_gpus", "gpu"), _gpus, "learner.device", "0: cpu; up to 1: cuda; > 1 refused"),
    rule(("seed",), _seed, "seed", "null: seed 0"),
    rule(("clip_rewards",), _clip_rewards, "env.clip_rewards", "null: on for Atari ids"),
    rule(
        ("td_error_loss_fn",),
        noop(("huber",), "the Huber loss, apex_dask's", "apex_dask's DQN loss is the Huber loss"),
        "-",
        "huber: nothing; mse refused",
        APEX,
    ),
    rule(
        ("categorical_distribution_temperature",),
        ignore("the temperature of a sampled (soft-Q) action; Ape-X acts epsilon-greedily"),
        "ignored",
        "",
        APEX,
    ),
    rule(
        ("grad_clip_by",),
        noop(
            ("global_norm", None),
            "the global gradient norm, as apex_dask clips",
            "apex_dask clips the global gradient norm",
        ),
        "-",
        "global_norm: nothing",
    ),
    rule(
        ("store_buffer_in_checkpoints",),
        ignore("apex_dask's checkpoints always hold the replay shards"),
        "ignored",
        "",
    ),
]
