"""Record one episode to MP4 with gymnasium's ``RecordVideo``, as bytes.

::

    rec = EpisodeVideo(render_factory)     # the env made with render_mode="rgb_array"
    ret, length = play_episode(rec.env, policy, seed=7)
    mp4 = rec.finish()                     # bytes of an H.264 MP4, length + 1 frames

The frames are the env's own (``render_mode="rgb_array"``): for Atari the
210x160 colour screen, not the 84x84 grayscale stack the network sees
(``RecordVideo`` wraps the preprocessed env, whose ``render`` reaches the
emulator), for MinAtar its 10x10 grid in its own palette. A frame becomes
``uint8`` RGB (floats in [0, 1], as MinAtar gives, are scaled by 255) and
is enlarged by a whole factor (nearest neighbour) until its shorter side is
at least :data:`MIN_SIDE` pixels, with even sides (H.264's 4:2:0 needs
them). A video holds the reset frame and one frame per step.

``RecordVideo`` collects the frames; :class:`_ImageioRecordVideo` encodes
them with ``imageio`` through the ffmpeg binary that the ``imageio-ffmpeg``
wheel ships, every frame once. (``RecordVideo``'s own writer, moviepy, cuts
the clip at ``frames / fps`` seconds in floating point and so dropped the
last frame of some episodes: 345 of 346 frames at 50 fps. ``RecordVideo``
still checks that moviepy is importable, so the ``video`` extra installs it.) The bytes are returned so that a Dask worker can send them to the
process that writes the files (the workers need not share a filesystem).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["MIN_SIDE", "EpisodeVideo", "VideoUnavailable", "rgb_frame", "video_problem"]

MIN_SIDE = 160
"""Frames are enlarged (by a whole factor) until the shorter side is at least this."""

INSTALL_HINT = "pip install 'apex_dask[video]'"


class VideoUnavailable(RuntimeError):
    """What recording needs is missing (the encoder, or frames from the env); one line."""


def video_problem() -> str | None:
    """Why videos cannot be written in this process (None: they can)."""
    for module in ("imageio_ffmpeg", "moviepy"):
        try:
            __import__(module)
        except ImportError:
            return f"--video needs {module}, which is not installed; {INSTALL_HINT}"
    return None


def rgb_frame(frame: Any) -> np.ndarray:
    """``uint8`` (H, W, 3) with even sides, enlarged to :data:`MIN_SIDE` (module docstring)."""
    a = np.asarray(frame)
    if a.ndim == 2:
        a = np.repeat(a[..., None], 3, axis=2)
    if a.shape[-1] == 4:
        a = a[..., :3]
    if a.dtype != np.uint8:
        f = a.astype(np.float64)
        if f.size and float(np.nanmax(f)) <= 1.0:
            f = f * 255.0
        a = np.clip(np.nan_to_num(f), 0, 255).astype(np.uint8)
    h, w = a.shape[:2]
    k = max(1, -(-MIN_SIDE // max(1, min(h, w))))
    if k > 1:
        a = np.repeat(np.repeat(a, k, axis=0), k, axis=1)
    h, w = a.shape[:2]
    if h % 2 or w % 2:
        a = np.pad(a, ((0, h % 2), (0, w % 2), (0, 0)), mode="edge")
    return np.ascontiguousarray(a)


class _RgbFrames(gym.Wrapper):
    """``render()`` returns :func:`rgb_frame` of the wrapped env's frame."""

    def render(self) -> np.ndarray | None:
        frame = self.env.render()
        return None if frame is None else rgb_frame(frame)


def _recorder_class() -> type:
    from gymnasium.wrappers import RecordVideo

    class _ImageioRecordVideo(RecordVideo):
        """``RecordVideo`` whose clips are written by imageio-ffmpeg, every frame once."""

        def stop_recording(self) -> None:
            import imageio.v2 as imageio

            if self.recorded_frames:
                path = os.path.join(self.video_folder, f"{self._video_name}.mp4")
                with imageio.get_writer(
                    path, fps=self.frames_per_sec, codec="libx264", macro_block_size=2
                ) as writer:
                    for frame in self.recorded_frames:
                        writer.append_data(frame)
            self.recorded_frames = []
            self.recording = False
            self._video_name = None

    return _ImageioRecordVideo


class EpisodeVideo:
    """One recorded episode: play it on :attr:`env`, then :meth:`finish` for the MP4."""

    def __init__(self, render_factory: Callable[[], gym.Env], fps: int | None = None) -> None:
        problem = video_problem()
        if problem:
            raise VideoUnavailable(problem)
        for key in ("SDL_VIDEODRIVER", "SDL_AUDIODRIVER"):  # pygame frames, no display, no sound
            os.environ.setdefault(key, "dummy")
        os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
        # MinAtar declares no render fps and renders floats: known, converted by _RgbFrames
        warnings.filterwarnings("ignore", message=r".*(render fps|RGB-array rendering)")
        self._dir = Path(tempfile.mkdtemp(prefix="apex-video-"))
        base = render_factory()
        if base.render_mode != "rgb_array":
            base.close()
            raise VideoUnavailable(
                f"env {getattr(base.spec, 'id', base)!r} does not render rgb_array frames"
            )
        try:
            self.env = _recorder_class()(
                _RgbFrames(base),
                str(self._dir / "video"),
                episode_trigger=lambda _: True,
                name_prefix="episode",
                fps=fps,
                disable_logger=True,
            )
        except BaseException:
            base.close()
            shutil.rmtree(self._dir, ignore_errors=True)
            raise

    def finish(self) -> bytes:
        """Close the env (which writes the video) and return the MP4's bytes."""
        try:
            self.env.close()
            found = sorted(self._dir.glob("video/*.mp4"))
            if not found:
                raise VideoUnavailable("the recorder wrote no video (the env gave no frames)")
            return found[-1].read_bytes()
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)
