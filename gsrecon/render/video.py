"""Video output for rendered camera paths: H.264 ``.mp4`` writing."""

from __future__ import annotations

import os
from collections.abc import Iterable
from contextlib import ExitStack

import imageio_ffmpeg
import numpy as np

from gsrecon.atomic import atomic_path
from gsrecon.errors import InputError


class VideoWriter:
    """Encodes uint8 ``[H, W, 3]`` frames, all of one size, as an H.264 / yuv420p ``.mp4``, one at a time.

    Odd widths/heights are padded by one replicated row/column (yuv420p needs even sizes). Use it as
    a context manager: the file appears when the block ends without an error (atomically), and is
    left as it was otherwise.

    Raises:
        ValueError: a frame is not uint8 ``[H, W, 3]`` of the first frame's size, there were no frames,
            or ``fps`` is not positive.
    """

    def __init__(self, path: str | os.PathLike, fps: int = 30) -> None:
        if fps <= 0:
            raise InputError(f"video fps must be positive, got {fps}")
        self.path, self.fps, self.count = path, fps, 0
        self._size: tuple[int, ...] | None = None
        self._writer = None

    def __enter__(self) -> VideoWriter:
        self._stack = ExitStack()
        self._tmp = self._stack.enter_context(atomic_path(self.path))
        return self

    def write(self, frame: np.ndarray) -> None:
        frame = np.asarray(frame)
        if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3:
            raise ValueError(f"video frame {self.count}: expected uint8 [H, W, 3], got {frame.dtype} {frame.shape}")
        if self._writer is None:
            self._size = frame.shape
            height, width = frame.shape[0] + frame.shape[0] % 2, frame.shape[1] + frame.shape[1] % 2
            self._writer = imageio_ffmpeg.write_frames(
                str(self._tmp),
                (width, height),
                fps=self.fps,
                codec="libx264",
                pix_fmt_out="yuv420p",
                macro_block_size=1,
                ffmpeg_log_level="error",
                output_params=["-f", "mp4"],
            )
            self._writer.send(None)  # start ffmpeg
        elif frame.shape != self._size:
            raise ValueError(f"video frame {self.count}: size {frame.shape} differs from the first one's {self._size}")
        padded = np.pad(frame, ((0, frame.shape[0] % 2), (0, frame.shape[1] % 2), (0, 0)), mode="edge")
        self._writer.send(np.ascontiguousarray(padded))
        self.count += 1

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: object) -> None:
        with self._stack:  # leaving it renames the finished file into place, or removes it on an error
            if self._writer is not None:
                self._writer.close()
            if exc is not None:
                raise exc
            if self.count == 0:
                raise ValueError(f"{self.path}: no frames to write")


def write_video(path: str | os.PathLike, frames: Iterable[np.ndarray], fps: int = 30) -> int:
    """Encode ``frames`` with a :class:`VideoWriter` into ``path``; return the count."""
    with VideoWriter(path, fps) as writer:
        for frame in frames:
            writer.write(frame)
    return writer.count
