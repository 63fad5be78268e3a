"""ale-py's native vector env against the gymnasium Atari pipeline (algo/envs/atari.py), on real games.

Where the two should agree they are compared step by step on the same game,
seed and actions: frames, raw and clipped rewards, game overs, life losses as
training terminals. With ``noop_max=0`` and a game that needs no FIRE both
run the emulator through the same frames, so every frame must be equal; the
remaining differences (the reset stack's padding, how no-ops and FIRE are
drawn) are the ones docs/algorithm.md lists.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("ale_py")

from apex_dask.algo.agents.dqn.config import DQNConfig
from apex_dask.algo.agents.dqn.worker import EnvWorker  # noqa: E402
from apex_dask.algo.envs.atari import wrap_atari  # noqa: E402
from apex_dask.algo.envs.factory import check_env_id, make_env_factory  # noqa: E402
from apex_dask.algo.envs.guard import EnvErrorPolicy, EnvGuard  # noqa: E402
from apex_dask.algo.envs.native import NativeAtariEnvs, native_game, native_kwargs  # noqa: E402
from apex_dask.algo.rollout.spec import RolloutSpec


def _native(env_id: str, num_envs: int = 1, seed: int = 1, **kwargs):
    factory = make_env_factory(env_id, **kwargs)
    guard = EnvGuard(env_id)
    policy = EnvErrorPolicy(env_id, restart=True, max_per_1k_steps=10)
    rng = np.random.default_rng(0)
    return NativeAtariEnvs(
        factory, num_envs=num_envs, seed=seed, guard=guard, policy=policy, rng=rng, noop_max=0
    )


def _gym(env_id: str):
    import gymnasium as gym

    check_env_id(env_id)
    return wrap_atari(gym.make(env_id, frameskip=1, repeat_action_probability=0.0), noop_max=0)


def test_ale_ids_map_to_rom_names_and_other_envs_have_no_native_vector_env():
    assert native_game(make_env_factory("ALE/MsPacman-v5")) == "ms_pacman"
    assert native_game(make_env_factory("ALE/Pong-v5")) == "pong"
    assert native_game(make_env_factory("ALE/Pong-v5", atari_wrappers=False)) is None
    assert native_game(make_env_factory("CartPole-v1")) is None
    assert native_kwargs({"max_episode_steps": 400}) == {"max_num_frames_per_episode": 400}
    with pytest.raises(ValueError, match="vector_mode=sync"):
        native_kwargs({"mode": 1})


def test_frames_rewards_and_life_losses_equal_the_gymnasium_pipeline_step_by_step():
    env_id = "ALE/MsPacman-v5"  # no FIRE on reset; loses lives under random play
    native, env = _native(env_id), _gym(env_id)
    assert native.observation_space == env.observation_space  # (4, 84, 84) uint8
    assert native.action_space == env.action_space  # the minimal action set
    obs = native.reset()[0]
    ref, _ = env.reset(seed=1)
    # the reset stack: the same last frame; ale-py pads the older ones with zeros,
    # gymnasium's FrameStackObservation with copies of the reset frame
    np.testing.assert_array_equal(obs[-1], ref[-1])
    assert not obs[:-1].any() and (ref[:-1] == ref[-1]).all()
    rng = np.random.default_rng(0)
    seen = {"life_losses": 0, "rewards": 0}
    since_reset = 0
    for _ in range(700):
        action = int(rng.integers(native.action_space.n))
        step = native.step(np.array([action]))
        ref, reward, terminated, truncated, info = env.step(action)
        since_reset += 1
        # frames agree once the padding has left the stack
        first = max(0, 3 - since_reset)
        np.testing.assert_array_equal(step.next_obs[0][first:], ref[first:])
        assert step.reward[0] == reward  # raw score
        assert step.train_reward[0] == info["train_reward"] == np.sign(reward)
        assert bool(step.terminated[0]) == terminated and bool(step.truncated[0]) == truncated
        assert bool(step.train_terminated[0]) == info["train_terminated"]
        seen["life_losses"] += int(step.train_terminated[0] and not terminated)
        seen["rewards"] += int(reward != 0)
        if terminated or truncated:
            env.reset()
            since_reset = 0
    assert seen["life_losses"] >= 1 and seen["rewards"] >= 5, seen
    native.close()
    env.close()


def test_a_vector_env_that_raises_is_closed_and_made_again_whole():
    native = _native("ALE/Pong-v5", num_envs=2)
    native.reset()
    before = native.vec

    def broken(actions):
        raise RuntimeError("emulator crashed")

    before.step = broken
    step = native.step(np.zeros(2, np.int64))
    assert not step.active.any() and not step.all_active  # both envs' steps left out
    assert native.policy.count == 1 and native.vec is not before
    assert step.obs.shape == (2, 4, 84, 84)
    after = native.step(np.zeros(2, np.int64))
    assert after.active.all() and after.obs.shape == (2, 4, 84, 84)
    native.close()


def test_env_worker_on_the_native_env_keeps_priorities_equal_to_the_recomputation():
    factory = make_env_factory("ALE/Breakout-v5", {"max_episode_steps": 400})
    worker = EnvWorker(
        factory,
        epsilon=0.5,
        seed=3,
        rollout=RolloutSpec(fragment_length=60, num_envs=2, frame_stack=4, vector_mode="native"),
        config=DQNConfig(hiddens=(32,)),
    )
    assert worker.vector_mode == "native"
    assert worker.envs[0].num_envs == 1  # an evaluator never makes the others
    from apex_dask.algo.replay.codec import decode_batch

    done = cut = 0
    for _ in range(4):
        out = worker.sample()
        batch = decode_batch(out.batch)
        np.testing.assert_allclose(out.priorities, worker.td_errors(batch), rtol=1e-4, atol=1e-5)
        done += int(batch["done"].sum())
        cut += int(((~batch["done"]) & (batch["discount"] > 0.99**3 * 1.0001)).sum())
    assert worker.envs[0].num_envs == 2
    # lost lives are training terminals; 400 frames (100 steps) cut episodes by time
    assert done > 0 and cut > 0 and out.steps == 120
    worker.close()
