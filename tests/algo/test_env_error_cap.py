"""The env-error cap scales with the work done, at two env speeds.

``RaiseEvery-v0`` (``tests/misbehaving_envs.py``) fails every ``every`` of its steps;
``sleep_s`` slows each step down (0: as fast as CartPole). The cap counts errors
per 1,000 env steps (``workers.max_env_errors_per_1k_steps``, 10) and errors of
one env in a row without a completed step (``workers.max_consecutive_env_errors``,
5): an env that fails now and then is survived however fast it steps, a broken
one ends the run within seconds however slow it is. The old cap, 10 errors a
minute, ended the first and let a slow broken env go on.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from agent_parts import dqn_worker

sys.path.insert(0, str(Path(__file__).parents[1]))

from apex_dask.algo.agents.dqn.worker import EnvWorker  # noqa: E402
from apex_dask.algo.envs.factory import make_env_factory  # noqa: E402
from apex_dask.algo.envs.guard import EnvFailed  # noqa: E402

RAISE = "misbehaving_envs:RaiseEvery-v0"
SLOW_STEP_S = 0.0005  # a simulator at about 1,500 steps/s at most, not CartPole's 20,000+


def _worker(env_kwargs: dict, **kw) -> EnvWorker:
    kw = {"epsilon": 0.5, "seed": 0, "hiddens": (16,), "fragment_length": 200, **kw}
    return dqn_worker(make_env_factory(RAISE, {"episode_len": 200, **env_kwargs}), **kw)


@pytest.mark.parametrize(
    ("sleep_s", "every", "steps"), [(0.0, 2000, 30_000), (SLOW_STEP_S, 500, 6_000)]
)
def test_an_env_failing_now_and_then_is_survived_at_any_step_rate(sleep_s, every, steps):
    w = _worker({"every": every, "sleep_s": sleep_s})
    t0 = time.monotonic()
    while w.steps_sampled < steps:
        w.sample()  # EnvFailed would end the run
    took = time.monotonic() - t0
    # each new env fails at its every-th step: about one error per `every` steps
    assert w.env_errors >= steps // every - 1 >= 11, w.env_errors
    assert took < 60, took  # more than 10 errors within a minute: the old cap's end
    w.close()


@pytest.mark.parametrize("sleep_s", [0.0, 0.3])
def test_a_broken_env_ends_the_run_within_seconds_at_any_step_rate(sleep_s):
    w = _worker({"every": 1, "sleep_s": sleep_s}, where="env worker 2")
    t0 = time.monotonic()
    with pytest.raises(EnvFailed) as info:
        w.sample()
    took = time.monotonic() - t0
    msg = str(info.value)
    assert "\n" not in msg and f"env {RAISE!r} failed 5 times in a row" in msg
    assert "without completing a step (env worker 2)" in msg
    assert "workers.max_consecutive_env_errors=5" in msg and "RuntimeError" in msg
    assert w.env_errors == 5
    assert took < 5 + 5 * sleep_s, took


def test_an_env_failing_every_few_steps_ends_at_the_rate_cap():
    w = _worker({"every": 20})  # 19 good steps per env made: ~50 errors per 1,000 steps
    with pytest.raises(EnvFailed) as info:
        for _ in range(10):
            w.sample()
    msg = str(info.value)
    assert f"env {RAISE!r} failed 11 times within 1,000 env steps" in msg
    assert "over workers.max_env_errors_per_1k_steps=10" in msg and "\n" not in msg
    assert w.env_errors == 11 and w.steps_sampled <= 220


def test_the_caps_are_the_workers_settings():
    w = _worker({"every": 20}, max_env_errors_per_1k_steps=60, max_consecutive_env_errors=2)
    for _ in range(10):  # 2,000 steps: about 100 errors, at most ~53 in any 1,000 steps
        w.sample()
    assert w.env_errors >= 90
    broken = _worker({"every": 1}, max_consecutive_env_errors=2)
    with pytest.raises(EnvFailed, match="failed 2 times in a row"):
        broken.sample()
