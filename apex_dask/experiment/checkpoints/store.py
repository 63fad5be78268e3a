"""Checkpoint directories: numpy ``.npz`` and JSON only, checksummed, written atomically.

Nothing in a checkpoint is unpickled: a part is one ``.npz`` file loaded with
``allow_pickle=False``, holding the part's arrays and, as the array
``__tree__``, a JSON description of its nesting (dicts with any str/int keys,
lists, numbers, strings, None). A ``manifest.json`` lists every part with its
file's SHA-256 and size, plus the caller's metadata::

    save_checkpoint("runs/x/ckpt", {"learner": learner.state_dict(),
                                    "shard_0": shard.state_dict()},
                    metadata={"timesteps": 12_345, "config": cfg.to_dict()})
    parts, metadata = load_checkpoint("runs/x/ckpt")

Parts written by other processes (each replay shard actor writes its own)
join through a :class:`StagedCheckpoint`: it stages a hidden directory next
to the destination, :func:`write_part` fills it from anywhere that sees the
same filesystem, and :meth:`StagedCheckpoint.commit` writes the manifest,
fsyncs and renames the directory into place. A crash at any moment leaves
the previous complete checkpoint (a directory with a manifest) and at most a
hidden temporary one (:mod:`apex_dask.experiment.checkpoints.folder` removes those
and picks the newest checkpoint that verifies). Any problem on load (a
missing, truncated or altered file, a foreign format, a manifest entry naming
a file outside the checkpoint's folder, an ``.npz`` header declaring more
data than its file holds) raises :class:`DamagedCheckpoint`, a
:class:`CheckpointError`: one line naming the file and the problem. Nothing
is allocated from a declared size before it is checked against the file
(:mod:`apex_dask.experiment.checkpoints.npz_check`).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tempfile
import threading
import time
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from apex_dask.experiment.checkpoints.npz_check import NpzProblem, check_npz

__all__ = [
    "FORMAT",
    "MANIFEST",
    "CheckpointError",
    "CheckpointTimeout",
    "DamagedCheckpoint",
    "StagedCheckpoint",
    "load_checkpoint",
    "read_manifest",
    "read_part",
    "save_checkpoint",
    "verify_checkpoint",
    "write_part",
]

FORMAT = "apex-dask-checkpoint/1"
MANIFEST = "manifest.json"
_TREE = "__tree__"


class CheckpointError(Exception):
    """A checkpoint that cannot be written or read; the message is one line."""


class CheckpointTimeout(CheckpointError):
    """A part whose write did not finish by its deadline (its file is removed)."""


class _PastDeadline(Exception):
    pass


class DamagedCheckpoint(CheckpointError):
    """A checkpoint whose files are not what its manifest says (missing, cut short,
    altered, outside its folder, unreadable): an older checkpoint may still serve."""


# -- trees <-> (JSON, arrays) ---------------------------------------------------
def _encode(obj: Any, arrays: dict[str, np.ndarray]) -> Any:
    if isinstance(obj, np.ndarray | np.generic) and not isinstance(obj, np.str_):
        name = f"a{len(arrays)}"
        arr = np.asarray(obj)
        if arr.dtype == object:
            raise CheckpointError(f"object arrays cannot be checkpointed (key {name})")
        arrays[name] = arr
        return {"__array__": name}
    if hasattr(obj, "detach") and hasattr(obj, "cpu"):  # a torch tensor
        return _encode(obj.detach().cpu().numpy(), arrays)
    if isinstance(obj, Mapping):
        items = [[_encode(k, arrays), _encode(v, arrays)] for k, v in obj.items()]
        return {"__dict__": items}
    if isinstance(obj, list | tuple):
        return {"__list__": [_encode(v, arrays) for v in obj], "tuple": isinstance(obj, tuple)}
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    raise CheckpointError(f"cannot checkpoint a value of type {type(obj).__name__}")


def _decode(obj: Any, arrays: Mapping[str, np.ndarray]) -> Any:
    if isinstance(obj, dict):
        if "__array__" in obj:
            arr = arrays[obj["__array__"]]
            return arr[()] if arr.ndim == 0 else arr
        if "__dict__" in obj:
            return {_decode(k, arrays): _decode(v, arrays) for k, v in obj["__dict__"]}
        if "__list__" in obj:
            values = [_decode(v, arrays) for v in obj["__list__"]]
            return tuple(values) if obj.get("tuple") else values
        raise ValueError(f"unknown node {sorted(obj)}")
    return obj


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


SYNC_EVERY = 16 << 20
"""With a deadline, a part's bytes are synced to disk every this many bytes, so the
deadline is checked against what reached the disk, not the page cache."""


class _HashingStream:
    """A write-only, unseekable stream: hashes the bytes as they go to ``f`` (one pass).

    Unseekable, so ``zipfile`` writes each member's sizes after its data
    instead of seeking back: the bytes hashed are exactly the file's bytes.
    With a ``deadline`` (``time.monotonic()``), a write after it (or once
    ``abandon`` is set) raises, and the bytes are synced every :data:`SYNC_EVERY`.
    """

    def __init__(
        self, f: Any, deadline: float | None = None, abandon: threading.Event | None = None
    ) -> None:
        self._f = f
        self._deadline = deadline
        self._abandon = abandon
        self._unsynced = 0
        self.sha256 = hashlib.sha256()
        self.written = 0

    def write(self, data: bytes) -> int:
        if self._abandon is not None and self._abandon.is_set():
            raise _PastDeadline
        if self._deadline is not None:
            if time.monotonic() > self._deadline:
                raise _PastDeadline
            self._unsynced += len(data)
            if self._unsynced >= SYNC_EVERY:
                self._f.flush()
                os.fdatasync(self._f.fileno())
                self._unsynced = 0
        self.sha256.update(data)
        self.written += len(data)
        return self._f.write(data)

    def flush(self) -> None:
        self._f.flush()

    def read(self, *_: Any) -> bytes:  # numpy takes objects with ``read`` as files
        raise io.UnsupportedOperation("write-only stream")


def _fsync_write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _check_name(name: str) -> None:
    if not name or name != Path(name).name or name.startswith(".") or name == "manifest":
        raise ValueError(f"invalid checkpoint part name {name!r}")


def write_part(
    directory: str | os.PathLike[str],
    name: str,
    tree: Any,
    *,
    deadline: float | None = None,
    abandon: threading.Event | None = None,
) -> dict[str, Any]:
    """Write ``tree`` as ``directory/name.npz`` (fsynced); its manifest entry.

    The entry (``file``, ``sha256``, ``bytes``) goes to
    :meth:`StagedCheckpoint.commit` via :meth:`StagedCheckpoint.add_entry`.
    ``deadline`` (a ``time.monotonic()`` of this process): a write still going
    then stops, its file is removed and :class:`CheckpointTimeout` raised; so
    does a write still going when ``abandon`` is set.
    """
    _check_name(name)
    arrays: dict[str, np.ndarray] = {}
    spec = json.dumps(_encode(tree, arrays))
    arrays[_TREE] = np.frombuffer(spec.encode(), dtype=np.uint8)
    path = Path(directory) / f"{name}.npz"
    try:
        with open(path, "wb") as f:
            stream = _HashingStream(f, deadline, abandon)
            np.savez(stream, **arrays)
            f.flush()
            os.fsync(f.fileno())
    except _PastDeadline:
        path.unlink(missing_ok=True)
        raise CheckpointTimeout(f"{path}: not written by its deadline") from None
    return {"file": path.name, "sha256": stream.sha256.hexdigest(), "bytes": stream.written}


def _part_path(directory: str | os.PathLike[str], entry: Any) -> Path:
    """The file of manifest ``entry`` in ``directory`` (:class:`DamagedCheckpoint` for an
    entry that is not ``{file, sha256, bytes}`` or names a file outside ``directory``)."""
    folder = Path(directory)
    if not isinstance(entry, Mapping):
        raise DamagedCheckpoint(f"{folder / MANIFEST}: a part entry is not a mapping")
    name, digest, size = entry.get("file"), entry.get("sha256"), entry.get("bytes")
    if not isinstance(name, str) or not isinstance(digest, str):
        raise DamagedCheckpoint(f"{folder / MANIFEST}: a part entry has no file name or sha256")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise DamagedCheckpoint(f"{folder / MANIFEST}: part {name!r} has no valid byte count")
    path = folder / name
    inside = name == Path(name).name and name not in ("", ".", "..") and "\\" not in name
    if not inside or path.resolve().parent != folder.resolve():
        raise DamagedCheckpoint(
            f"{folder / MANIFEST}: part file {name!r} is outside the checkpoint folder "
            "(refused; a part is a plain file name inside it)"
        )
    return path


def _check_file(path: Path, entry: Mapping[str, Any], checksum: bool) -> None:
    if not path.is_file():
        raise DamagedCheckpoint(f"{path}: missing (the checkpoint is incomplete)")
    size = path.stat().st_size
    if size != entry["bytes"]:
        raise DamagedCheckpoint(f"{path}: {size} bytes, the manifest says {entry['bytes']}")
    if checksum and _sha256(path) != entry["sha256"]:
        raise DamagedCheckpoint(f"{path}: checksum mismatch (the file was altered or corrupted)")
    try:  # a file whose checksum matches may still declare more than it holds
        check_npz(path)
    except NpzProblem as exc:
        raise DamagedCheckpoint(f"{path}: unreadable ({exc})") from None


def read_part(directory: str | os.PathLike[str], entry: Mapping[str, Any]) -> Any:
    """The tree of one manifest ``entry``, after checking where it is, its size, its arrays'
    declared sizes and its checksum (:class:`DamagedCheckpoint` if any is wrong)."""
    path = _part_path(directory, entry)
    _check_file(path, entry, checksum=True)
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
        spec = json.loads(arrays.pop(_TREE).tobytes().decode())
        return _decode(spec, arrays)
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, io.UnsupportedOperation) as exc:
        raise DamagedCheckpoint(f"{path}: unreadable ({type(exc).__name__}: {exc})") from None


class StagedCheckpoint:
    """A checkpoint being written into a hidden directory beside ``dest``."""

    def __init__(self, dest: str | os.PathLike[str]) -> None:
        self.dest = Path(dest)
        self.dest.parent.mkdir(parents=True, exist_ok=True)
        self.path = Path(tempfile.mkdtemp(prefix=f".{self.dest.name}.tmp-", dir=self.dest.parent))
        self.entries: dict[str, dict[str, Any]] = {}

    def add_part(self, name: str, tree: Any) -> dict[str, Any]:
        """Write one part from this process."""
        entry = write_part(self.path, name, tree)
        self.entries[name] = entry
        return entry

    def add_entry(self, name: str, entry: Mapping[str, Any]) -> None:
        """Record a part another process wrote into :attr:`path` with :func:`write_part`."""
        _check_name(name)
        if not (self.path / str(entry["file"])).is_file():
            raise CheckpointError(
                f"{self.path / str(entry['file'])}: part {name!r} was not written"
            )
        self.entries[name] = dict(entry)

    def commit(self, metadata: Mapping[str, Any] | None = None) -> Path:
        """Write the manifest, then move the directory into place (replacing ``dest``)."""
        manifest = {"format": FORMAT, "parts": self.entries, "metadata": dict(metadata or {})}
        text = json.dumps(manifest, indent=1, default=str)
        _fsync_write(self.path / MANIFEST, text.encode())
        old = None
        if self.dest.exists():
            old = self.dest.parent / f".{self.dest.name}.old-{os.getpid()}"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(self.dest, old)
        os.replace(self.path, self.dest)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        dir_fd = os.open(self.dest.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        return self.dest

    def abort(self) -> None:
        """Remove what was staged."""
        shutil.rmtree(self.path, ignore_errors=True)


def save_checkpoint(
    path: str | os.PathLike[str],
    parts: Mapping[str, Any],
    *,
    metadata: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``parts`` (name -> tree of arrays, numbers, strings) and ``metadata`` (JSON).

    Part names must be plain file names. Returns the checkpoint's path.
    """
    for name in parts:
        _check_name(name)
    staged = StagedCheckpoint(path)
    try:
        for name, tree in parts.items():
            staged.add_part(name, tree)
        return staged.commit(metadata)
    except BaseException:
        staged.abort()
        raise


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of the checkpoint at ``path``, every part entry checked to name a file
    inside ``path`` (:class:`CheckpointError` if none; :class:`DamagedCheckpoint` if bad)."""
    src = Path(path)
    manifest_path = src / MANIFEST
    if not manifest_path.is_file():
        raise CheckpointError(f"{src}: not a checkpoint (no {MANIFEST})")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as exc:
        raise DamagedCheckpoint(f"{manifest_path}: unreadable ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        raise CheckpointError(f"{manifest_path}: format {found!r}, expected {FORMAT!r}")
    parts, metadata = manifest.get("parts"), manifest.setdefault("metadata", {})
    if not isinstance(parts, dict) or not isinstance(metadata, dict):
        raise DamagedCheckpoint(f"{manifest_path}: no parts or metadata mapping")
    for entry in parts.values():
        _part_path(src, entry)
    return manifest


def verify_checkpoint(path: str | os.PathLike[str], *, checksums: bool = True) -> dict[str, Any]:
    """The manifest of ``path`` once every part is checked as :func:`read_part` does
    (without ``checksums``: all but the SHA-256, reading only headers); raises
    :class:`CheckpointError` naming the first problem."""
    manifest = read_manifest(path)
    for entry in manifest["parts"].values():
        _check_file(_part_path(path, entry), entry, checksums)
    return manifest


def load_checkpoint(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(parts, metadata)`` of the checkpoint at ``path``, every file verified."""
    manifest = read_manifest(path)
    parts = {name: read_part(path, entry) for name, entry in manifest["parts"].items()}
    return parts, manifest["metadata"]
