"""Play an exported policy file (``.onnx``, ``.pt2`` or ``.pt`` and its JSON) as a policy.

::

    exported = PolicyFile.read("cartpole.onnx")     # the file's bytes and its JSON
    factory = exported.env_factory()                 # the env the JSON names
    policy = exported.policy()                       # play.episodes' Policy contract
    ret, length = play_episode(factory(), policy, seed=7)

The file runs in its own runtime: ``onnxruntime`` for ``.onnx``,
``torch.export.load`` for ``.pt2``, ``torch.jit.load`` for ``.pt`` (one thread
each, as the evaluators'). A step feeds one observation as a batch of one in the
dtype the JSON names and, for a recurrent program, the state it returned last
(zeros after :meth:`ExportedPolicy.reset`). With probability ``epsilon`` a step
takes a uniform random action drawn as the agents' own policies draw it (for a
``Discrete`` space ``rng.random()`` then ``rng.integers(n)``; for a ``Box``
``rng.uniform(low, high)``), after the program has seen the observation (the
state advances on it): episode for episode the same returns as the run's own
evaluation, whichever the format.

A :class:`PolicyFile` is plain data (bytes and a dict): it pickles, so it
crosses to the workers that play its episodes.
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from apex_dask.algo.play.export import FORMATS, quiet

__all__ = ["ExportedPolicy", "PolicyFile", "PolicyFileError"]


class PolicyFileError(ValueError):
    """A policy file or its JSON cannot be played (one line: what and the fix)."""


@dataclass(frozen=True)
class PolicyFile:
    """An exported policy: the file's bytes, its format and its JSON."""

    name: str
    kind: str
    data: bytes = field(repr=False)
    doc: dict[str, Any] = field(repr=False)

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> PolicyFile:
        """Read ``path`` and ``path``.json (:class:`PolicyFileError` naming what is wrong)."""
        path = Path(path).expanduser()
        meta = path.with_name(path.name + ".json")
        if not path.is_file():
            raise PolicyFileError(
                f"--policy {str(path)!r}: no such file (export one with "
                "`apex-dask-eval RUN --export FILE`)"
            )
        if not meta.is_file():
            raise PolicyFileError(
                f"--policy {str(path)!r}: {meta.name} is missing beside it (it says which env "
                "and how to call the program; export again to write both)"
            )
        try:
            doc = json.loads(meta.read_text())
        except (ValueError, UnicodeDecodeError) as exc:
            raise PolicyFileError(f"{meta}: not valid JSON ({exc})") from None
        if not isinstance(doc, dict) or not str(doc.get("format", "")).startswith(
            "apex-dask-policy/"
        ):
            raise PolicyFileError(f"{meta}: not an apex_dask policy description (no 'format')")
        kind = doc.get("file_format", "torchscript")  # apex-dask-policy/1: TorchScript only
        if kind not in FORMATS.values():
            raise PolicyFileError(f"{meta}: unknown file_format {kind!r}")
        for key in ("env_id", "action_space", "observation_space"):
            if key not in doc:
                raise PolicyFileError(f"{meta}: has no {key!r}; export the policy again")
        return cls(path.name, kind, path.read_bytes(), doc)

    def env_factory(self) -> Any:
        """The env the run trained on (``env_id``, ``env_kwargs`` and the run's wrappers)."""
        from apex_dask.algo.envs.factory import make_env_factory

        env = self.doc.get("env", {})
        return make_env_factory(
            str(self.doc["env_id"]),
            dict(self.doc.get("env_kwargs") or {}),
            clip_rewards=env.get("clip_rewards"),
            repeat_action_probability=float(env.get("repeat_action_probability", 0.0)),
        )

    @property
    def max_episode_steps(self) -> int | None:
        """The run's evaluation bound on an episode's steps, if it had one."""
        steps = self.doc.get("env", {}).get("max_episode_steps")
        return None if steps is None else int(steps)

    def policy(self) -> ExportedPolicy:
        """The program loaded in its runtime (:class:`PolicyFileError` if it will not load)."""
        return ExportedPolicy(self)


class ExportedPolicy:
    """:class:`~apex_dask.algo.agents.spec.Policy` of a :class:`PolicyFile`."""

    def __init__(self, file: PolicyFile) -> None:
        doc = file.doc
        self.kind = file.kind
        inputs = doc.get("inputs") or [{"name": "obs", "dtype": doc["observation_space"]["dtype"]}]
        self.obs_dtype = np.dtype(inputs[0]["dtype"])
        self.obs_name = inputs[0]["name"]
        self.state_specs = [(s["input"], tuple(s["shape"])) for s in doc.get("state", [])]
        space = doc["action_space"]
        self.discrete = space["type"] == "Discrete"
        if self.discrete:
            self.n, self.start = int(space["n"]), int(space["start"])
        else:
            shape = tuple(space["shape"])
            self.low = np.broadcast_to(_bound(space["low"]), shape).astype(space["dtype"])
            self.high = np.broadcast_to(_bound(space["high"]), shape).astype(space["dtype"])
            self.shape, self.dtype = shape, np.dtype(space["dtype"])
        try:
            self._run = _loader(file.kind)(file.data, [i["name"] for i in inputs])
        except ModuleNotFoundError as exc:
            raise PolicyFileError(
                f"playing {file.name} needs the package {exc.name!r}: pip install "
                "'apex_dask[export]'"
            ) from None
        except Exception as exc:  # noqa: BLE001 - the runtime's own words, on one line
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise PolicyFileError(f"{file.name} does not load as {file.kind}: {first}") from None
        self.reset()

    def reset(self) -> None:
        """An episode begins: the recurrent state goes back to zeros."""
        self.state = [np.zeros((1, *shape), np.float32) for _, shape in self.state_specs]

    def act(self, obs: Any, epsilon: float = 0.0, rng: np.random.Generator | None = None) -> Any:
        """The env's action for one observation (see the module docstring)."""
        x = np.ascontiguousarray(np.asarray(obs, self.obs_dtype)[None])
        action, *self.state = self._run(x, *self.state)
        if self.discrete:
            if epsilon > 0.0 and rng is not None and rng.random() < epsilon:
                return int(rng.integers(self.n)) + self.start
            return int(action[0])
        if epsilon > 0.0 and rng is not None and rng.random() < epsilon:
            return rng.uniform(self.low, self.high).astype(self.dtype)
        a = np.asarray(action[0], np.float32)
        return np.clip(a, self.low, self.high).astype(self.dtype).reshape(self.shape)

    def program(self) -> Any:
        raise PolicyFileError("an exported policy is already a program; export the run instead")


def _bound(x: Any) -> np.ndarray:
    conv = {"inf": np.inf, "-inf": -np.inf}
    if isinstance(x, list):
        return np.array([conv.get(v, v) for v in x], np.float64)
    return np.array(conv.get(x, x), np.float64)


def _loader(kind: str) -> Any:
    return {"onnx": _onnx, "pt2": _pt2, "torchscript": _torchscript}[kind]


def _onnx(data: bytes, names: list[str]) -> Any:
    import onnxruntime  # extra: export

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.log_severity_level = 3  # errors only
    session = onnxruntime.InferenceSession(data, options, providers=["CPUExecutionProvider"])

    def run(*arrays: np.ndarray) -> list[np.ndarray]:
        return session.run(None, dict(zip(names, arrays, strict=True)))

    return run


def _torch_runner(program: Any) -> Any:
    import torch

    def run(*arrays: np.ndarray) -> list[np.ndarray]:
        with torch.inference_mode():
            out = program(*(torch.from_numpy(a) for a in arrays))
        out = out if isinstance(out, (tuple, list)) else (out,)
        return [t.numpy() for t in out]

    return run


def _pt2(data: bytes, names: list[str]) -> Any:
    import torch

    torch.set_num_threads(1)
    with quiet():
        program = torch.export.load(io.BytesIO(data)).module()
    return _torch_runner(program)


def _torchscript(data: bytes, names: list[str]) -> Any:
    import torch

    torch.set_num_threads(1)
    with quiet():  # torch.jit is deprecated in 2.13 and says so on load
        program = torch.jit.load(io.BytesIO(data), map_location="cpu")
    return _torch_runner(program)
