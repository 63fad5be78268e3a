"""RLlib Ape-X experiment files of three eras, written as RLlib users wrote them, for the
converter's tests (``tests/test_rllib_*.py``). The 2022 CartPole and the APEX_DDPG
Pendulum files live in ``docs/examples/rllib/`` (they are also the docs' examples).
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "docs" / "examples" / "rllib"
CARTPOLE_2022 = EXAMPLES / "cartpole-apex-2022.yaml"
PENDULUM_DDPG = EXAMPLES / "pendulum-apex-ddpg.yaml"

ATARI_2018 = """\
# RLlib 0.6-0.7 era: two tuned Ape-X experiments in one file
pong-apex:
  env: PongNoFrameskip-v4
  run: APEX
  stop:
    episode_reward_mean: 20
    timesteps_total: 10000000
  checkpoint_freq: 10
  config:
    target_network_update_freq: 50000
    num_workers: 32
    lr: .0001
    gamma: 0.99
    n_step: 3
    buffer_size: 1000000
    sample_batch_size: 20
    train_batch_size: 512
    learning_starts: 50000
    schedule_max_timesteps: 2000000
    exploration_fraction: 0.1
    exploration_final_eps: 0.01
    per_worker_exploration: true
    worker_side_prioritization: true
    prioritized_replay_alpha: 0.5
    beta_annealing_fraction: 1.0
    final_prioritized_replay_beta: 1.0
    grad_norm_clipping: 40
    timesteps_per_iteration: 25000
    min_iter_time_s: 30
    gpu: true
    optimizer:
      max_weight_sync_delay: 400
      num_replay_buffer_shards: 4
      debug: false
breakout-apex:
  env: BreakoutNoFrameskip-v4
  run: APEX
  stop:
    timesteps_total: 20000000
  config:
    num_workers: 16
    lr: .00025
    buffer_size: 500000
    sample_batch_size: 50
    learning_starts: 20000
    hiddens: [512]
    num_atoms: 1
    noisy: false
    compress_observations: true
    gpu: false
    optimizer:
      num_replay_buffer_shards: 2
"""

# RLlib 1.x (2020-2021): the params.json an APEX run on Breakout left behind (every key).
PARAMS_2020 = {
    "num_workers": 8,
    "num_envs_per_worker": 1,
    "create_env_on_driver": False,
    "rollout_fragment_length": 50,
    "batch_mode": "truncate_episodes",
    "gamma": 0.99,
    "lr": 0.0001,
    "train_batch_size": 512,
    "model": {
        "_use_default_native_models": False,
        "fcnet_hiddens": [256, 256],
        "fcnet_activation": "tanh",
        "conv_filters": None,
        "conv_activation": "relu",
        "post_fcnet_hiddens": [],
        "post_fcnet_activation": "relu",
        "free_log_std": False,
        "no_final_linear": False,
        "vf_share_layers": True,
        "use_lstm": False,
        "max_seq_len": 20,
        "lstm_cell_size": 256,
        "lstm_use_prev_action": False,
        "lstm_use_prev_reward": False,
        "_time_major": False,
        "use_attention": False,
        "attention_num_transformer_units": 1,
        "attention_dim": 64,
        "framestack": True,
        "dim": 84,
        "grayscale": False,
        "zero_mean": True,
        "custom_model": None,
        "custom_model_config": {},
        "custom_action_dist": None,
        "custom_preprocessor": None,
        "lstm_use_prev_action_reward": -1,
    },
    "optimizer": {"max_weight_sync_delay": 400, "num_replay_buffer_shards": 4, "debug": False},
    "horizon": None,
    "soft_horizon": False,
    "no_done_at_end": False,
    "env": "BreakoutNoFrameskip-v4",
    "observation_space": None,
    "action_space": None,
    "env_config": {},
    "remote_worker_envs": False,
    "remote_env_batch_wait_ms": 0,
    "env_task_fn": None,
    "render_env": False,
    "record_env": False,
    "clip_rewards": None,
    "normalize_actions": True,
    "clip_actions": False,
    "preprocessor_pref": "deepmind",
    "log_level": "WARN",
    "callbacks": "<class 'ray.rllib.agents.callbacks.DefaultCallbacks'>",
    "ignore_worker_failures": False,
    "log_sys_usage": True,
    "fake_sampler": False,
    "framework": "tf",
    "eager_tracing": False,
    "explore": True,
    "exploration_config": {
        "type": "PerWorkerEpsilonGreedy",
        "initial_epsilon": 1.0,
        "final_epsilon": 0.02,
        "epsilon_timesteps": 10000,
    },
    "evaluation_interval": None,
    "evaluation_num_episodes": 10,
    "evaluation_parallel_to_training": False,
    "in_evaluation": False,
    "evaluation_config": {"explore": False},
    "evaluation_num_workers": 0,
    "custom_eval_function": None,
    "sample_async": False,
    "sample_collector": "<class 'ray.rllib.evaluation.collectors.simple_list_collector.SimpleListCollector'>",
    "observation_filter": "NoFilter",
    "synchronize_filters": True,
    "tf_session_args": {"intra_op_parallelism_threads": 2, "inter_op_parallelism_threads": 2},
    "local_tf_session_args": {"intra_op_parallelism_threads": 8},
    "compress_observations": False,
    "collect_metrics_timeout": 180,
    "metrics_smoothing_episodes": 100,
    "min_iter_time_s": 30,
    "timesteps_per_iteration": 25000,
    "seed": None,
    "extra_python_environs_for_driver": {},
    "extra_python_environs_for_worker": {},
    "num_gpus": 1,
    "_fake_gpus": False,
    "num_cpus_per_worker": 1,
    "num_gpus_per_worker": 0,
    "custom_resources_per_worker": {},
    "num_cpus_for_driver": 1,
    "placement_strategy": "PACK",
    "input": "sampler",
    "input_evaluation": ["is", "wis"],
    "postprocess_inputs": False,
    "shuffle_buffer_size": 0,
    "output": None,
    "output_compress_columns": ["obs", "new_obs"],
    "output_max_file_size": 67108864,
    "multiagent": {
        "policies": {},
        "policy_mapping_fn": None,
        "policies_to_train": None,
        "observation_fn": None,
        "replay_mode": "independent",
        "count_steps_by": "env_steps",
    },
    "logger_config": None,
    "simple_optimizer": False,
    "monitor": -1,
    "_tf_policy_handles_more_than_one_loss": False,
    "_disable_preprocessor_api": False,
    "_disable_execution_plan_api": False,
    "num_atoms": 1,
    "v_min": -10.0,
    "v_max": 10.0,
    "noisy": False,
    "sigma0": 0.5,
    "dueling": True,
    "hiddens": [256],
    "double_q": True,
    "n_step": 3,
    "target_network_update_freq": 500000,
    "buffer_size": 2000000,
    "replay_sequence_length": 1,
    "prioritized_replay": True,
    "prioritized_replay_alpha": 0.6,
    "prioritized_replay_beta": 0.4,
    "final_prioritized_replay_beta": 0.4,
    "prioritized_replay_beta_annealing_timesteps": 20000,
    "prioritized_replay_eps": 1e-06,
    "before_learn_on_batch": None,
    "training_intensity": None,
    "lr_schedule": None,
    "adam_epsilon": 1e-08,
    "grad_clip": 40,
    "learning_starts": 50000,
    "worker_side_prioritization": True,
}


def write_params_2020(folder: Path) -> Path:
    path = folder / "APEX_BreakoutNoFrameskip-v4_0_2021-03-01" / "params.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(PARAMS_2020, indent=2))
    return path


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path
