"""The greedy policy as a TorchScript file that plain ``torch`` loads, with a JSON beside it.

::

    export_policy("pong.pt", AgentSpec("dqn", DQNConfig(hiddens=(512,))), obs_space,
                  act_space, weights, about={"env_id": "ALE/Pong-v5", "env_kwargs": {}})

    # elsewhere, with torch only:
    policy = torch.jit.load("pong.pt")
    action = policy(torch.as_tensor(obs))            # one observation -> a 0-d int64 tensor
    actions = policy(torch.as_tensor(obs_batch))     # (B, ...) -> (B,) int64

The program is the agent's own (its builder's ``scripted_policy``: for DQN
the Q-network with the input scaling inside, then ``argmax``; for DPG the
actor). ``<file>.json`` says what it expects: the env id and kwargs, the
observation and action spaces, what runs inside the program, what it
returns, and the preprocessing that stays outside the program (for ``ALE/``
ids the Atari wrappers that make the 84x84 frame stack; apply them, e.g.
``apex_dask.algo.envs.atari.wrap_atari``, or their equivalent, before calling it).

Why TorchScript, which torch 2.13 marks deprecated (its warnings are
silenced here): the file loads with ``torch.jit.load`` in any torch of the
last years and in C++ (libtorch) with no Python code at all, and one program
takes both a single observation and a batch. A ``torch.export`` program
(``.pt2``) needs a recent torch to load, fixes the input's rank, and runs in
C++ only after ahead-of-time compilation.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from gymnasium import spaces

from apex_dask.algo.agents.registry import scripted_policy
from apex_dask.algo.agents.spec import AgentSpec

__all__ = ["FORMAT", "describe_space", "export_policy"]

FORMAT = "apex-dask-policy/1"

ATARI_OUTSIDE = [
    "gymnasium.make(env_id, frameskip=1, repeat_action_probability=0.0, **env_kwargs)",
    "no-op starts: 1 to 30 NOOP actions after reset",
    "frame skip 4, max-pooling the last two frames",
    "84x84 grayscale uint8 frames (gymnasium AtariPreprocessing)",
    "FIRE after reset where the game's second action is FIRE",
    "a stack of the last 4 frames on the first axis -> (4, 84, 84)",
    "the same as apex_dask.algo.envs.atari.wrap_atari",
]


def describe_space(space: spaces.Space) -> dict[str, Any]:
    """A JSON description of a ``Box`` or ``Discrete`` space (bounds as one number
    when every element shares it)."""
    if isinstance(space, spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, spaces.Box):

        def bound(a: np.ndarray) -> Any:
            a = np.asarray(a, dtype=np.float64)
            values = a if np.all(a == a.flat[0]) else None
            if values is None:
                return [_num(x) for x in a.ravel().tolist()]
            return _num(float(a.flat[0]))

        return {
            "type": "Box",
            "shape": list(space.shape),
            "dtype": str(space.dtype),
            "low": bound(space.low),
            "high": bound(space.high),
        }
    return {"type": type(space).__name__, "repr": repr(space)}


def _num(x: float) -> Any:
    if np.isfinite(x):
        return int(x) if float(x).is_integer() else x
    return "inf" if x > 0 else "-inf"


def export_policy(
    path: str | os.PathLike[str],
    agent: AgentSpec,
    observation_space: spaces.Space,
    action_space: spaces.Space,
    weights: Mapping[str, Any],
    *,
    about: Mapping[str, Any] | None = None,
) -> tuple[Path, Path]:
    """Write the agent's greedy policy as TorchScript to ``path`` and its description to
    ``path``.json.

    ``about`` joins the JSON (env id, kwargs, where the weights came from); an
    ``env_id`` starting with ``ALE/`` lists the Atari wrappers as outside.
    Returns both paths. :class:`~apex_dask.algo.agents.base.WeightsMismatch` if the
    weights do not fit the agent's network.
    """
    scripted = scripted_policy(agent, observation_space, action_space, weights)
    info = dict(about or {})
    env_id = str(info.get("env_id", ""))
    doc = {
        "format": FORMAT,
        **info,
        "observation_space": describe_space(observation_space),
        "action_space": describe_space(action_space),
        "input": _input_doc(observation_space),
        "output": scripted.output,
        "inside": scripted.inside,
        "outside": ATARI_OUTSIDE if env_id.startswith("ALE/") else [],
        "load": scripted.call or "torch.jit.load(path); policy(torch.as_tensor(obs))",
    }
    return _save(path, scripted.program, doc)


def _input_doc(observation_space: spaces.Box) -> str:
    shape = observation_space.shape
    return (
        f"one observation of shape {list(shape)}, or a batch "
        f"(B, {', '.join(str(s) for s in shape)}), any numeric dtype"
    )


def _save(path: str | os.PathLike[str], program: Any, doc: dict[str, Any]) -> tuple[Path, Path]:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    program.save(str(path))
    meta = path.with_name(path.name + ".json")
    meta.write_text(json.dumps(doc, indent=1) + "\n")
    return path, meta
