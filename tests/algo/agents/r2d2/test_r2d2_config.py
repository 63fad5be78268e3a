"""The r2d2 agent's config: its section, the preset, and one-line refusals of the
settings it does not support (before anything starts)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from apex_dask.config import ApexConfig, ConfigError
from apex_dask.experiment.builder import agent_spec

REFUSED = {
    "replay.frame_stack": (4, "replay.frame_stack"),
    "learner.noisy": (True, "dqn.noisy"),  # a moved key: now the dqn agent's
    "learner.num_atoms": (51, "dqn.num_atoms"),
    "dqn.loss": ("hl_gauss", "dqn agent"),  # another agent's key
    "dqn.compile": (True, "algo=dqn"),
    "r2d2.period": (30, "r2d2.trace_length"),
    "r2d2.eta": (1.5, "r2d2.eta"),
    "r2d2.trace_length": (0, "r2d2.trace_length"),
    "r2d2.burn_in": (-1, "r2d2.burn_in"),
}


@pytest.mark.parametrize("key", sorted(REFUSED))
def test_unsupported_settings_are_one_line_errors_naming_the_key(key):
    value, needle = REFUSED[key]
    with pytest.raises(ConfigError) as err:
        ApexConfig.preset("cartpole_pomdp").override({key: value})
    text = str(err.value)
    assert "\n" not in text and key in text and needle in text


def test_the_same_setting_is_fine_for_dqn():
    ApexConfig.preset("cartpole").override({"dqn.noisy": True})


def test_the_preset_builds_the_r2d2_spec_from_its_sections():
    cfg = ApexConfig.preset("cartpole_pomdp")
    spec = agent_spec(cfg)
    o = spec.config
    assert spec.algo == "r2d2" and o is cfg.agent and spec.learner is cfg.learner
    assert (o.burn_in, o.trace_length, o.period) == (10, 20, 10)
    assert (o.lstm_size, o.hiddens, o.lr) == (64, (64,), 1e-3)


def test_a_box_action_env_is_refused_before_start(tmp_path):
    submit = Path(sys.executable).parent / "apex-dask-submit"
    done = subprocess.run(
        [str(submit), "--preset", "cartpole_pomdp", "--set", "env.env_id=Pendulum-v1",
         "--out", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert "r2d2 agent needs a Discrete action space" in last and "Traceback" not in done.stderr
