"""Envs that misbehave, at the env worker (no cluster): hangs, exceptions, NaN.

The envs are in ``tests/misbehaving_envs.py``. Each case: what the worker
does with restarts on (count, make the env again, keep the complete n-step
transitions, drop the partial episode) and off (one line naming the env).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest
from agent_parts import dqn_worker

sys.path.insert(0, str(Path(__file__).parents[1]))

from apex_dask.algo.agents.dqn.config import DQNConfig
from apex_dask.algo.agents.dqn.worker import EnvWorker
from apex_dask.algo.envs.factory import make_env_factory  # noqa: E402
from apex_dask.algo.envs.guard import EnvFailed, EnvFault, EnvGuard  # noqa: E402
from apex_dask.algo.envs.probe import probe_spaces  # noqa: E402
from apex_dask.algo.rollout.spec import Rollout, RolloutSpec

RAISE = "misbehaving_envs:RaiseEvery-v0"


def _worker(env_id: str, env_kwargs: dict | None = None, **kw) -> EnvWorker:
    kw = {"epsilon": 0.5, "seed": 0, "hiddens": (16,), "fragment_length": 50, **kw}
    return dqn_worker(make_env_factory(env_id, env_kwargs or {}), **kw)


def _finite(rollout: Rollout) -> bool:
    b = rollout.batch
    arrays = [b["obs"], b["next_obs"], b["reward"], rollout.priorities]
    return all(np.isfinite(a).all() for a in arrays)


def test_a_constructor_that_never_returns_is_one_line_naming_the_env_and_the_key():
    factory = make_env_factory("misbehaving_envs:HangOnMake-v0")
    t0 = time.monotonic()
    with pytest.raises(EnvFault, match=r"HangOnMake-v0.*env\.make_timeout_s=0\.3 s"):
        probe_spaces(factory, make_timeout_s=0.3)
    with pytest.raises(EnvFailed, match=r"HangOnMake-v0.*env\.make_timeout_s=0\.3 s"):
        EnvWorker(
            factory,
            epsilon=0.1,
            seed=0,
            rollout=RolloutSpec(make_timeout_s=0.3),
            config=DQNConfig(hiddens=(16,)),
        )
    assert time.monotonic() - t0 < 10  # a CPU hog beside it: far from the hang


def test_a_failed_step_is_survived_keeping_the_complete_transitions():
    # 20-step episodes; the step at instance step 30 raises: 20 + 7 transitions before
    # it (2 pending steps dropped), then 20 more steps of a new env: one more episode.
    w = _worker(RAISE, {"every": 30}, n_step=3)
    out = w.sample()
    assert w.env_errors == 1
    assert out.episode_lengths == [20, 20]  # the partial episode is not reported
    assert out.episode_returns == [20.0, 20.0]
    assert len(out.batch["action"]) == 20 + 7 + 20
    assert out.steps == 49 and _finite(out)
    for _ in range(3):  # the worker goes on
        assert _finite(w.sample())
    assert w.env_errors >= 4
    w.close()


def test_an_oserror_from_the_env_is_an_env_error_not_a_lost_peer():
    w = _worker(RAISE, {"every": 30, "error": "ConnectionResetError"}, restart_failed_envs=False)
    with pytest.raises(EnvFailed) as info:
        w.sample()
    assert not isinstance(info.value, OSError)  # the driver would take it for a lost worker
    assert "ConnectionResetError: simulator connection dropped" in str(info.value)


def test_with_restarts_off_the_first_error_names_the_env_the_exception_and_the_step():
    w = _worker(RAISE, {"every": 30}, restart_failed_envs=False, where="env worker 3")
    with pytest.raises(EnvFailed) as info:
        w.sample()
    msg = str(info.value)
    assert "\n" not in msg
    assert f"{RAISE!r}" in msg and "env step 30" in msg and "(env worker 3)" in msg
    assert "RuntimeError: simulator connection dropped after 30 steps" in msg
    assert "workers.restart_failed_envs=true" in msg


def test_an_env_failing_on_every_step_ends_at_the_cap_naming_the_count_and_last_error():
    w = _worker(RAISE, {"every": 1}, max_consecutive_env_errors=4)
    t0 = time.monotonic()
    with pytest.raises(EnvFailed) as info:
        w.sample()
    msg = str(info.value)
    assert "failed 4 times in a row without completing a step" in msg
    assert "workers.max_consecutive_env_errors=4" in msg and "\n" not in msg
    assert RAISE in msg and "last: step raised at env step" in msg and "RuntimeError" in msg
    assert w.env_errors == 4 and time.monotonic() - t0 < 10


@pytest.mark.parametrize(
    ("kwargs", "what"),
    [
        ({"obs": True, "reward": False}, "non-finite observation (nan at flat index 0"),
        ({"obs": False, "reward": True}, "non-finite reward nan"),
    ],
)
def test_non_finite_values_are_caught_before_the_adder(kwargs, what):
    env_id = "misbehaving_envs:NonFinite-v0"
    off = _worker(env_id, {"at": 13, **kwargs}, restart_failed_envs=False)
    with pytest.raises(EnvFailed) as info:
        off.sample()
    assert f"env {env_id!r} returned a {what}" in str(info.value)
    assert "at env step 13" in str(info.value)
    on = _worker(env_id, {"at": 13, **kwargs})
    out = on.sample()  # each env made gives 12 good steps: errors at steps 13, 26, 39
    assert on.env_errors == 3 and _finite(out)
    assert out.episode_lengths == []  # no episode got to its end


def test_a_hung_step_is_an_env_error_and_a_fresh_env_goes_on():
    w = _worker("misbehaving_envs:HangStep-v0", {"at": 25, "hang_s": 60}, step_timeout_s=0.5)
    t0 = time.monotonic()
    out = w.sample()  # each env made: a 20-step episode, 4 steps, then its 25th step hangs
    assert time.monotonic() - t0 < 20  # two 0.5 s waits, not 60 s each
    assert w.env_errors == 2 and _finite(out)
    assert out.episode_lengths == [20, 20]
    w.close()


def test_a_hung_step_with_restarts_off_names_the_key():
    w = _worker(
        "misbehaving_envs:HangStep-v0",
        {"at": 3, "hang_s": 60},
        step_timeout_s=0.3,
        restart_failed_envs=False,
    )
    with pytest.raises(EnvFailed, match=r"step did not return within env\.step_timeout_s=0\.3 s"):
        w.sample()


def test_the_evaluator_drops_the_episode_an_env_error_cut():
    w = _worker(RAISE, {"every": 30}, epsilon=0.0)
    out = w.evaluate(3, seed=0)
    assert w.env_errors == 1
    assert out["lengths"] == [20, 20] and out["returns"] == [20.0, 20.0]


def test_a_guard_without_a_step_timeout_calls_in_the_callers_thread():
    import threading

    guard = EnvGuard("x", step_timeout_s=None)
    assert guard.call("step", threading.current_thread, 1) is threading.current_thread()
    bounded = EnvGuard("x", step_timeout_s=5.0)
    assert bounded.call("step", threading.current_thread, 1) is not threading.current_thread()


class _MakesOnce:
    """A factory whose first env works and raises at step 5; later makes hang."""

    env_id = "flaky:Sim-v0"

    def __init__(self) -> None:
        self.made = 0

    def __call__(self):
        self.made += 1
        if self.made > 1:
            time.sleep(60)
        return make_env_factory(RAISE, {"every": 5})()


def test_an_env_that_cannot_be_made_again_ends_the_run_after_a_few_tries():
    factory = _MakesOnce()
    w = EnvWorker(
        factory,
        epsilon=0.5,
        seed=0,
        rollout=RolloutSpec(make_timeout_s=0.2),
        config=DQNConfig(hiddens=(16,)),
    )
    t0 = time.monotonic()
    with pytest.raises(EnvFailed) as info:
        w.sample()
    msg = str(info.value)
    assert "'flaky:Sim-v0' was not made within env.make_timeout_s=0.2 s" in msg
    assert "3 times in a row" in msg and factory.made == 4
    assert time.monotonic() - t0 < 10


def test_an_env_whose_constructor_returns_late_is_closed_by_its_abandoned_thread():
    sys.path.insert(0, str(Path(__file__).parents[1] / "runtime"))
    from polling import poll

    closed = []

    class Late:
        def close(self):
            closed.append(True)

    def slow():
        time.sleep(0.5)
        return Late()

    guard = EnvGuard("slow:Sim-v0", make_timeout_s=0.1)
    with pytest.raises(EnvFault, match="env.make_timeout_s=0.1 s"):
        guard.make(slow)
    poll(lambda: closed, timeout_s=20)
