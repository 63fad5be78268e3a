"""RLlib's ``model`` section and the keys of how envs are stepped and preprocessed.

apex_dask's Q-net is an MLP with ReLU layers for vector observations and the
Nature-DQN conv net (32x8x8/4, 64x4x4/2, 64x3x3/1) for Atari frames, then
``dqn.hiddens``; what RLlib's ``model`` asked beyond that is refused in one
line. APEX_DDPG does not read ``model`` (without ``use_state_preprocessor``).
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
    rule,
)
from apex_dask.config.rllib.rules_dqn import q_hiddens

__all__ = ["MODEL_RULES", "NATURE_FILTERS", "STEPPING_RULES"]

NATURE_FILTERS = [[32, [8, 8], 4], [64, [4, 4], 2], [64, [3, 3], 1]]
"""The conv net apex_dask uses for Atari frames (RLlib's ``conv_filters`` notation)."""

_DDPG_MODEL = "RLlib's DDPG builds its nets from actor_hiddens / critic_hiddens, not model"


def _model(handler):
    """``model.*`` under APEX_DDPG is unused (RLlib's DDPG did not read it)."""

    def handle(value: Any, ctx: Ctx) -> Outcome:
        if ctx.ddpg:
            return Ignored(_DDPG_MODEL)
        return handler(value, ctx)

    return handle


def _fc(value: Any, ctx: Ctx) -> Outcome:
    if ctx.image:
        return Ignored("with Atari frames RLlib's conv net did not use the fcnet layers")
    return q_hiddens(ctx)


def _post_fc(value: Any, ctx: Ctx) -> Outcome:
    if ctx.image:
        if value:
            return Refused("apex_dask puts dqn.hiddens after the conv net; give them as hiddens")
        return Mapped({}, "none")
    return q_hiddens(ctx)


def _relu(what: str, vector_only: bool):
    def handle(value: Any, ctx: Ctx) -> Outcome:
        if vector_only and ctx.image:
            return Ignored("with Atari frames RLlib's conv net did not use the fcnet layers")
        if value == "relu":
            return Mapped({}, "apex_dask's layers are ReLU")
        return Refused(f"apex_dask's {what} use ReLU")

    return handle


def _conv_filters(value: Any, ctx: Ctx) -> Outcome:
    if not ctx.image:
        return Ignored("vector observations: no conv net")
    if value is None:
        return Mapped({}, "RLlib's default filters; apex_dask uses the Nature-DQN conv net")
    if value == NATURE_FILTERS:
        return Mapped({}, "the Nature-DQN conv net, apex_dask's")
    return Refused(f"apex_dask's conv net is the Nature-DQN one, {NATURE_FILTERS}")


def _image_only(ok: tuple[Any, ...], why_not: str):
    def handle(value: Any, ctx: Ctx) -> Outcome:
        if not ctx.image:
            return Ignored("only for image observations")
        if value in ok:
            return Mapped({}, "as apex_dask's Atari pipeline")
        return Refused(why_not)

    return handle


_RECURRENT = "apex_dask's Q-nets are feed-forward (R2D2's recurrent agent is not available)"
_EMPTY = (None, {}, "", [])

_MODEL_SPECS = [
    (
        ("model.fcnet_hiddens",),
        _fc,
        "dqn.hiddens",
        "vector observations: the layers before `hiddens` (see hiddens); Atari: unused",
    ),
    (
        ("model.post_fcnet_hiddens",),
        _post_fc,
        "dqn.hiddens",
        "vector observations: between fcnet_hiddens and hiddens",
    ),
    (
        ("model.fcnet_activation",),
        _relu("MLP layers", True),
        "-",
        "relu: nothing; others refused (RLlib's default tanh is not reproduced)",
    ),
    (("model.post_fcnet_activation",), _relu("MLP layers", True), "-", "relu: nothing"),
    (
        ("model.conv_filters",),
        _conv_filters,
        "-",
        "null or the Nature-DQN filters: nothing; others refused",
    ),
    (("model.conv_activation",), _relu("conv layers", False), "-", "relu: nothing"),
    (
        ("model.framestack",),
        _image_only((True,), "apex_dask stacks 4 Atari frames"),
        "-",
        "true: the pipeline's 4 stacked frames",
    ),
    (
        ("model.num_framestacks",),
        _image_only(("auto", 0, 4), "apex_dask stacks 4 Atari frames"),
        "-",
        "auto, 0 or 4: the pipeline's 4 stacked frames",
    ),
    (("model.dim",), _image_only((84,), "apex_dask's Atari frames are 84x84"), "-", "84"),
    (
        ("model.grayscale", "model.zero_mean"),
        ignore(
            "used only by RLlib's own preprocessor "
            "(preprocessor_pref: rllib); the deepmind frames are gray bytes"
        ),
        "ignored",
        "",
    ),
    (
        ("model.use_lstm", "model.use_attention"),
        noop((False,), "feed-forward", _RECURRENT),
        "-",
        "false: nothing; true refused",
    ),
    (
        (
            "model.lstm_cell_size",
            "model.max_seq_len",
            "model.lstm_use_prev_action",
            "model.lstm_use_prev_reward",
            "model.lstm_use_prev_action_reward",
            "model._time_major",
            "model.attention_num_transformer_units",
            "model.attention_dim",
            "model.attention_num_heads",
            "model.attention_head_dim",
            "model.attention_memory_inference",
            "model.attention_memory_training",
            "model.attention_position_wise_mlp_dim",
            "model.attention_init_gru_gate_bias",
            "model.attention_use_n_prev_actions",
            "model.attention_use_n_prev_rewards",
        ),
        ignore("used only with use_lstm / use_attention"),
        "ignored",
        "recurrent models only",
    ),
    (
        ("model.custom_model", "model.custom_action_dist", "model.custom_preprocessor"),
        noop(_EMPTY, "none", "custom RLlib models do not run in apex_dask"),
        "-",
        "null: nothing; set: refused",
    ),
    (
        ("model.custom_model_config", "model.custom_options"),
        noop(_EMPTY, "none", "custom RLlib models do not run in apex_dask"),
        "-",
        "empty: nothing",
    ),
    (
        (
            "model.free_log_std",
            "model.vf_share_layers",
            "model.no_final_linear",
            "model.encoder_latent_dim",
            "model.fcnet_weights_initializer",
            "model.fcnet_weights_initializer_config",
            "model.fcnet_bias_initializer",
            "model.fcnet_bias_initializer_config",
            "model.conv_kernel_initializer",
            "model.conv_kernel_initializer_config",
            "model.conv_bias_initializer",
            "model.conv_bias_initializer_config",
            "model._use_default_native_models",
            "model._disable_preprocessor_api",
            "model._disable_action_flattening",
            "model.always_check_shapes",
        ),
        ignore("policy-gradient or RLlib-internal model options; a Q-net does not use them"),
        "ignored",
        "",
    ),
]

MODEL_RULES = [group(keys, _model(h), to_, how) for keys, h, to_, how in _MODEL_SPECS]


def _horizon(value: Any, ctx: Ctx) -> Outcome:
    if value is None or value == 0 or value == float("inf"):
        return Mapped({}, "no cut")
    if not integer(value) or value < 1:
        return Refused("give a number of env steps")
    frames = int(value) * (4 if ctx.image else 1)
    return Mapped(
        {"env.env_kwargs.max_episode_steps": frames},
        "a time limit: the cut bootstraps (RLlib marked it done)"
        + ("; in emulator frames (4 per step)" if ctx.image else ""),
    )


def _preprocessor(value: Any, ctx: Ctx) -> Outcome:
    if not ctx.image:
        return Ignored("RLlib preprocessed only image observations")
    if value == "deepmind":
        return Mapped({}, "the deepmind preprocessing is apex_dask's Atari pipeline")
    return Refused("apex_dask's Atari pipeline is the deepmind preprocessing")


STEPPING_RULES = [
    rule(
        ("batch_mode",),
        noop(
            ("truncate_episodes",),
            "rollouts are fragments",
            "apex_dask's rollouts are fixed-length fragments (truncate_episodes)",
        ),
        "-",
        "truncate_episodes: nothing; complete_episodes refused",
    ),
    rule(
        ("horizon",),
        _horizon,
        "env.env_kwargs.max_episode_steps",
        "a time limit "
        "(emulator frames for Atari ids); it bootstraps, where RLlib marked the cut done",
    ),
    group(
        ("soft_horizon", "no_done_at_end"),
        noop((False,), "", "not available: a cut episode ends (a time limit)"),
        "-",
        "false: nothing; true refused",
    ),
    rule(
        ("explore",),
        noop((True,), "env workers explore", "Ape-X's env workers explore"),
        "-",
        "true: nothing; false refused",
    ),
    rule(
        ("preprocessor_pref",),
        _preprocessor,
        "-",
        "deepmind: the Atari pipeline; others refused for Atari, ignored otherwise",
    ),
    rule(
        ("observation_filter",),
        noop(("NoFilter",), "", "observation filters (running mean/std) are not available"),
        "-",
        "NoFilter: nothing; others refused",
    ),
    rule(
        ("compress_observations",),
        ignore(
            "apex_dask stores each Atari frame once (replay.frame_stack) instead of compressing"
        ),
        "ignored",
        "",
    ),
    group(
        ("clip_actions", "normalize_actions"),
        ignore(
            "apex_dask's DPG actor acts within the action bounds and its noise is clipped to them"
        ),
        "ignored",
        "",
    ),
    rule(
        ("restart_failed_sub_environments",),
        lambda v, ctx: Mapped({"workers.restart_failed_envs": bool(v)}),
        "workers.restart_failed_envs",
        "an env that fails is made again",
    ),
    rule(
        ("multiagent.policies", "policies"),
        noop(_EMPTY, "one policy", "multi-agent runs are not available"),
        "-",
        "empty: nothing",
    ),
    group(
        (
            "multiagent.policy_mapping_fn",
            "multiagent.policies_to_train",
            "multiagent.observation_fn",
            "policy_mapping_fn",
            "policies_to_train",
            "observation_fn",
        ),
        noop(_EMPTY, "one policy", "multi-agent runs are not available"),
        "-",
        "null: nothing",
    ),
    group(
        (
            "multiagent.replay_mode",
            "multiagent.count_steps_by",
            "replay_mode",
            "count_steps_by",
            "replay_buffer_config.replay_mode",
            "multiagent.policy_map_capacity",
            "multiagent.policy_map_cache",
            "policy_map_capacity",
            "policy_map_cache",
        ),
        ignore("one agent: env steps and agent steps are the same"),
        "ignored",
        "",
    ),
    rule(
        ("replay_buffer_config.replay_batch_size",),
        lambda v, ctx: (
            Mapped({}, "")
            if v in (None, ctx.value("train_batch_size", 512))
            else Refused("apex_dask samples train_batch_size transitions per batch")
        ),
        "-",
        "equal to train_batch_size or null",
    ),
    rule(
        ("replay_buffer_config.replay_sequence_length", "replay_sequence_length"),
        noop((1, None, -1), "single transitions", "sequence replay is not available"),
        "-",
        "1: nothing",
    ),
    rule(
        ("replay_buffer_config.storage_unit",),
        noop(("timesteps", None), "", "apex_dask stores single transitions"),
        "-",
        "timesteps: nothing",
    ),
    group(
        (
            "replay_buffer_config.no_local_replay_buffer",
            "replay_buffer_config.replay_buffer_shards_colocated_with_driver",
            "replay_buffer_shards_colocated_with_driver",
            "replay_buffer_config._enable_replay_buffer_api",
            "replay_buffer_config.replay_zero_init_states",
        ),
        ignore("Ray's placement of replay actors; apex_dask places shards by replay.placement"),
        "ignored",
        "",
    ),
]
