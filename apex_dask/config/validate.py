"""Checks of a whole :class:`~apex_dask.config.ApexConfig`, run when one is built.

First every field's type, walking the dataclass tree (so a config built in
Python, ``ApexConfig(seed="x")``, fails like a YAML one: one ``ConfigError``
naming the field); every number must be finite. Then the ranges and the
relations between fields.
"""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from typing import Any

from apex_dask.algo.agents.registry import UnknownAgentError, agent
from apex_dask.config.plumbing import ConfigError
from apex_dask.config.reader import shown
from apex_dask.config.sections import GRACE_MAX_S

__all__ = ["check_types", "validate"]

_DEVICE = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")


def _type_error(name: str, value: Any, tp: Any) -> str | None:
    """Why ``value`` does not fit the annotation ``tp`` (None: it fits)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        if value is None and type(None) in args:
            return None
        return _type_error(name, value, next(a for a in args if a is not type(None)))
    if tp is bool:
        return None if isinstance(value, bool) else "must be true or false"
    if tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        return None if ok else "must be an integer"
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return "must be a number"
        try:
            finite = math.isfinite(value)
        except OverflowError:
            finite = False
        return None if finite else "must be a finite number"
    if tp is str:
        return None if isinstance(value, str) else "must be a string"
    if origin is tuple:
        if not isinstance(value, tuple | list):
            return "must be a tuple of integers, e.g. (256, 256)"
        return next((e for v in value if (e := _type_error(name, v, args[0]))), None)
    if tp is dict or origin is dict:
        if not isinstance(value, dict):
            return "must be a mapping"
        return next(
            (f"key {shown(k)} must be a string" for k in value if not isinstance(k, str)), None
        )
    return None


def check_types(node: Any, prefix: str = "") -> None:
    """Raise a :class:`ConfigError` for the first field of the tree ``node`` whose value
    does not fit its annotation (a section that is not its dataclass included)."""
    hints = typing.get_type_hints(type(node))
    for f in dataclasses.fields(node):
        name, tp, value = f"{prefix}{f.name}", hints[f.name], getattr(node, f.name)
        if dataclasses.is_dataclass(tp):
            if not isinstance(value, tp):
                raise ConfigError(f"{name} must be a {tp.__name__} section, got {shown(value)}")
            check_types(value, name + ".")
            continue
        why = _type_error(name, value, tp)
        if why is not None:
            raise ConfigError(f"{name}={shown(value)} is invalid: {why}")


def validate(cfg: Any) -> None:
    """Raise one :class:`ConfigError` naming the first invalid field of ``cfg``."""
    check_types(cfg)
    r, lr, w = cfg.replay, cfg.learner, cfg.workers

    def bad(name: str, value: Any, allowed: str) -> ConfigError:
        return ConfigError(f"{name}={shown(value)} is invalid: {allowed}")

    def positive(name: str, value: Any) -> None:
        if value is None or not value > 0:
            raise bad(name, value, "must be > 0")

    def nonneg(name: str, value: Any) -> None:
        if value is None or not value >= 0:
            raise bad(name, value, "must be >= 0")

    def unit(name: str, value: float, lo_open: bool = False) -> None:
        ok = (0 < value <= 1) if lo_open else (0 <= value <= 1)
        if not ok or math.isnan(value):
            raise bad(name, value, "must be in " + ("(0, 1]" if lo_open else "[0, 1]"))

    if not cfg.env.env_id or not isinstance(cfg.env.env_id, str):
        raise bad("env.env_id", cfg.env.env_id, "must be a gymnasium env id such as 'CartPole-v1'")
    positive("replay.capacity", r.capacity)
    positive("replay.num_shards", r.num_shards)
    if r.capacity < r.num_shards:
        raise bad("replay.capacity", r.capacity, f"must be >= replay.num_shards ({r.num_shards})")
    unit("replay.alpha", r.alpha)
    unit("replay.beta", r.beta)
    positive("replay.eps", r.eps)
    nonneg("replay.learning_starts", r.learning_starts)
    if r.frame_stack is not None and not (isinstance(r.frame_stack, int) and r.frame_stack >= 2):
        raise bad("replay.frame_stack", r.frame_stack, "must be an integer >= 2, or null (off)")
    if r.placement not in ("learner_process", "learner_host", "spread"):
        raise bad(
            "replay.placement", r.placement, "must be learner_process, learner_host or spread"
        )
    if r.learning_starts > r.capacity:
        raise bad(
            "replay.learning_starts",
            r.learning_starts,
            f"must be <= replay.capacity ({r.capacity})",
        )
    positive("learner.batch_size", lr.batch_size)
    if lr.batch_size > r.shard_capacity:
        raise bad(
            "learner.batch_size",
            lr.batch_size,
            f"must be <= one shard's capacity (replay.capacity / replay.num_shards = {r.shard_capacity})",
        )
    positive("learner.adam_eps", lr.adam_eps)
    positive("learner.grad_clip", lr.grad_clip)
    unit("learner.gamma", lr.gamma, lo_open=True)
    positive("learner.n_step", lr.n_step)
    positive("learner.target_update_freq", lr.target_update_freq)
    positive("learner.inqueue_size", lr.inqueue_size)
    positive("learner.prefetch_per_shard", lr.prefetch_per_shard)
    if lr.max_replay_ratio is not None:
        positive("learner.max_replay_ratio", lr.max_replay_ratio)
    if lr.min_replay_ratio is not None:
        positive("learner.min_replay_ratio", lr.min_replay_ratio)
        if lr.max_replay_ratio is not None and lr.min_replay_ratio > lr.max_replay_ratio:
            raise bad(
                "learner.min_replay_ratio",
                lr.min_replay_ratio,
                f"must be <= learner.max_replay_ratio ({lr.max_replay_ratio}); "
                "lower it or unset it with learner.min_replay_ratio=null",
            )
    if not _DEVICE.match(lr.device):
        raise bad("learner.device", lr.device, "must be 'auto', 'cpu', 'cuda' or 'cuda:N'")
    positive("learner.num_threads", lr.num_threads)
    hook = lr.before_learn_on_batch
    if hook is not None:
        module, _, attr = hook.partition(":")
        if not (module and attr) or not all(p.isidentifier() for p in module.split(".")):
            raise bad(
                "learner.before_learn_on_batch",
                hook,
                "must be an import path 'package.module:function' (or null for none)",
            )
    positive("workers.num_workers", w.num_workers)
    positive("workers.per_process", w.per_process)
    positive("workers.rollout_fragment_length", w.rollout_fragment_length)
    nonneg("workers.max_weight_sync_delay", w.max_weight_sync_delay)
    unit("workers.epsilon_base", w.epsilon_base, lo_open=True)
    nonneg("workers.epsilon_alpha", w.epsilon_alpha)
    positive("workers.rollouts_in_flight", w.rollouts_in_flight)
    positive("workers.rollouts_per_call", w.rollouts_per_call)
    positive("workers.envs_per_worker", w.envs_per_worker)
    if w.vector_mode not in ("native", "sync"):
        raise bad("workers.vector_mode", w.vector_mode, "must be native or sync")
    positive("workers.max_env_errors_per_1k_steps", w.max_env_errors_per_1k_steps)
    positive("workers.max_consecutive_env_errors", w.max_consecutive_env_errors)
    positive("env.make_timeout_s", cfg.env.make_timeout_s)
    if cfg.env.step_timeout_s is not None:
        positive("env.step_timeout_s", cfg.env.step_timeout_s)
    nonneg("eval.interval_s", cfg.eval.interval_s)
    nonneg("eval.episodes", cfg.eval.episodes)
    if cfg.eval.max_episode_steps is not None:
        positive("eval.max_episode_steps", cfg.eval.max_episode_steps)
    positive("eval.timeout_s", cfg.eval.timeout_s)
    unit("env.repeat_action_probability", cfg.env.repeat_action_probability)
    nonneg("report.min_iter_time_s", cfg.report.min_iter_time_s)
    nonneg("report.timesteps_per_iteration", cfg.report.timesteps_per_iteration)
    if cfg.simulate.env_steps_per_s is not None:
        positive("simulate.env_steps_per_s", cfg.simulate.env_steps_per_s)
    nonneg("checkpoint.interval_s", cfg.checkpoint.interval_s)
    positive("checkpoint.keep", cfg.checkpoint.keep)
    positive("checkpoint.grace_s", cfg.checkpoint.grace_s)
    if cfg.checkpoint.grace_s > GRACE_MAX_S:
        raise bad(
            "checkpoint.grace_s",
            cfg.checkpoint.grace_s,
            f"must be at most {GRACE_MAX_S:,.0f} s (a week), the longest the stop's "
            "watchdog timer holds",
        )
    if cfg.topology.local_workers is not None:
        positive("topology.local_workers", cfg.topology.local_workers)
    positive("topology.call_timeout_s", cfg.topology.call_timeout_s)
    nonneg("topology.weight_relay_max_age_s", cfg.topology.weight_relay_max_age_s)
    for name in ("timesteps", "time_s", "iterations"):
        value = getattr(cfg.stop, name)
        if value is not None:
            positive(f"stop.{name}", value)
    if cfg.stop.eval_return is not None and cfg.eval.episodes <= 0:
        raise bad(
            "stop.eval_return",
            cfg.stop.eval_return,
            "needs the greedy evaluation (eval.episodes > 0); set eval.episodes or stop on "
            "the training episodes with stop.train_return",
        )
    nonneg("seed", cfg.seed)
    try:
        builder = agent(cfg.algo)
    except UnknownAgentError as exc:
        raise bad("algo", cfg.algo, str(exc)) from None
    if type(cfg.agent) is not builder.config:
        raise ConfigError(
            f"the {cfg.algo} section must be a {builder.config.__name__} (the {cfg.algo} "
            f"agent's config), got {type(cfg.agent).__name__}"
        )
    check_types(cfg.agent, f"{cfg.algo}.")
    problem = cfg.agent.check()  # the agent's own section, checked by the agent
    if problem is not None:
        key, value, why = problem
        raise bad(f"{cfg.algo}.{key}", value, why)
    problem = builder.check_config(cfg)  # shared settings the agent cannot run with
    if problem is not None:
        raise bad(*problem)
