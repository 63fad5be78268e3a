"""Keys about the run rather than the algorithm: ``stop:``, Tune's experiment keys,
evaluation, iteration length, and Ray's own machinery (ignored, with the reason).

What RLlib counted: a timestep is one env step of one env (an agent step: 4
Atari frames behind RLlib's deepmind wrappers, as apex_dask's pipeline), so
``timesteps_total`` is apex_dask's ``stop.timesteps`` (env steps sampled).
``episode_reward_mean`` was the mean return of the training episodes of the
least-exploring third of the workers: apex_dask's ``stop.train_return`` compares
that same third's episodes of each iteration (``env/episode_return_mean``),
with evaluation on or off. ``evaluation/episode_reward_mean`` is the greedy
evaluation's mean return: ``stop.eval_return``.
"""

from __future__ import annotations

from typing import Any

from apex_dask.config.rllib.rules import (
    Ctx,
    Ignored,
    Mapped,
    Outcome,
    Refused,
    ignore,
    integer,
    noop,
    number,
    rule,
    to,
)

__all__ = ["RUN_RULES", "eval_on"]

_TRAIN_REWARD = (
    "stop.episode_reward_mean",
    "stop.sampler_results/episode_reward_mean",
    "stop.env_runners/episode_return_mean",
    "stop.env_runner_results/episode_return_mean",
)
_EVAL_REWARD = (
    "stop.evaluation/episode_reward_mean",
    "stop.evaluation/sampler_results/episode_reward_mean",
    "stop.evaluation/env_runners/episode_return_mean",
)
_STEPS = (
    "stop.timesteps_total",
    "stop.num_env_steps_sampled",
    "stop.num_agent_steps_sampled",
    "stop.agent_timesteps_total",
    "stop.info/num_steps_sampled",
    "stop.num_env_steps_sampled_lifetime",
)


def eval_on(ctx: Ctx) -> bool:
    return bool(ctx.value("evaluation_interval"))


def _reward(value: Any, ctx: Ctx) -> Outcome:
    if not number(value):
        return Refused(f"give a number, not {_shown(value)}")
    return Mapped(
        {"stop.train_return": float(value)},
        "compared with each iteration's env/episode_return_mean: the training episodes the "
        "least-exploring third of workers finished (RLlib averaged their last 100)",
    )


def _eval_reward(value: Any, ctx: Ctx) -> Outcome:
    if not number(value):
        return Refused(f"give a number, not {_shown(value)}")
    if not eval_on(ctx):
        return Refused(
            "evaluation is off (no evaluation_interval), so RLlib never reported it; "
            "set evaluation_interval or stop on episode_reward_mean"
        )
    return Mapped({"stop.eval_return": float(value)}, "the greedy evaluation's mean return")


def _shown(value: Any) -> str:
    from apex_dask.config.reader import shown

    return shown(value)


def _count(key: str, note: str = ""):
    def handle(value: Any, ctx: Ctx) -> Outcome:
        if not integer(value) or value < 1:
            return Refused(f"give a whole number >= 1, not {_shown(value)}")
        return Mapped({key: int(value)}, note)

    return handle


def _steps(value: Any, ctx: Ctx) -> Outcome:
    note = "env steps sampled, as RLlib counted them"
    return _count("stop.timesteps", note + (": 4 frames each" if ctx.image else ""))(value, ctx)


def _seconds(key: str, none_is: float | None = None):
    def handle(value: Any, ctx: Ctx) -> Outcome:
        if value is None and none_is is not None:
            return Mapped({key: none_is})
        if not number(value) or value < 0:
            return Refused("give a number of seconds >= 0")
        return Mapped({key: float(value)})

    return handle


def _iter_seconds(ctx: Ctx) -> float:
    return float(ctx.value("min_time_s_per_iteration") or 0.0)


def _eval_interval(value: Any, ctx: Ctx) -> Outcome:
    if not value:
        return Mapped({"eval.episodes": 0}, "no evaluation, as RLlib's default")
    if not integer(value) or value < 1:
        return Refused("give a number of iterations")
    episodes = ctx.value("evaluation_duration", 10)
    if not integer(episodes) or episodes < 1:
        return Refused("evaluation_duration must be a number of episodes")
    seconds = 0.0 if value == 1 else int(value) * _iter_seconds(ctx)
    return Mapped(
        {"eval.episodes": int(episodes), "eval.interval_s": seconds},
        "every iteration"
        if value == 1
        else f"every {int(value)} iterations of at least min_time_s_per_iteration: {seconds:g} s",
    )


def _eval_episodes(value: Any, ctx: Ctx) -> Outcome:
    if not eval_on(ctx):
        return Ignored("evaluation is off (no evaluation_interval)")
    if not integer(value) or value < 1:
        return Refused("apex_dask evaluates a number of whole episodes")
    return _eval_interval(ctx.value("evaluation_interval"), ctx)


def _eval_config(value: Any, ctx: Ctx) -> Outcome:
    if not value:
        return Mapped({}, "none")
    if not isinstance(value, dict):
        return Refused("must be a mapping")
    other = sorted(k for k, v in value.items() if not (k == "explore" and v is False))
    if other:
        return Refused(
            f"apex_dask evaluates the training env with greedy actions; {', '.join(other)} "
            "cannot differ there"
        )
    return Mapped({}, "apex_dask's evaluation is greedy")


def _checkpoint_freq(value: Any, ctx: Ctx) -> Outcome:
    if not integer(value) or value < 0:
        return Refused("give a number of iterations")
    seconds = int(value) * _iter_seconds(ctx)
    if value == 0:
        return Mapped({"checkpoint.interval_s": 0.0}, "no periodic checkpoints")
    if seconds <= 0:
        return Refused(
            "apex_dask spaces checkpoints by seconds; with min_time_s_per_iteration 0 an "
            "iteration has no length to convert"
        )
    return Mapped(
        {"checkpoint.interval_s": seconds},
        f"every {int(value)} iterations of at least min_time_s_per_iteration",
    )


def _per_iteration(value: Any, ctx: Ctx) -> Outcome:
    if not value:
        return Mapped({"report.timesteps_per_iteration": 0})
    if not integer(value) or value < 0:
        return Refused(f"give a whole number of env steps, not {_shown(value)}")
    return Mapped({"report.timesteps_per_iteration": int(value)})


def _keep(value: Any, ctx: Ctx) -> Outcome:
    if not value:
        return Mapped({}, "apex_dask keeps checkpoint.keep")
    if not integer(value) or value < 1:
        return Refused(f"give a whole number of checkpoints, not {_shown(value)}")
    return Mapped({"checkpoint.keep": int(value)})


def _num_samples(value: Any, ctx: Ctx) -> Outcome:
    if not integer(value) or value < 1:
        return Refused("give a number of trials >= 1")
    if value == 1:
        return Mapped({}, "one trial")
    return Mapped({}, f"{int(value)} trials per grid point: apex-dask-sweep --from-rllib runs them")


RUN_RULES = [
    rule(
        _TRAIN_REWARD,
        _reward,
        "stop.train_return",
        "compared with each iteration's env/episode_return_mean (the least-exploring third's "
        "training episodes), with evaluation on or off",
    ),
    rule(
        _EVAL_REWARD,
        _eval_reward,
        "stop.eval_return",
        "the greedy evaluation's mean return (needs evaluation_interval)",
    ),
    rule(
        _STEPS,
        _steps,
        "stop.timesteps",
        "env steps sampled (an Atari step is 4 frames, as RLlib's)",
    ),
    rule(("stop.time_total_s",), _seconds("stop.time_s"), "stop.time_s", "wall-clock seconds"),
    rule(
        ("stop.training_iteration",),
        _count("stop.iterations"),
        "stop.iterations",
        "iterations of at least min_time_s_per_iteration and min_sample_timesteps_per_iteration",
    ),
    rule(
        ("stop.*",),
        lambda v, ctx: Refused(
            "apex_dask stops on the training or evaluation return mean, env steps, wall time "
            "or iterations"
        ),
        "-",
        "other stop keys refused",
    ),
    rule(
        (
            "min_sample_timesteps_per_iteration",
            "timesteps_per_iteration",
            "min_sample_timesteps_per_reporting",
        ),
        _per_iteration,
        "report.timesteps_per_iteration",
        "env steps sampled per iteration, at least",
    ),
    rule(
        ("min_time_s_per_iteration", "min_iter_time_s", "min_time_s_per_reporting"),
        _seconds("report.min_iter_time_s", 0.0),
        "report.min_iter_time_s",
        "an iteration lasts at least this long",
    ),
    rule(
        ("min_train_timesteps_per_iteration", "min_train_timesteps_per_reporting"),
        noop((0, None), "", "apex_dask has no minimum of trained steps per iteration"),
        "-",
        "0: nothing",
    ),
    rule(
        ("metrics_num_episodes_for_smoothing", "metrics_smoothing_episodes"),
        ignore("apex_dask's episode means are over each iteration's episodes"),
        "ignored",
        "",
    ),
    rule(
        ("evaluation_interval",),
        _eval_interval,
        "eval.episodes, eval.interval_s",
        "null: no evaluation (eval.episodes 0); 1: every iteration; N: N x "
        "min_time_s_per_iteration seconds",
    ),
    rule(("evaluation_duration", "evaluation_num_episodes"), _eval_episodes, "eval.episodes", ""),
    rule(
        ("evaluation_duration_unit",),
        noop(("episodes",), "", "apex_dask evaluates whole episodes"),
        "-",
        "episodes: nothing",
    ),
    rule(
        ("evaluation_config",),
        _eval_config,
        "-",
        "`{explore: false}`: nothing (greedy); other keys refused",
    ),
    rule(
        ("custom_eval_function",),
        noop((None,), "", "custom evaluation functions do not run in apex_dask"),
        "-",
        "null: nothing",
    ),
    rule(
        ("num_samples",),
        _num_samples,
        "apex-dask-sweep trials",
        "N > 1: N trials per grid point (a grid over seed when nothing else varies)",
    ),
    rule(
        ("checkpoint_freq",),
        _checkpoint_freq,
        "checkpoint.interval_s",
        "N iterations x min_time_s_per_iteration seconds",
    ),
    rule(
        ("checkpoint_at_end",),
        lambda v, ctx: Mapped({}, "apex_dask always checkpoints at the end of a run with --out"),
        "-",
        "",
    ),
    rule(
        ("keep_checkpoints_num",),
        _keep,
        "checkpoint.keep",
        "",
    ),
    rule(
        ("max_failures",),
        ignore(
            "apex_dask replaces lost env workers and rebuilds lost "
            "shards itself; --resume continues a stopped run"
        ),
        "ignored",
        "",
    ),
    rule(
        ("restore",),
        lambda v, ctx: (
            Mapped({}, "none")
            if not v
            else Refused("an RLlib checkpoint cannot be loaded; apex_dask starts afresh")
        ),
        "-",
        "refused",
    ),
    rule(("time_budget_s",), _seconds("stop.time_s"), "stop.time_s", ""),
    rule(
        ("evaluation_sample_timeout_s",),
        to("eval.timeout_s"),
        "eval.timeout_s",
        "the bound of one evaluation",
    ),
]
