"""The greedy policy as a TorchScript file that plain ``torch`` loads, with a JSON beside it.

::

    export_policy("pong.pt", obs_space, act_space, weights, hiddens=(512,), dueling=True,
                  about={"env_id": "ALE/Pong-v5", "env_kwargs": {}})

    # elsewhere, with torch only:
    policy = torch.jit.load("pong.pt")
    action = policy(torch.as_tensor(obs))            # one observation -> a 0-d int64 tensor
    actions = policy(torch.as_tensor(obs_batch))     # (B, ...) -> (B,) int64

The program is the Q-network with what the env worker applies to an
observation inside it (the input scaling from the space's bounds,
:func:`~apex_dask.algo.networks.input_scale`, and the HWC -> CHW
permutation), then ``argmax`` and the action space's ``start``. It takes the
env's observations as the env returns them, in the space's dtype or any
numeric one. ``<file>.json`` says what it expects: the env id and kwargs,
the observation and action spaces, and the preprocessing that stays outside
the program (for ``ALE/`` ids the Atari wrappers that make the 84x84 frame
stack; apply them, e.g. ``apex_dask.algo.atari.wrap_atari``, or their
equivalent, before calling it).

A ``dpg`` run's policy (:func:`export_dpg_policy`) is its actor mu(s): the
program takes observations as float32 and returns float32 action(s) within
the action space's bounds (the tanh squashing and scaling are inside).

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
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from apex_dask.algo.networks import build_q_network, input_scale, is_image_space
from apex_dask.algo.play import check_weights

__all__ = [
    "FORMAT",
    "DeterministicPolicy",
    "GreedyPolicy",
    "describe_space",
    "export_dpg_policy",
    "export_policy",
]

FORMAT = "apex-dask-policy/1"

ATARI_OUTSIDE = [
    "gymnasium.make(env_id, frameskip=1, repeat_action_probability=0.0, **env_kwargs)",
    "no-op starts: 1 to 30 NOOP actions after reset",
    "frame skip 4, max-pooling the last two frames",
    "84x84 grayscale uint8 frames (gymnasium AtariPreprocessing)",
    "FIRE after reset where the game's second action is FIRE",
    "a stack of the last 4 frames on the first axis -> (4, 84, 84)",
    "the same as apex_dask.algo.atari.wrap_atari",
]


class GreedyPolicy(torch.nn.Module):
    """``forward(obs) -> action``: one observation (rank of the space) or a batch."""

    def __init__(self, q: torch.nn.Module, obs_rank: int, action_start: int) -> None:
        super().__init__()
        self.q = q
        self.obs_rank = obs_rank
        self.action_start = action_start

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        single = obs.dim() == self.obs_rank
        batch = obs.unsqueeze(0) if single else obs
        actions = torch.argmax(self.q(batch), dim=1) + self.action_start
        if single:
            return actions[0]
        return actions


class DeterministicPolicy(torch.nn.Module):
    """``forward(obs) -> action``: a ``dpg`` actor on one observation (rank 1) or a batch."""

    def __init__(self, actor: torch.nn.Module) -> None:
        super().__init__()
        self.actor = actor

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        single = obs.dim() == 1
        batch = obs.unsqueeze(0) if single else obs
        actions = self.actor(batch.float())
        if single:
            return actions[0]
        return actions


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
    observation_space: spaces.Box,
    action_space: spaces.Discrete,
    weights: Mapping[str, Any],
    *,
    hiddens: Sequence[int] = (256,),
    dueling: bool = True,
    about: Mapping[str, Any] | None = None,
) -> tuple[Path, Path]:
    """Write the TorchScript program to ``path`` and its description to ``path``.json.

    ``about`` joins the JSON (env id, kwargs, where the weights came from); an
    ``env_id`` starting with ``ALE/`` lists the Atari wrappers as outside.
    Returns both paths. :class:`~apex_dask.algo.play.WeightsMismatch` if the
    weights do not fit the network.
    """
    net = build_q_network(observation_space, action_space, hiddens, dueling)
    check_weights(net, weights)
    net.load_state_dict({k: torch.as_tensor(np.asarray(v)) for k, v in weights.items()})
    net.eval()
    example = torch.as_tensor(np.stack([observation_space.sample() for _ in range(2)]))
    rank = len(observation_space.shape)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore", DeprecationWarning)  # see the module docstring
        traced = torch.jit.trace(net, example)
        program = torch.jit.script(GreedyPolicy(traced, rank, int(action_space.start)))
    info = dict(about or {})
    env_id = str(info.get("env_id", ""))
    inside = ["Q-network (state dict of the learner's online net)", "argmax over actions"]
    if is_image_space(observation_space):
        scale = input_scale(observation_space)
        inside.insert(0, f"input scaling: observations as float32 times {scale:.10g}")
        if rank == 3 and getattr(net, "channels_last", False):
            inside.insert(1, "HWC -> CHW permutation")
    else:
        inside.insert(0, "observations as float32, no scaling (as the env workers)")
    if action_space.start:
        inside.append(f"plus the action space's start ({int(action_space.start)})")
    doc = {
        "format": FORMAT,
        **info,
        "observation_space": describe_space(observation_space),
        "action_space": describe_space(action_space),
        "input": _input_doc(observation_space),
        "output": "int64 action(s): a 0-d tensor for one observation, (B,) for a batch",
        "inside": inside,
        "outside": ATARI_OUTSIDE if env_id.startswith("ALE/") else [],
        "load": "torch.jit.load(path); policy(torch.as_tensor(obs))",
    }
    return _save(path, program, doc)


def export_dpg_policy(
    path: str | os.PathLike[str],
    observation_space: spaces.Box,
    action_space: spaces.Box,
    weights: Mapping[str, Any],
    *,
    actor_hiddens: Sequence[int] = (256, 256),
    critic_hiddens: Sequence[int] = (256, 256),
    twin_q: bool = True,
    about: Mapping[str, Any] | None = None,
) -> tuple[Path, Path]:
    """:func:`export_policy` for a ``dpg`` run's weights (the whole model, actor and
    critic, as its learner saves them): the program is the actor mu(s)."""
    from apex_dask.algo.dpg_networks import build_dpg_model

    model = build_dpg_model(observation_space, action_space, actor_hiddens, critic_hiddens, twin_q)
    check_weights(model, weights)
    model.load_state_dict({k: torch.as_tensor(np.asarray(v)) for k, v in weights.items()})
    model.eval()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore", DeprecationWarning)  # see the module docstring
        program = torch.jit.script(DeterministicPolicy(model.actor))
    shape = list(action_space.shape)
    doc = {
        "format": FORMAT,
        **dict(about or {}),
        "observation_space": describe_space(observation_space),
        "action_space": describe_space(action_space),
        "input": _input_doc(observation_space),
        "output": f"float32 action(s) within the action space's bounds: {shape} for one "
        f"observation, (B, {', '.join(str(s) for s in shape)}) for a batch",
        "inside": [
            "observations as float32, no scaling (as the env workers)",
            "the actor's ReLU MLP (state dict of the learner's online actor)",
            "center + half * tanh(.), the action space's bounds",
        ],
        "outside": [],
        "load": "torch.jit.load(path); policy(torch.as_tensor(obs))",
    }
    return _save(path, program, doc)


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
