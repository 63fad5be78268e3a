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

__all__ = [
    "MIN_SIDE",
    "EpisodeFrames",
    "quiet_pygame",
    "EpisodeVideo",
    "VideoUnavailable",
    "rgb_frame",
    "video_problem",
]

MIN_SIDE = 160
"""Frames are enlarged (by a whole factor) until the shorter side is at least this."""

INSTALL_HINT = "pip install 'apex_dask[video]'"


class VideoUnavailable(RuntimeError):
    """What recording needs is missing (the encoder, or frames from the env); one line."""


def quiet_pygame() -> None:
    """Let pygame (classic-control frames) render with no display and no sound, without
    its banner; silence the known render warnings (MinAtar declares no render fps and
    renders floats, which :func:`rgb_frame` converts)."""
    for key in ("SDL_VIDEODRIVER", "SDL_AUDIODRIVER"):
        os.environ.setdefault(key, "dummy")
    os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
    warnings.filterwarnings("ignore", message=r".*(render fps|RGB-array rendering)")


def video_problem() -> str | None:
    """Why videos cannot be written in this process (None: they can)."""
    try:
        import imageio_ffmpeg  # noqa: F401  # extra: video
        import moviepy  # noqa: F401  # extra: video
    except ImportError as exc:
        return f"--video needs {exc.name}, which is not installed; {INSTALL_HINT}"
    return None


def rgb_frame(frame: Any, min_side: int = MIN_SIDE, max_side: int | None = None) -> np.ndarray:
    """``uint8`` (H, W, 3) with even sides, enlarged (nearest) by a whole factor to
    ``min_side`` (module docstring), or with ``max_side`` shrunk by striding to it."""
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
    if max_side is not None and max(h, w) > max_side:
        step = -(-max(h, w) // max_side)
        a = a[::step, ::step]
        h, w = a.shape[:2]
    k = max(1, -(-min_side // max(1, min(h, w))))
    if max_side is not None:
        k = max(1, min(k, max_side // max(h, w)))
    if k > 1:
        a = np.repeat(np.repeat(a, k, axis=0), k, axis=1)
    h, w = a.shape[:2]
    if h % 2 or w % 2:
        a = np.pad(a, ((0, h % 2), (0, w % 2), (0, 0)), mode="edge")
    return np.ascontiguousarray(a)


class EpisodeFrames:
    """A few small frames of one episode, for an animation (the ``/apex`` page).

    ``offer(env, step)`` after the reset (step 0) and after each step renders
    the env (``render_mode="rgb_array"``) only on every ``k``-th step; ``k``
    doubles (and every other frame kept is dropped) whenever ``2 * max_frames``
    are held, so a long episode costs few renders and the frames stay evenly
    spread over it. Each is shrunk to at most ``max_side`` pixels.
    :meth:`gif` encodes them (Pillow) at the env's pace.
    """

    def __init__(self, max_frames: int = 60, max_side: int = 96) -> None:
        self.max_frames = int(max_frames)
        self.max_side = int(max_side)
        self.every = 1
        self.frames: list[np.ndarray] = []
        self.failed: str | None = None

    def offer(self, env: gym.Env, step: int) -> None:
        """Render the env on every ``every``-th step; a render that raises (pygame
        missing, say) stops the frames, never the episode (``failed`` says why)."""
        if self.failed is not None or step % self.every:
            return
        try:
            frame = env.render()
        except Exception as exc:  # noqa: BLE001 - an animation is never worth an episode
            self.failed = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
            self.frames = []
            return
        if frame is None:
            return
        self.frames.append(rgb_frame(frame, min_side=self.max_side // 2, max_side=self.max_side))
        if len(self.frames) >= 2 * self.max_frames:
            self.frames = self.frames[::2]
            self.every *= 2

    def gif(self, fps: float = 30.0) -> bytes:
        """An animated GIF that loops, one frame per ``every`` steps at ``fps`` steps/s."""
        import io

        from PIL import Image

        if not self.frames:
            return b""
        images = [Image.fromarray(f) for f in self.frames]
        buf = io.BytesIO()
        ms = max(20, int(1000 * self.every / max(1.0, fps)))
        images[0].save(
            buf, format="GIF", save_all=True, append_images=images[1:], duration=ms, loop=0
        )
        return buf.getvalue()


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
            import imageio.v2 as imageio  # extra: video

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
        quiet_pygame()
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
