"""Every RLlib key the converter knows, RLlib's defaults for APEX and APEX_DDPG, and
how a file's era is told from its keys.

The table is the concatenation of the rule lists (:mod:`.rules_env`,
:mod:`.rules_dqn`, :mod:`.rules_explore`, :mod:`.rules_ddpg`, :mod:`.rules_model`,
:mod:`.rules_run`, :mod:`.rules_ray`);
each spelling belongs to exactly one rule. Adding a key is one row there.
"""

from __future__ import annotations

from typing import Any

from apex_dask.config.rllib.rules import Rule
from apex_dask.config.rllib.rules_ddpg import DDPG_RULES
from apex_dask.config.rllib.rules_dqn import DQN_RULES
from apex_dask.config.rllib.rules_env import ENV_RULES
from apex_dask.config.rllib.rules_explore import EXPLORE_RULES
from apex_dask.config.rllib.rules_model import MODEL_RULES, STEPPING_RULES
from apex_dask.config.rllib.rules_ray import RAY_RULES
from apex_dask.config.rllib.rules_run import RUN_RULES

__all__ = ["ERAS", "RULES", "SECTIONS", "defaults", "era_of", "find_rule", "spelling"]

RULES: list[Rule] = [
    *ENV_RULES,
    *DQN_RULES,
    *EXPLORE_RULES,
    *DDPG_RULES,
    *MODEL_RULES,
    *STEPPING_RULES,
    *RUN_RULES,
    *RAY_RULES,
]

SECTIONS = (
    "replay_buffer_config",
    "optimizer",
    "exploration_config",
    "model",
    "multiagent",
    "env_config",
)
"""Config keys whose mapping is walked key by key (``model.fcnet_hiddens``)."""

_BY_KEY: dict[str, Rule] = {}
for _r in RULES:
    for _k in _r.keys:
        if _k in _BY_KEY:
            raise RuntimeError(f"RLlib key {_k!r} has two rules")
        _BY_KEY[_k] = _r


def find_rule(key: str) -> Rule | None:
    """The rule for the RLlib key ``key`` (dotted for sections; ``stop.<metric>``)."""
    if key in _BY_KEY:
        return _BY_KEY[key]
    head = key.split(".", 1)[0]
    return _BY_KEY.get(f"{head}.*") if head in ("env_config", "stop") else None


ERAS = {"2018": "2018-2019", "2020": "2020-2021", "2022": "2022-2023"}

_ERA_2022 = {
    "num_steps_sampled_before_learning_starts",
    "min_sample_timesteps_per_iteration",
    "min_time_s_per_iteration",
    "min_train_timesteps_per_iteration",
    "min_sample_timesteps_per_reporting",
    "min_time_s_per_reporting",
    "num_rollout_workers",
    "num_env_runners",
    "evaluation_duration",
    "evaluation_duration_unit",
    "metrics_num_episodes_for_smoothing",
}
_ERA_2020 = {
    "rollout_fragment_length",
    "prioritized_replay_beta_annealing_timesteps",
    "grad_clip",
    "evaluation_num_episodes",
}
_ERA_2018 = {
    "sample_batch_size",
    "schedule_max_timesteps",
    "exploration_fraction",
    "exploration_final_eps",
    "beta_annealing_fraction",
    "final_prioritized_replay_beta",
    "gpu",
    "per_worker_exploration",
    "grad_norm_clipping",
    "exploration_noise_type",
    "exploration_ou_noise_scale",
    "exploration_ou_sigma",
    "exploration_ou_theta",
    "exploration_gaussian_sigma",
    "pure_exploration_steps",
    "exploration_should_anneal",
    "use_pytorch",
}


def era_of(keys: set[str]) -> tuple[str, str]:
    """``(era, why)``: the newest era whose own spellings the file uses."""
    for era, own, prefix in (
        ("2022", _ERA_2022, "replay_buffer_config."),
        ("2020", _ERA_2020, "exploration_config."),
        ("2018", _ERA_2018, None),
    ):
        hits = sorted(k for k in keys if k in own or (prefix and k.startswith(prefix)))
        if hits:
            return era, f"from {', '.join(hits[:3])}"
    return "2020", "no era-specific key; taken as 2020-2021"


_COMMON: dict[str, Any] = {
    "num_workers": 32,
    "num_envs_per_worker": 1,
    "rollout_fragment_length": 50,
    "train_batch_size": 512,
    "replay_buffer_config.capacity": 2_000_000,
    "replay_buffer_config.prioritized_replay_alpha": 0.6,
    "replay_buffer_config.prioritized_replay_beta": 0.4,
    "replay_buffer_config.prioritized_replay_eps": 1e-6,
    "num_steps_sampled_before_learning_starts": 50_000,
    "optimizer.max_weight_sync_delay": 400,
    "optimizer.num_replay_buffer_shards": 4,
    "target_network_update_freq": 500_000,
    "n_step": 3,
    "gamma": 0.99,
    "min_sample_timesteps_per_iteration": 25_000,
    "min_time_s_per_iteration": 30,
    "evaluation_interval": None,
}
_APEX: dict[str, Any] = {
    "lr": 5e-4,
    "adam_epsilon": 1e-8,
    "grad_clip": 40,
    "hiddens": [256],
    "dueling": True,
    "double_q": True,
    "model.fcnet_hiddens": [256, 256],
    "model.fcnet_activation": "tanh",
    "exploration_config.type": "PerWorkerEpsilonGreedy",
}
_APEX_DDPG: dict[str, Any] = {
    "grad_clip": None,
    "actor_hiddens": [400, 300],
    "critic_hiddens": [400, 300],
    "actor_lr": 1e-3,
    "critic_lr": 1e-3,
    "tau": 0.002,
    "twin_q": False,
    "policy_delay": 1,
    "smooth_target_policy": False,
    "use_huber": False,
    "l2_reg": 1e-6,
}


def defaults(algo: str, era: str) -> dict[str, Any]:
    """RLlib's defaults for ``algo`` in ``era`` (concept -> value) where they matter here.

    Keys not listed default to apex_dask's own values, which are RLlib's Ape-X
    defaults (``docs/algorithm.md``).
    """
    out = {**_COMMON, **(_APEX if algo == "APEX" else _APEX_DDPG)}
    if algo == "APEX" and era == "2018":  # before exploration_config
        del out["exploration_config.type"]
        out["per_worker_exploration"] = True
    if algo == "APEX_DDPG":
        if era == "2018":
            out.update({"per_worker_exploration": True, "pure_exploration_steps": 1000})
        else:
            out.update(
                {
                    "exploration_config.type": "PerWorkerOrnsteinUhlenbeckNoise",
                    "exploration_config.random_timesteps": 1000,
                }
            )
    if era == "2022":
        out["training_intensity"] = 1
    return out


_OLD_SPELLINGS = {
    "replay_buffer_config.capacity": "buffer_size",
    "replay_buffer_config.prioritized_replay_alpha": "prioritized_replay_alpha",
    "replay_buffer_config.prioritized_replay_beta": "prioritized_replay_beta",
    "replay_buffer_config.prioritized_replay_eps": "prioritized_replay_eps",
    "num_steps_sampled_before_learning_starts": "learning_starts",
    "min_sample_timesteps_per_iteration": "timesteps_per_iteration",
    "min_time_s_per_iteration": "min_iter_time_s",
}
_SPELLINGS = {
    "2018": {
        **_OLD_SPELLINGS,
        "rollout_fragment_length": "sample_batch_size",
        "grad_clip": "grad_norm_clipping",
    },
    "2020": _OLD_SPELLINGS,
    "2022": {"num_workers": "num_rollout_workers"},
}


def spelling(key: str, era: str) -> str:
    """How a file of ``era`` spells the key ``key`` (the table's defaults section)."""
    return _SPELLINGS.get(era, {}).get(key, key)
