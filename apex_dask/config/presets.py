"""Named starting points for :class:`~apex_dask.config.ApexConfig` (plain nested dicts).

``atari`` is RLlib's Ape-X defaults; ``minatar`` and ``cartpole`` are sized for
a workstation and a 2-core machine. ``pendulum`` and ``halfcheetah`` run the
Ape-X DPG agent (``algo: dpg``): a 2-core machine and a workstation.
``cartpole_pomdp`` runs the R2D2 agent (``algo: r2d2``) on CartPole with the
velocities hidden, on a 2-core machine; ``minatar_r2d2`` runs it on MinAtar Breakout,
sized as ``minatar``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PRESETS"]


PRESETS: dict[str, dict[str, Any]] = {
    # RLlib's Ape-X defaults: 32 workers, 4 shards, 2M replay, batch 512.
    # Frames are stored once each (replay.frame_stack), not as whole 4-frame stacks.
    # The DQN Atari setup (algo/envs/atari.py): no sticky actions, sign-clipped training
    # rewards; 8 envs per worker with batched inference, as RLlib's tuned Atari Ape-X,
    # stepped by ale-py's C++ vector env (the same preprocessing, ~3x the env steps/s
    # of the Python pipeline; differences in docs/algorithm.md). MinAtar and CartPole
    # have no native vector env: they keep the default "sync".
    "atari": {
        "env": {"env_id": "ALE/Pong-v5", "clip_rewards": True, "repeat_action_probability": 0.0},
        "replay": {"frame_stack": 4},
        "workers": {"envs_per_worker": 8, "vector_mode": "native"},
    },
    # MinAtar (10x10 images): RLlib's shape scaled to a workstation.
    "minatar": {
        "env": {"env_id": "MinAtar/Breakout-v1"},
        "replay": {"capacity": 400_000, "num_shards": 2, "learning_starts": 10_000},
        "learner": {"batch_size": 128, "target_update_freq": 20_000},
        "dqn": {"lr": 2.5e-4},
        # 4 x 50 steps per call: the driver moves < 1% of what the learner's host gets
        "workers": {"num_workers": 8, "rollout_fragment_length": 50, "rollouts_per_call": 4},
        "eval": {"interval_s": 60.0, "episodes": 5, "animation": True},
        "report": {"min_iter_time_s": 10.0, "timesteps_per_iteration": 5_000},
        "checkpoint": {"interval_s": 600.0},
    },
    # CartPole-v1 sized for a 2-core machine.
    "cartpole": {
        "env": {"env_id": "CartPole-v1"},
        "replay": {"capacity": 100_000, "num_shards": 2, "learning_starts": 500},
        "learner": {
            "batch_size": 64,
            "target_update_freq": 2_000,
            "max_replay_ratio": 8.0,
            "min_replay_ratio": 8.0,
        },
        "dqn": {"lr": 4e-3, "hiddens": (128, 128)},
        "workers": {"num_workers": 2, "rollout_fragment_length": 32, "max_weight_sync_delay": 64},
        "eval": {"interval_s": 1.0, "episodes": 10, "animation": True},
        "report": {"min_iter_time_s": 1.0, "timesteps_per_iteration": 1_000},
        "checkpoint": {"interval_s": 60.0},
    },
    # R2D2 on CartPole with the velocities hidden (apex_dask/algo/envs/pomdp.py), sized for
    # a 2-core machine: items are sequences (10 burn-in + 20 trained steps, a new one every
    # 10 steps), so capacity, learning_starts and batch_size count sequences; the replay
    # ratio still counts env steps (each trained step of a sequence is one).
    "cartpole_pomdp": {
        "algo": "r2d2",
        "env": {"env_id": "apex_dask.algo.envs.pomdp:CartPolePositions-v1"},
        "replay": {"capacity": 20_000, "num_shards": 2, "learning_starts": 100, "alpha": 0.9},
        "learner": {
            "batch_size": 32,
            "gamma": 0.99,
            "n_step": 5,
            "target_update_freq": 5_000,
            "max_replay_ratio": 8.0,
            "min_replay_ratio": 8.0,
        },
        "r2d2": {
            "lr": 1e-3,
            "hiddens": (64,),
            "lstm_size": 64,
            "burn_in": 10,
            "trace_length": 20,
            "period": 10,
        },
        "workers": {"num_workers": 2, "rollout_fragment_length": 40, "max_weight_sync_delay": 80},
        "eval": {"interval_s": 2.0, "episodes": 10, "animation": True},
        "report": {"min_iter_time_s": 2.0, "timesteps_per_iteration": 2_000},
        "checkpoint": {"interval_s": 60.0},
    },
    # R2D2 on MinAtar Breakout, sized for a 2-core machine like ``minatar``: the same conv
    # torso and 256 units, then an LSTM of 128; sequences of 10 burn-in + 20 trained steps
    # every 10 steps, counted in sequences (capacity 25,000 holds ~250k env steps). The
    # target is copied every 100,000 steps trained: ~156 updates of 32 x 20, as many
    # updates as the ``minatar`` preset's 20,000 transitions at batch 128.
    "minatar_r2d2": {
        "algo": "r2d2",
        "env": {"env_id": "MinAtar/Breakout-v1"},
        "replay": {"capacity": 25_000, "num_shards": 2, "learning_starts": 500, "alpha": 0.9},
        "learner": {"batch_size": 32, "n_step": 3, "target_update_freq": 100_000},
        "r2d2": {
            "lr": 5e-4,
            "hiddens": (256,),
            "lstm_size": 128,
            "burn_in": 10,
            "trace_length": 20,
            "period": 10,
        },
        "workers": {"num_workers": 8, "rollout_fragment_length": 50, "rollouts_per_call": 4},
        "eval": {"interval_s": 60.0, "episodes": 5, "animation": True},
        "report": {"min_iter_time_s": 10.0, "timesteps_per_iteration": 5_000},
        "checkpoint": {"interval_s": 600.0},
    },
    # Ape-X DPG (TD3's options) on Pendulum-v1, sized for a 2-core machine: gamma 0.98 as
    # rl-zoo's TD3, 5-step returns, 64x64 nets and batch 128 (about 2x faster to -200 here
    # than 256x256 and batch 256, fewer updates per second being the limit).
    "pendulum": {
        "algo": "dpg",
        "env": {"env_id": "Pendulum-v1"},
        "replay": {"capacity": 100_000, "num_shards": 2, "learning_starts": 1_000},
        "learner": {
            "batch_size": 128,
            "gamma": 0.98,
            "n_step": 5,
            "max_replay_ratio": 64.0,
            "min_replay_ratio": 64.0,
        },
        "dpg": {
            "actor_hiddens": (64, 64),
            "critic_hiddens": (64, 64),
            "noise_base": 0.3,
            "noise_alpha": 2.0,
        },
        "workers": {
            "num_workers": 2,
            "envs_per_worker": 2,
            "rollout_fragment_length": 32,
            "max_weight_sync_delay": 64,
        },
        "eval": {"interval_s": 2.0, "episodes": 10},
        "report": {"min_iter_time_s": 2.0, "timesteps_per_iteration": 1_000},
        "checkpoint": {"interval_s": 60.0},
    },
    # Ape-X DPG on MuJoCo's HalfCheetah-v5 (pip install 'apex_dask[mujoco]'), for a workstation.
    "halfcheetah": {
        "algo": "dpg",
        "env": {"env_id": "HalfCheetah-v5"},
        "replay": {"capacity": 1_000_000, "num_shards": 2, "learning_starts": 10_000},
        "learner": {
            "batch_size": 256,
            "n_step": 3,
            "max_replay_ratio": 64.0,
            "min_replay_ratio": 32.0,
        },
        "dpg": {"noise_base": 0.3, "noise_alpha": 2.0},
        "workers": {
            "num_workers": 4,
            "envs_per_worker": 2,
            "rollout_fragment_length": 50,
            "max_weight_sync_delay": 400,
        },
        "eval": {"interval_s": 60.0, "episodes": 5},
        "report": {"min_iter_time_s": 10.0, "timesteps_per_iteration": 5_000},
        "checkpoint": {"interval_s": 600.0},
    },
}
