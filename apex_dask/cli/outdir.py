"""The ``--out`` folder: never another run's files, every file whole.

::

    path = check_out(args.out)             # before anything starts: refuses a used folder
    created = make_out(path)               # then creates it
    write_text(path / "config.yaml", cfg.to_yaml())      # temp file + fsync + rename
    log = ResultsLog(path / "results.jsonl")
    log.append(result)                     # one whole line, fsync'd, per iteration
    save_weights(path, (version, arrays))  # refused (None) if any value is NaN or inf

Rules:

- A new run writes only into a folder that is missing or empty. A folder
  with files in it is refused with one line (exit 2): a run never truncates
  or overwrites another run's ``results.jsonl``, ``config.yaml`` or weights.
  Continuing a run in its own folder is ``--resume`` (the long-runs issue);
  :func:`check_out` takes ``resume=True`` for it. A run refused once
  connected (exit 2, nothing trained) removes what it wrote
  (:func:`discard_unstarted`), so the corrected command can use the folder.
- Every file is written to a temporary name in the same folder, fsync'd and
  renamed over the target, so a reader (or a crash, or a full disk) sees the
  old file or the new one, never a part. A failed write removes its
  temporary file and raises :class:`OutputError` (one line).
- ``results.jsonl`` is append-only: each line is written whole and fsync'd;
  a write that fails part-way is cut back to the previous line end.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = [
    "LOG_NAME",
    "OutputError",
    "ResultsLog",
    "check_out",
    "discard_unstarted",
    "is_run_folder",
    "make_out",
    "remove_if_empty",
    "save_weights",
    "write_bytes",
    "write_json",
    "write_text",
]

LOG_NAME = "apex-dask-submit.log"
"""Tracebacks and Dask's log records of a run (the console gets one line)."""

RUN_FILES = ("config.yaml", "results.jsonl", "final.json", "weights.npz")


class OutputError(Exception):
    """A file under ``--out`` could not be written; the message is one line."""


def _usage(message: str) -> Exception:
    from apex_dask.cli.checks import UsageError

    return UsageError(message)


def is_run_folder(path: Path) -> bool:
    """Whether ``path`` holds the files of an ``apex-dask-submit`` run."""
    return path.is_dir() and any((path / name).exists() for name in RUN_FILES)


def check_out(out: str | None, *, resume: bool = False) -> Path | None:
    """The ``--out`` folder, checked and not yet created (None without ``--out``).

    Refused: a file, a folder with anything in it (unless ``resume`` and it is
    a run folder), a place this user cannot create or write.
    """
    if out is None:
        return None
    path = Path(out).expanduser()
    if path.exists() and not path.is_dir():
        raise _usage(f"--out {out!r} is not writable (it is a file); choose a folder")
    if path.is_dir():
        entries = sorted(p.name for p in path.iterdir())
        if resume:
            if not is_run_folder(path):
                raise _usage(f"--out {out!r} holds no run to resume (no config.yaml)")
        elif entries:
            shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
            kind = "another run's files" if is_run_folder(path) else "files"
            raise _usage(
                f"--out {out!r} already holds {kind} ({shown}); a new run never writes "
                "over them: choose a new or empty folder"
            )
        if not os.access(path, os.W_OK | os.X_OK):
            raise _usage(f"--out {out!r} is not writable (permission denied); choose another")
        return path
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise _usage(
            f"--out {out!r} is not writable (cannot create it in {str(parent)!r}); "
            "choose another folder"
        )
    return path


def make_out(path: Path | None) -> bool:
    """Create the folder checked by :func:`check_out`; whether it was created now."""
    if path is None or path.is_dir():
        return False
    try:
        path.mkdir(parents=True)
    except OSError as exc:
        raise _usage(
            f"--out {str(path)!r} is not writable ({exc.strerror}); choose another"
        ) from None
    return True


def remove_if_empty(path: Path | None) -> None:
    """Remove a folder this run created and never wrote into."""
    if path is not None:
        try:
            path.rmdir()
        except OSError:
            pass


def discard_unstarted(path: Path | None, created: bool) -> None:
    """Remove what a run that never started training wrote (its config, an empty
    ``results.jsonl``, its log), and the folder if this run created it and it is empty."""
    if path is None:
        return
    for name in ("config.yaml", "results.jsonl", LOG_NAME):
        file = path / name
        try:
            if name != "results.jsonl" or file.stat().st_size == 0:
                file.unlink()
        except OSError:
            pass
    if created:
        remove_if_empty(path)


def write_bytes(path: Path, data: bytes) -> None:
    """Replace ``path`` by ``data`` atomically (temp file in the folder, fsync, rename)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:  # a signal included: no temporary file is left behind
        try:
            tmp.unlink()
        except OSError:
            pass
        if not isinstance(exc, OSError):
            raise
        raise OutputError(
            f"cannot write {path} ({exc.strerror or exc}); the previous version, if any, is kept"
        ) from None
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_text(path: Path, text: str) -> None:
    write_bytes(path, text.encode())


def write_json(path: Path, obj: Any, indent: int | None = 1) -> None:
    write_text(path, json.dumps(obj, indent=indent, default=float) + "\n")


def save_weights(out: Path, weights: tuple[int, dict[str, Any]]) -> str | None:
    """Write ``weights.npz`` (``__version__`` + the arrays) atomically.

    Returns None when written, else the one-line reason it was not: weights
    holding NaN or inf never replace a file.
    """
    import io

    import numpy as np

    version, arrays = weights
    bad = [name for name, a in arrays.items() if not np.all(np.isfinite(np.asarray(a)))]
    if bad:
        return (
            f"the learner's weights (version {version}) hold NaN or inf in {bad[0]}; "
            "weights.npz was not written"
        )
    buf = io.BytesIO()
    np.savez(buf, __version__=np.asarray(version), **arrays)
    write_bytes(out / "weights.npz", buf.getvalue())
    return None


class ResultsLog:
    """``results.jsonl``, appended one whole, fsync'd line per result."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as exc:
            raise OutputError(f"cannot open {path} ({exc.strerror})") from None
        self.lines = 0

    def append(self, result: dict[str, Any]) -> None:
        data = (json.dumps(result, default=float) + "\n").encode()
        end = os.fstat(self._fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
            os.fsync(self._fd)
        except OSError as exc:
            try:
                os.ftruncate(self._fd, end)  # never leave a torn line
            except OSError:
                pass
            raise OutputError(
                f"cannot append to {self.path} ({exc.strerror or exc}); it ends at its "
                f"last whole line ({self.lines} results)"
            ) from None
        self.lines += 1

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
