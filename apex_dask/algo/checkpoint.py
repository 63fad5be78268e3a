"""Checkpoint directories, written atomically.

A checkpoint is a directory holding one pickle file per named part (state
dicts of plain dicts and numpy arrays: the learner, each replay shard, ...)
and a ``metadata.json``::

    save_checkpoint("runs/x/checkpoint", {"learner": learner.state_dict(),
                                          "shard_0": shard.state_dict()},
                    metadata={"timesteps": 12_345, "config": cfg.to_dict()})
    parts, metadata = load_checkpoint("runs/x/checkpoint")

The directory is first written next to its destination under a temporary
name, every file flushed to disk, then renamed into place, so a crash leaves
either the previous checkpoint or the new one, never a half-written one. An
existing checkpoint at the destination is moved aside first and deleted
after the rename. Only load checkpoints you trust: parts are pickles.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["save_checkpoint", "load_checkpoint", "METADATA_FILE"]

METADATA_FILE = "metadata.json"
_SUFFIX = ".pkl"


def _fsync_write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def save_checkpoint(
    path: str | os.PathLike[str],
    parts: Mapping[str, Any],
    *,
    metadata: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``parts`` (name -> picklable object) and ``metadata`` (JSON) to directory ``path``.

    Part names must be plain file names (letters, digits, ``_``, ``-``, ``.``).
    Returns the checkpoint's path.
    """
    dest = Path(path)
    for name in parts:
        if not name or name != Path(name).name or name.startswith(".") or name == "metadata":
            raise ValueError(f"invalid checkpoint part name {name!r}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        for name, obj in parts.items():
            _fsync_write(
                tmp / f"{name}{_SUFFIX}", pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
            )
        meta = {"parts": sorted(parts), **dict(metadata or {})}
        _fsync_write(tmp / METADATA_FILE, json.dumps(meta, indent=2, default=str).encode())
        old = None
        if dest.exists():
            old = dest.parent / f".{dest.name}.old-{os.getpid()}"
            if old.exists():
                shutil.rmtree(old)
            os.replace(dest, old)
        os.replace(tmp, dest)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        dir_fd = os.open(dest.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def load_checkpoint(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(parts, metadata)`` from a directory written by :func:`save_checkpoint`.

    Raises ``FileNotFoundError`` naming the path if it is not a checkpoint.
    """
    src = Path(path)
    meta_path = src / METADATA_FILE
    if not meta_path.is_file():
        raise FileNotFoundError(f"no checkpoint at {str(src)!r} (missing {METADATA_FILE})")
    metadata = json.loads(meta_path.read_text())
    parts = {}
    for name in metadata.get("parts", []):
        with open(src / f"{name}{_SUFFIX}", "rb") as f:
            parts[name] = pickle.load(f)
    return parts, metadata
