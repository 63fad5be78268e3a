"""The greedy policy as a file another runtime runs: ONNX, ``torch.export`` or TorchScript.

::

    export_policy("pong.onnx", AgentSpec("dqn", DQNConfig(hiddens=(512,))), obs_space,
                  act_space, weights, about={"env_id": "ALE/Pong-v5", "env_kwargs": {}})

    # elsewhere, with onnxruntime only:
    session = onnxruntime.InferenceSession("pong.onnx")
    actions = session.run(None, {"obs": obs_batch})[0]        # (B, ...) uint8 -> (B,) int64

    # or with torch only:
    policy = torch.export.load("pong.pt2").module()             # a .pt2 file
    policy = torch.jit.load("pong.pt")                          # a .pt file (TorchScript)
    actions = policy(torch.as_tensor(obs_batch))

The format follows the file's suffix (or ``fmt``, one of :data:`FORMATS`):

============  ==================================  =========================================
suffix        written with                        loaded with
============  ==================================  =========================================
``.onnx``     ``torch.onnx.export`` (its           ``onnxruntime.InferenceSession`` (or any
              ``torch.export``-based exporter)     ONNX runtime); no torch needed
``.pt2``      ``torch.export.export`` +           ``torch.export.load(path).module()``
              ``torch.export.save``
``.pt``       TorchScript (``torch.jit``)          ``torch.jit.load``; libtorch in C++
============  ==================================  =========================================

The program is the agent's own (its builder's ``scripted_policy``: for DQN the
Q-network with the input scaling inside, then ``argmax``; for DPG the actor; for
R2D2 one step of the recurrent network, its state in and out). ``.onnx`` and
``.pt2`` take a batch ``(B, *obs_shape)`` in the observation space's dtype, B
any size from 1 (the batch axis is dynamic; where an exporter cannot keep it so,
the file is written for B = 1 and the JSON says so); a ``.pt`` program also takes
a single observation and any numeric dtype.

``<file>.json`` says how to call it: the env id, kwargs and how episodes are
bounded, the spaces, every input and output (name, dtype, shape; ``"batch"``
where it varies), the recurrent state (zeros at each episode's start), a line of
code for its runtime (``load``), what runs inside the program and the
preprocessing that stays outside it (for ``ALE/`` ids the Atari wrappers that
make the 84x84 frame stack: apply them, e.g.
``apex_dask.algo.envs.atari.wrap_atari``, before calling it).
:mod:`apex_dask.algo.play.exported` plays such a file (``apex-dask-eval --policy``).

Torch 2.13 marks TorchScript deprecated; its warnings (and the exporters'
progress lines) are kept from the caller here and in the player. A ``.pt`` still
loads in torch releases of the last years and in libtorch; ``.pt2`` needs a
recent torch; ``.onnx`` needs no torch at all.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from apex_dask.algo.agents.registry import scripted_policy
from apex_dask.algo.agents.spec import AgentSpec, ScriptedPolicy

__all__ = [
    "FORMAT",
    "FORMATS",
    "ExportError",
    "describe_space",
    "export_policy",
    "format_of",
]

FORMAT = "apex-dask-policy/2"
"""The JSON's ``format``; ``apex-dask-policy/1`` files (TorchScript only) read the same."""

FORMATS = {".onnx": "onnx", ".pt2": "pt2", ".pt": "torchscript"}
"""File suffix -> format name."""

RUNTIMES = {
    "onnx": "onnxruntime (or any ONNX runtime); no torch needed",
    "pt2": "torch (torch.export.load), a release at least as new as the exporting one",
    "torchscript": "torch (torch.jit.load) or libtorch (torch::jit::load)",
}

ATARI_OUTSIDE = [
    "gymnasium.make(env_id, frameskip=1, repeat_action_probability=0.0, **env_kwargs)",
    "no-op starts: 1 to 30 NOOP actions after reset",
    "frame skip 4, max-pooling the last two frames",
    "84x84 grayscale uint8 frames (gymnasium AtariPreprocessing)",
    "FIRE after reset where the game's second action is FIRE",
    "a stack of the last 4 frames on the first axis -> (4, 84, 84)",
    "the same as apex_dask.algo.envs.atari.wrap_atari",
]


class ExportError(ValueError):
    """A policy cannot be written in the format asked for (one line: what and the fix)."""


def format_of(path: str | os.PathLike[str], fmt: str | None = None) -> str:
    """The format of ``path``: ``fmt`` (a name or suffix of :data:`FORMATS`) or its suffix."""
    names = sorted(set(FORMATS.values()))
    if fmt is not None:
        f = fmt.lower().lstrip(".")
        f = FORMATS.get("." + f, f)
        if f not in names:
            raise ExportError(f"unknown export format {fmt!r}; give one of {', '.join(names)}")
        return f
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise ExportError(
            f"cannot tell the export format of {str(path)!r} from its suffix; name the file "
            f"*.onnx, *.pt2 or *.pt, or give the format ({', '.join(names)})"
        )
    return FORMATS[suffix]


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
    fmt: str | None = None,
) -> tuple[Path, Path]:
    """Write the agent's greedy policy to ``path`` in its format (:func:`format_of`) and
    its description to ``path``.json.

    ``about`` joins the JSON (env id, kwargs, where the weights came from); an
    ``env_id`` starting with ``ALE/`` lists the Atari wrappers as outside.
    Returns both paths. :class:`~apex_dask.algo.agents.base.WeightsMismatch` if the
    weights do not fit the agent's network; :class:`ExportError` if the format
    cannot be written (unknown, or an agent with a TorchScript program only).
    """
    kind = format_of(path, fmt)
    scripted = scripted_policy(agent, observation_space, action_space, weights)
    if kind != "torchscript" and scripted.module is None:
        raise ExportError(
            f"the {agent.algo} agent exports TorchScript only; write a .pt file (--format "
            "torchscript)"
        )
    info = dict(about or {})
    env_id = str(info.get("env_id", ""))
    names = _names(scripted)
    doc: dict[str, Any] = {
        "format": FORMAT,
        "file_format": kind,
        "runtime": RUNTIMES[kind],
        **info,
        "observation_space": describe_space(observation_space),
        "action_space": describe_space(action_space),
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "torchscript":
        scripted.program.save(str(path))
        batch: dict[str, Any] = {"dynamic": True, "min": 1}
        example = _example(scripted, observation_space)
    else:
        batch, example = _write_exported(kind, path, scripted, names)
    outputs = _tensors(names[1], _outputs(scripted.module or scripted.program, example), batch)
    doc.update(
        {
            "input": _input_doc(observation_space, kind, batch),
            "output": scripted.output if kind == "torchscript" else _output_doc(outputs),
            "batch": batch,
            "inputs": _tensors(names[0], example, batch),
            "outputs": outputs,
            "state": [
                {"input": n, "output": o, "shape": list(s[1:]), "at_episode_start": "zeros"}
                for n, o, s in zip(names[0][1:], names[1][1:], scripted.state, strict=True)
            ],
            "inside": scripted.inside,
            "outside": ATARI_OUTSIDE if env_id.startswith("ALE/") else [],
            "load": _load_line(kind, scripted, names, observation_space),
        }
    )
    meta = path.with_name(path.name + ".json")
    meta.write_text(json.dumps(doc, indent=1) + "\n")
    return path, meta


def _names(scripted: ScriptedPolicy) -> tuple[list[str], list[str]]:
    """Input and output names: ``obs`` -> ``action``, a recurrent state's ``h, c`` -> ``h_out,
    c_out`` (``state_i`` beyond two tensors)."""
    k = len(scripted.state)
    state = ["h", "c"] if k == 2 else [f"state_{i}" for i in range(k)]
    return ["obs", *state], ["action", *(f"{s}_out" for s in state)]


def _example(scripted: ScriptedPolicy, observation_space: spaces.Space) -> tuple[Any, ...]:
    if scripted.example:
        return tuple(scripted.example)
    obs = torch.as_tensor(np.stack([observation_space.sample() for _ in range(2)]))
    return (obs, *(torch.zeros((2, *s[1:])) for s in scripted.state))


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """No warnings and no progress lines from torch's exporters and loaders reach the
    caller (its console: the CLI's own lines are the story)."""
    with (
        warnings.catch_warnings(),
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
    ):
        warnings.simplefilter("ignore")
        import logging

        logger = logging.getLogger("torch")
        level = logger.level
        logger.setLevel(logging.ERROR)
        try:
            yield
        finally:
            logger.setLevel(level)


def _write_exported(
    kind: str, path: Path, scripted: ScriptedPolicy, names: tuple[list[str], list[str]]
) -> tuple[dict[str, Any], tuple[Any, ...]]:
    """Export ``scripted.module`` with a dynamic batch axis, else for a batch of 1; the batch
    description and the example inputs used."""
    module, example = scripted.module.eval(), tuple(scripted.example)
    batch = torch.export.Dim("batch", min=1)
    dynamic = tuple({0: batch} for _ in example)
    first: Exception | None = None
    for dyn, ex in ((dynamic, example), (None, tuple(x[:1] for x in example))):
        try:
            with quiet(), torch.no_grad():
                if kind == "pt2":
                    program = torch.export.export(module, ex, dynamic_shapes=dyn)
                    torch.export.save(program, str(path))
                else:
                    torch.onnx.export(
                        module,
                        ex,
                        str(path),
                        dynamo=True,
                        dynamic_shapes=dyn,
                        input_names=names[0],
                        output_names=names[1],
                        external_data=False,
                        verbose=False,
                        optimize=True,
                    )
        except ModuleNotFoundError as exc:
            raise ExportError(
                f"writing {kind} needs the package {exc.name!r}: pip install 'apex_dask[export]'"
            ) from None
        except Exception as exc:  # noqa: BLE001 - a dynamic batch axis the exporter refused
            if dyn is None:
                raise ExportError(f"could not export the policy as {kind}: {first or exc}") from exc
            first = exc
            continue
        if dyn is not None:
            return {"dynamic": True, "min": 1}, ex
        return {"dynamic": False, "size": 1, "why": str(first).splitlines()[0][:200]}, ex
    raise AssertionError("unreachable")


def _outputs(program: Any, example: tuple[Any, ...]) -> tuple[Any, ...]:
    with quiet(), torch.no_grad():
        out = program(*example)
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _tensors(names: list[str], tensors: tuple[Any, ...], batch: dict[str, Any]) -> list[dict]:
    axis = "batch" if batch["dynamic"] else int(batch["size"])
    return [
        {"name": n, "dtype": str(t.dtype).removeprefix("torch."), "shape": [axis, *t.shape[1:]]}
        for n, t in zip(names, tensors, strict=True)
    ]


def _output_doc(outputs: list[dict[str, Any]]) -> str:
    parts = [f"{o['name']} {o['dtype']} ({', '.join(str(d) for d in o['shape'])})" for o in outputs]
    text = ", ".join(parts) + ": one row per observation of the batch"
    if len(outputs) > 1:
        text += f"; pass {', '.join(o['name'] for o in outputs[1:])} back with the next observation"
    return text


def _input_doc(observation_space: spaces.Box, kind: str, batch: dict[str, Any]) -> str:
    shape = ", ".join(str(s) for s in observation_space.shape)
    b = "B" if batch["dynamic"] else str(batch["size"])
    if kind == "torchscript":
        return f"one observation of shape [{shape}], or a batch ({b}, {shape}), any numeric dtype"
    return (
        f"a batch ({b}, {shape}) of {observation_space.dtype} observations (one observation: "
        "add a leading axis)"
    )


def _load_line(
    kind: str, scripted: ScriptedPolicy, names: tuple[list[str], list[str]], space: spaces.Box
) -> str:
    ins, outs = names
    state = ""
    if scripted.state:
        size = list(scripted.state[0])
        state = (
            f"; at each episode's start {' = '.join(ins[1:])} = zeros({size}, float32); pass "
            f"{', '.join(outs[1:])} back as {', '.join(ins[1:])} with the next observation"
        )
    if kind == "onnx":
        feed = ", ".join(
            [f"'obs': obs[None].astype('{space.dtype}')", *(f"'{n}': {n}" for n in ins[1:])]
        )
        return (
            "import onnxruntime; session = onnxruntime.InferenceSession(path); "
            f"{', '.join(outs)}, = session.run(None, {{{feed}}}); action[0]{state}"
        )
    if kind == "pt2":
        args = ", ".join(["torch.as_tensor(obs)[None]", *ins[1:]])
        call = (
            f"{', '.join(outs)} = policy({args})" if scripted.state else f"action = policy({args})"
        )
        return f"policy = torch.export.load(path).module(); {call}; action[0]{state}"
    return scripted.call or "torch.jit.load(path); policy(torch.as_tensor(obs))"
