"""Video output for rendered camera paths: H.264 ``.mp4`` writing."""

from __future__ import annotations

import errno
import os
import struct
from collections.abc import Iterable
from contextlib import ExitStack
from pathlib import Path

import imageio_ffmpeg
import numpy as np

from gsrecon.atomic import WriteError, atomic_path
from gsrecon.errors import InputError

_ENCODER_STOPPED = "the video encoder (ffmpeg) stopped before its end; is the disk full?"


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
        try:
            self._tmp.touch()  # a folder that cannot be written in is said here in one line, not in ffmpeg's log
        except OSError as exc:
            self._stack.__exit__(type(exc), exc, exc.__traceback__)
            raise
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
        try:
            self._writer.send(np.ascontiguousarray(padded))
        except BrokenPipeError:
            raise WriteError(errno.EPIPE, _ENCODER_STOPPED, str(self.path)) from None
        self.count += 1

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: object) -> None:
        with self._stack:  # leaving it renames the finished file into place, or removes it on an error
            if self._writer is not None:
                self._writer.close()
            if exc is not None:
                raise exc
            if self.count == 0:
                raise ValueError(f"{self.path}: no frames to write")
            if not _whole_mp4(self._tmp):  # ffmpeg stopped before its end; its exit status is not reported
                raise WriteError(errno.EIO, _ENCODER_STOPPED, str(self.path))


def _whole_mp4(path: Path) -> bool:
    """Whether the MP4 file at ``path`` is whole: its top-level boxes fill it exactly, and one of them is its index
    (``moov``), which ffmpeg writes last."""
    size, offset, kinds = path.stat().st_size, 0, set()
    with path.open("rb") as file:
        while offset < size:
            file.seek(offset)
            header = file.read(16)
            if len(header) < 8:
                return False
            length, kind = struct.unpack(">I4s", header[:8])
            if length == 1 and len(header) == 16:  # a 64-bit size follows
                length = struct.unpack(">Q", header[8:])[0]
            elif length == 0:  # to the end of the file
                length = size - offset
            if length < 8:
                return False
            kinds.add(kind)
            offset += length
    return offset == size and b"moov" in kinds


def write_video(path: str | os.PathLike, frames: Iterable[np.ndarray], fps: int = 30) -> int:
    """Encode ``frames`` with a :class:`VideoWriter` into ``path``; return the count."""
    with VideoWriter(path, fps) as writer:
        for frame in frames:
            writer.write(frame)
    return writer.count
