"""The env: gym-era ids to today's, and ``env_config``.

* ``<Game>NoFrameskip-v4`` (the DQN setup RLlib's Atari examples used) becomes
  ``ALE/<Game>-v5`` with apex_dask's Atari pipeline, which is what RLlib's deepmind
  wrappers did to it: frame skip 4 with a max over the last two frames, up to 30 no-op
  starts, FIRE on reset, a lost life as a training terminal, sign-clipped training
  rewards, 84x84 grayscale frames, 4 stacked, no sticky actions
  (``env.repeat_action_probability: 0.0``). One difference: episodes end after
  108,000 frames (ALE v5, the literature's 30 minutes); gym cut NoFrameskip-v4 at
  400,000 frames (300,000 for SpaceInvaders).
* ``<Game>NoFrameskip-v0``: the same with sticky actions (0.25), as v0 had them.
* ``<Game>-v0/-v4`` and ``<Game>Deterministic-v0/-v4`` skip frames inside the emulator
  (a random 2-4, or 4 without max-pooling): refused, naming the NoFrameskip id.
* ``ALE/<Game>-v5``: as it is; ALE v5's sticky actions (0.25) stay on unless
  ``env_config.repeat_action_probability`` says otherwise, as RLlib ran it.
* ``CartPole-v0``: ``CartPole-v1`` cut at 200 steps (``env.env_kwargs.max_episode_steps``);
  the dynamics are the same, v1 only raised the limit to 500.
* ``Pendulum-v0``: ``Pendulum-v1`` (gymnasium: "simplify the math equations, no
  difference in behavior").
* Any other id is kept; the checks before start name a close match if it is unknown.
"""

from __future__ import annotations

import re
from typing import Any

from apex_dask.config.rllib.rules import Ctx, Ignored, Mapped, Outcome, Refused, rule

__all__ = ["ATARI_GAMES", "ENV_RULES", "env_image", "map_env_id"]

ATARI_GAMES = (
    "Adventure AirRaid Alien Amidar Assault Asterix Asteroids Atlantis BankHeist BattleZone "
    "BeamRider Berzerk Bowling Boxing Breakout Carnival Centipede ChopperCommand CrazyClimber "
    "Defender DemonAttack DoubleDunk ElevatorAction Enduro FishingDerby Freeway Frostbite "
    "Gopher Gravitar Hero IceHockey Jamesbond JourneyEscape Kangaroo Krull KungFuMaster "
    "MontezumaRevenge MsPacman NameThisGame Phoenix Pitfall Pong Pooyan PrivateEye Qbert "
    "Riverraid RoadRunner Robotank Seaquest Skiing Solaris SpaceInvaders StarGunner Tennis "
    "TimePilot Tutankham UpNDown Venture VideoPinball WizardOfWor YarsRevenge Zaxxon"
).split()
"""The Atari games gym registered as ``<Game>NoFrameskip-v4`` (and ALE v5 still has)."""

_GYM_ATARI = re.compile(
    r"^(?P<game>[A-Za-z]+?)(?P<ram>-ram)?(?P<kind>NoFrameskip|Deterministic)?-(?P<v>v0|v4)$"
)
_ALE = re.compile(r"^ALE/(?P<game>[A-Za-z]+)(?P<ram>-ram)?-v5$")

PIPELINE = (
    "apex_dask's Atari pipeline, as RLlib's deepmind wrappers: frame skip 4 with a max over "
    "the last 2 frames, up to 30 no-op starts, FIRE on reset, a lost life a training terminal, "
    "sign-clipped training rewards, 84x84 gray frames, 4 stacked (replay stores each frame "
    "once: replay.frame_stack 4)"
)


def _atari(env_id: str) -> re.Match[str] | None:
    m = _GYM_ATARI.match(env_id)
    return m if m and m.group("game") in ATARI_GAMES else None


def env_image(env_id: Any) -> bool:
    """Whether RLlib saw Atari frames (its conv net) for this id."""
    if not isinstance(env_id, str):
        return False
    m = _atari(env_id) or _ALE.match(env_id)
    return bool(m) and not m.group("ram")


def map_env_id(env_id: Any, ctx: Ctx) -> Outcome:
    """The apex_dask env keys for RLlib's ``env`` (see the module docstring)."""
    if not isinstance(env_id, str) or not env_id:
        return Refused("must be a gym env id such as CartPole-v0 or PongNoFrameskip-v4")
    m = _atari(env_id)
    if m:
        game, kind, v = m.group("game"), m.group("kind"), m.group("v")
        if m.group("ram"):
            return Refused(
                "RAM observations: apex_dask's Atari pipeline learns from frames; "
                f"use {game}NoFrameskip-v4"
            )
        if kind != "NoFrameskip":
            how = "4 frames without max-pooling" if kind else "a random 2-4 frames"
            return Refused(
                f"this id skips {how} inside the emulator, which apex_dask's Atari pipeline "
                f"does not reproduce; use {game}NoFrameskip-v4 (the DQN setup) or ALE/{game}-v5"
            )
        sticky = 0.25 if v == "v0" else 0.0
        note = (
            f"{PIPELINE}; "
            + ("sticky actions 0.25 as v0 had them" if sticky else "no sticky actions as v4")
            + "; episodes end after 108,000 frames (ALE v5), gym cut NoFrameskip-v4 at 400,000"
        )
        return Mapped(
            {
                "env.env_id": f"ALE/{game}-v5",
                "env.repeat_action_probability": sticky,
                **_atari_keys(ctx),
            },
            note,
        )
    m = _ALE.match(env_id)
    if m:
        if m.group("ram"):
            return Refused("RAM observations: apex_dask's Atari pipeline learns from frames")
        given = ctx.value("env_config.repeat_action_probability")
        sticky = 0.25 if given is None else given
        return Mapped(
            {
                "env.env_id": env_id,
                "env.repeat_action_probability": sticky,
                **_atari_keys(ctx),
            },
            f"{PIPELINE}; sticky actions {sticky:g}"
            + (" (ALE v5's default, as RLlib ran it)" if given is None else ""),
        )
    if env_id == "CartPole-v0":
        return Mapped(
            {"env.env_id": "CartPole-v1", "env.env_kwargs.max_episode_steps": 200},
            "the same dynamics: v0 is v1 cut at 200 steps",
        )
    if env_id == "Pendulum-v0":
        return Mapped({"env.env_id": "Pendulum-v1"}, "v1 simplified the maths, same behaviour")
    return Mapped({"env.env_id": env_id})


def _atari_keys(ctx: Ctx) -> dict[str, Any]:
    """Atari ids: reward clipping as RLlib's ``clip_rewards`` default (None: on for Atari),
    and each frame stored once in replay (storage only: the same samples)."""
    keys: dict[str, Any] = {"replay.frame_stack": 4}
    if not ctx.has("clip_rewards"):
        keys["env.clip_rewards"] = True
    return keys


def _env_config(key: str):
    """``env_config.<key>``: a keyword argument of ``gymnasium.make``, Atari's own keys aside."""

    def handle(value: Any, ctx: Ctx) -> Outcome:
        if ctx.image:
            return _atari_env_config(key, value)
        return Mapped({f"env.env_kwargs.{key}": value})

    return handle


def _atari_env_config(key: str, value: Any) -> Outcome:
    if key == "frameskip":
        if value == 1:
            return Mapped({}, "the pipeline steps the emulator frame by frame and skips 4 itself")
        return Refused(
            "apex_dask's Atari pipeline steps the emulator frame by frame (frameskip 1) and "
            "skips 4 frames with a max-pool itself; drop the key or set 1"
        )
    if key == "repeat_action_probability":
        return Mapped({"env.repeat_action_probability": value})
    if key in ("full_action_space", "max_num_frames_per_episode", "mode", "difficulty"):
        return Mapped({f"env.env_kwargs.{key}": value})
    if key == "obs_type":
        if value in ("rgb", "image", "grayscale"):
            return Mapped({}, "the pipeline makes 84x84 gray frames itself")
        return Refused("apex_dask's Atari pipeline learns from frames")
    if key == "render_mode":
        return Ignored("rendering is apex-dask-eval's (--video)")
    return Mapped({f"env.env_kwargs.{key}": value})


def _env_rule(value: Any, ctx: Ctx) -> Outcome:
    return map_env_id(value, ctx)


ENV_RULES = [
    rule(
        "env",
        _env_rule,
        "env.env_id (+ env.repeat_action_probability, env.env_kwargs)",
        "`<Game>NoFrameskip-v4` -> `ALE/<Game>-v5` with the Atari pipeline, no sticky actions; "
        "`<Game>NoFrameskip-v0`: sticky 0.25; `ALE/<Game>-v5`: kept, sticky 0.25 unless "
        "env_config says; `CartPole-v0` -> `CartPole-v1` + `max_episode_steps: 200`; "
        "`Pendulum-v0` -> `Pendulum-v1`; other ids kept. Refused: `<Game>-v0/-v4`, "
        "`<Game>Deterministic-v4` (frame skip inside the emulator), `-ram` ids",
    ),
    rule(
        "env_config.*",
        lambda value, ctx: Refused("internal"),  # dispatched per key by the converter
        "env.env_kwargs.<key>",
        "keyword arguments of `gymnasium.make`; for Atari ids `frameskip: 1` is what the "
        "pipeline does (other values refused), `repeat_action_probability` -> "
        "`env.repeat_action_probability`, `full_action_space`, `mode`, `difficulty`, "
        "`max_num_frames_per_episode` pass through",
    ),
]

env_config_handler = _env_config
