"""RLlib keys of Ape-X DDPG (``run: APEX_DDPG``): the actor, the critic, TD3's options,
the targets and the per-worker exploration noise.

Two conversions here turn RLlib's numbers into apex_dask's meaning:

* **Noise.** RLlib's worker w of N (``PerWorkerOrnsteinUhlenbeckNoise`` /
  ``PerWorkerGaussianNoise``, 2020 on) scaled its noise by 0.4^(1 + 7 w/(N-1)) with
  the 1-based worker index w = i + 1 (the 2018 ``per_worker_exploration`` used the
  0-based i). Its OU noise was ``scale * ou_base_scale * X * (high - low)`` with
  X_{t+1} = (1 - theta) X_t + sigma N(0, 1), of stationary std
  sigma / sqrt(1 - (1 - theta)^2); its Gaussian noise ``scale * N(0, stddev)`` in action
  units. apex_dask's worker i adds noise of std base^(1 + alpha i/(N-1)) half ranges
  (``dpg.noise_base``, ``dpg.noise_alpha``; OU with unit stationary std). With c the
  per-unit-scale std in half ranges (OU: 2 ou_base_scale sigma / sqrt(1 - (1-theta)^2);
  Gaussian: stddev / half range) RLlib's ladder c 0.4^(1 + 7 (i + o)/(N-1)) is exactly
  apex_dask's with base = c 0.4^(1 + 7 o/(N-1)) and alpha = 7 ln 0.4 / ln base.
* **Targets.** RLlib moved the targets by ``tau`` once every
  ``target_network_update_freq`` transitions trained. apex_dask moves them softly by
  ``dpg.tau`` after every actor update, or copies them every
  ``learner.target_update_freq`` transitions with ``tau: 1``: the two agree when
  RLlib's period is at most one batch, or ``tau`` is 1; a soft update every many
  batches is refused.
"""

from __future__ import annotations

import math
from typing import Any

from apex_dask.config.reader import shown
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

__all__ = ["DDPG_RULES", "ddpg_noise", "ddpg_targets"]

DDPG = ("APEX_DDPG",)
_OLD_KEYS = (
    "exploration_noise_type",
    "exploration_ou_noise_scale",
    "exploration_ou_sigma",
    "exploration_ou_theta",
    "exploration_gaussian_sigma",
    "per_worker_exploration",
    "noise_scale",
)
_KINDS = {"PerWorkerOrnsteinUhlenbeckNoise": "ou", "PerWorkerGaussianNoise": "gaussian"}


def _sig(x: float) -> float:
    return float(f"{x:.6g}")


def _old_style(ctx: Ctx) -> bool:
    """The 2018-2019 exploration keys (0-based worker index), not exploration_config."""
    if any(ctx.has(k) for k in ("exploration_config.type", "exploration_config.ou_base_scale")):
        return False
    return any(ctx.has(k) for k in _OLD_KEYS) or ctx.era == "2018"


def ddpg_noise(ctx: Ctx) -> Outcome:
    """RLlib's per-worker noise as apex_dask's ladder (module docstring)."""
    if _old_style(ctx):
        offset = 0
        kind = ctx.value("exploration_noise_type", "ou")
        name = "per_worker_exploration"
        if ctx.value("per_worker_exploration", True) is False:
            return Refused(
                "Ape-X explores with constant per-worker noise; a schedule is not available"
            )
        base_scale = ctx.value("exploration_ou_noise_scale", ctx.value("noise_scale", 0.1))
        sigma = ctx.value("exploration_ou_sigma", 0.2)
        theta = ctx.value("exploration_ou_theta", 0.15)
        stddev = ctx.value("exploration_gaussian_sigma", 0.1)
    else:
        offset = 1
        name = str(ctx.value("exploration_config.type") or "PerWorkerOrnsteinUhlenbeckNoise")
        name = name.rsplit(".", 1)[-1]
        if name not in _KINDS:
            return Refused(
                "Ape-X explores with constant per-worker noise (PerWorkerOrnsteinUhlenbeckNoise "
                "or PerWorkerGaussianNoise); an annealed or other exploration is not available"
            )
        kind = _KINDS[name]
        base_scale = ctx.value("exploration_config.ou_base_scale", 0.1)
        sigma = ctx.value("exploration_config.ou_sigma", 0.2)
        theta = ctx.value("exploration_config.ou_theta", 0.15)
        stddev = ctx.value("exploration_config.stddev", 0.1)
    if kind not in ("ou", "gaussian"):
        return Refused("exploration noise must be ou or gaussian")
    if not all(number(v) for v in (base_scale, sigma, theta, stddev)) or not 0 < theta <= 1:
        return Refused("noise scales must be numbers and ou_theta in (0, 1]")
    if kind == "ou":
        c = 2.0 * base_scale * sigma / math.sqrt(1.0 - (1.0 - theta) ** 2)
        unit = f"2 x {base_scale:g} x {sigma:g}/sqrt(1-(1-{theta:g})^2)"
    else:
        if ctx.action_half_range is None:
            return Refused(
                "Gaussian noise in action units needs the env's action bounds, equal in every "
                "dimension (apex_dask's noise is in half ranges)"
            )
        c = stddev / ctx.action_half_range
        unit = f"{stddev:g}/{ctx.action_half_range:g}"
    n = ctx.value("num_workers", 32) or 1
    if not integer(n) or n < 1:
        return Refused(f"num_workers must be a whole number >= 1, not {shown(n)}")
    n = int(n)
    top = c * 0.4 ** (1.0 + 7.0 * offset / max(n - 1, 1))
    if not 0.0 < top < 1.0:
        return Refused(f"the noise of worker 0 would be {top:.3g} half ranges; it must be below 1")
    alpha = 7.0 * math.log(0.4) / math.log(top) if n > 1 else 7.0
    targets: dict[str, Any] = {
        "dpg.noise": kind,
        "dpg.noise_base": _sig(top),
        "dpg.noise_alpha": _sig(alpha),
    }
    if kind == "ou":
        targets["dpg.ou_theta"] = float(theta)
    index = "i+1" if offset else "i"
    return Mapped(
        targets,
        f"RLlib's worker i of {n} ({name}): std {unit} x 0.4^(1+7({index})/(N-1)) half ranges, "
        f"which is base^(1 + alpha i/(N-1)) with base {_sig(top):g}, alpha {_sig(alpha):g}",
    )


def ddpg_targets(ctx: Ctx) -> Outcome:
    """RLlib's (tau, target_network_update_freq) as apex_dask's (module docstring)."""
    tau = ctx.value("tau", 0.002)
    freq = ctx.value("target_network_update_freq", 500_000) or 0
    batch = ctx.value("train_batch_size", 512)
    if not number(tau) or not 0 < tau <= 1:
        return Refused("tau must be in (0, 1]")
    for name, value in (("target_network_update_freq", freq), ("train_batch_size", batch)):
        if not integer(value) or value < 0:
            return Refused(f"{name} must be a whole number of transitions, not {shown(value)}")
    if tau == 1:
        period = int(freq) if freq else int(batch)
        return Mapped(
            {"dpg.tau": 1.0, "learner.target_update_freq": period},
            f"a copy every {period} transitions trained",
        )
    if freq <= batch:
        return Mapped(
            {"dpg.tau": float(tau)},
            "a soft update after each actor update (every policy_delay critic updates, as "
            "TD3); RLlib's after each batch",
        )
    return Refused(
        f"a soft update (tau {tau:g}) once per {int(freq)} transitions trained is not "
        "available: apex_dask moves targets softly after every actor update (tau < 1, with "
        "target_network_update_freq at most train_batch_size) or copies them every K "
        "transitions (tau: 1.0)"
    )


def _targets(value: Any, ctx: Ctx) -> Outcome:
    if not ctx.ddpg:  # RLlib 2.x's DQN had tau too (1.0: a copy)
        if value == 1:
            return Mapped({}, "a copy every target_network_update_freq transitions trained")
        return Refused("soft target updates of the Q-net are not available (tau 1: copies)")
    return ddpg_targets(ctx)


def _noise(value: Any, ctx: Ctx) -> Outcome:
    return ddpg_noise(ctx)


def _theta(value: Any, ctx: Ctx) -> Outcome:
    out = ddpg_noise(ctx)
    if isinstance(out, Mapped) and out.targets.get("dpg.noise") != "ou":
        return Ignored("used only by OU noise")
    return out


def _half_ranges(key: str):
    def handle(value: Any, ctx: Ctx) -> Outcome:
        if not ctx.value("smooth_target_policy", False):
            return Ignored("used only with smooth_target_policy: true")
        if ctx.action_half_range is None:
            return Refused(
                "in action units; converting to apex_dask's half ranges needs the env's "
                "action bounds, equal in every dimension"
            )
        return Mapped(
            {key: _sig(value / ctx.action_half_range)},
            f"{value:g} action units = {value:g}/{ctx.action_half_range:g} half ranges",
        )

    return handle


def _huber_threshold(value: Any, ctx: Ctx) -> Outcome:
    if not ctx.value("use_huber", False):
        return Ignored("used only with use_huber: true")
    if value == 1.0:
        return Mapped({}, "apex_dask's Huber loss has delta 1")
    return Refused("apex_dask's Huber loss has delta 1")


_RELU = ("relu",)
_NO_WARMUP = "apex_dask has no random-action warm-up; learning starts at replay.learning_starts"

DDPG_RULES = [
    rule(("actor_hiddens",), to("dpg.actor_hiddens"), "dpg.actor_hiddens", "", DDPG),
    rule(("critic_hiddens",), to("dpg.critic_hiddens"), "dpg.critic_hiddens", "", DDPG),
    group(
        ("actor_hidden_activation", "critic_hidden_activation"),
        noop(_RELU, "ReLU layers", "apex_dask's DPG layers use ReLU"),
        "-",
        "relu: nothing; others refused",
        DDPG,
    ),
    rule(("actor_lr",), to("dpg.actor_lr"), "dpg.actor_lr", "", DDPG),
    rule(("critic_lr",), to("dpg.critic_lr"), "dpg.critic_lr", "", DDPG),
    rule(("twin_q",), to("dpg.twin_q"), "dpg.twin_q", "", DDPG),
    rule(("policy_delay",), to("dpg.policy_delay"), "dpg.policy_delay", "", DDPG),
    rule(
        ("smooth_target_policy",),
        to("dpg.smooth_target_policy"),
        "dpg.smooth_target_policy",
        "",
        DDPG,
    ),
    rule(
        ("target_noise",),
        _half_ranges("dpg.target_noise"),
        "dpg.target_noise",
        "action units / the action's half range",
        DDPG,
    ),
    rule(
        ("target_noise_clip",),
        _half_ranges("dpg.target_noise_clip"),
        "dpg.target_noise_clip",
        "action units / the action's half range",
        DDPG,
    ),
    rule(
        ("tau",),
        _targets,
        "dpg.tau (+ learner.target_update_freq)",
        "with target_network_update_freq <= train_batch_size: a soft update per actor "
        "update; tau 1: a copy every target_network_update_freq transitions trained; a soft "
        "update every many batches refused (RLlib's default 0.002 per 500,000 is not reproduced); "
        "APEX (2.x): 1.0 only",
    ),
    rule(("use_huber",), to("dpg.use_huber"), "dpg.use_huber", "", DDPG),
    rule(("huber_threshold",), _huber_threshold, "-", "1.0: nothing", DDPG),
    rule(
        ("l2_reg",),
        noop(
            (0, 0.0, None),
            "no L2 regularisation",
            "apex_dask has no L2 regularisation (TD3 dropped it)",
        ),
        "-",
        "0: nothing; others refused (RLlib's default 1e-6 is not reproduced)",
        DDPG,
    ),
    rule(
        ("use_state_preprocessor",),
        noop((False,), "", "apex_dask's DPG nets take the observation vector as it is"),
        "-",
        "false: nothing",
        DDPG,
    ),
    group(
        (
            "exploration_config.ou_base_scale",
            "exploration_config.ou_sigma",
            "exploration_config.stddev",
        ),
        _noise,
        "dpg.noise_base, dpg.noise_alpha",
        "folded into the noise ladder (module docstring of rules_ddpg)",
        DDPG,
    ),
    rule(("exploration_config.ou_theta",), _theta, "dpg.ou_theta", "", DDPG),
    rule(
        ("exploration_config.random_timesteps", "pure_exploration_steps"),
        noop((0, None), "no warm-up", _NO_WARMUP),
        "-",
        "0: nothing; others refused (RLlib's default 1000 is not reproduced)",
        DDPG,
    ),
    group(
        (
            "exploration_config.initial_scale",
            "exploration_config.final_scale",
            "exploration_config.scale_timesteps",
        ),
        ignore("the per-worker noise classes replace the annealed scale with constant scales"),
        "ignored",
        "",
        DDPG,
    ),
    rule(
        ("exploration_noise_type",),
        lambda v, ctx: (
            ddpg_noise(ctx)
            if v in ("ou", "gaussian")
            else Refused("exploration noise must be ou or gaussian")
        ),
        "dpg.noise (+ the ladder)",
        "2018-2019 spelling",
        DDPG,
    ),
    group(
        ("exploration_ou_noise_scale", "exploration_ou_sigma", "exploration_gaussian_sigma"),
        _noise,
        "dpg.noise_base, dpg.noise_alpha",
        "2018-2019 spelling, folded into the ladder",
        DDPG,
    ),
    rule(("exploration_ou_theta",), _theta, "dpg.ou_theta", "2018-2019 spelling", DDPG),
    rule(
        ("noise_scale",),
        _noise,
        "dpg.noise_base, dpg.noise_alpha",
        "RLlib 0.5-0.6's spelling of exploration_ou_noise_scale, folded into the ladder",
        DDPG,
    ),
    rule(
        ("exploration_should_anneal",),
        noop((False,), "", "an annealed noise scale is not available"),
        "-",
        "false: nothing",
        DDPG,
    ),
]
