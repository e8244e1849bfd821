"""Video input for structure from motion: the sharpest frames of videos, written as images named in time order.

Each video is decoded once with imageio-ffmpeg. Of its frames, ``oversample`` times as many candidates as frames
wanted are spread evenly over the video and split into consecutive windows of about ``oversample`` candidates;
the sharpest candidate of each window is kept and the others (the blurriest) are dropped. Sharpness is the
variance of the Laplacian of the grey image (a blurred frame has weak edges, so a small variance).

Frames are written as JPEG files numbered from 1 in time order, ``frame_00001.jpg`` ... for one video and
``<video name>_00001.jpg`` ... for several, so that names sort in time order and sequential matching pairs
neighbouring frames. The folder appears complete or not at all.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from gsrecon.data.errors import DatasetError
from gsrecon.data.prepare.sfm import REPLACED, STAGES, SfmReport, import_pycolmap, run_sfm
from gsrecon.errors import InputError

VIDEO_EXTENSIONS = (".mp4", ".mov", ".m4v", ".avi", ".mkv", ".webm", ".mts", ".mpg", ".mpeg", ".wmv")  # lower case
BLUR_MEASURE = "variance of the Laplacian"
DEFAULT_FRAMES = 150  # frames kept over all videos when neither a count nor a rate is given
OVERSAMPLE = 3  # candidates per kept frame: the sharpest of each window of 3 is kept
VIDEO_STAGES = ("frames", *STAGES)  # sfm_from_videos' stages, in order
JPEG_QUALITY = 95
_LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)  # Rec. 601 weights of R, G, B


@dataclass
class VideoInfo:
    """What a video's header says about its frames."""

    path: Path
    width: int
    height: int
    fps: float
    duration: float  # seconds
    num_frames: int  # fps x duration: the frames expected when decoding


@dataclass
class VideoFrames:
    """What :func:`extract_frames` took from one video."""

    path: Path
    decoded: int  # frames decoded
    scored: int  # candidate frames whose sharpness was measured
    kept: list[int] = field(default_factory=list)  # indices (in the video) of the frames written, in time order
    names: list[str] = field(default_factory=list)  # their image names
    sharpness: list[float] = field(default_factory=list)  # their sharpness (variance of the Laplacian)

    @property
    def dropped(self) -> int:
        """Candidates dropped as blurrier than the kept frame of their window."""
        return self.scored - len(self.kept)

    def describe(self) -> str:
        """One line: frames decoded, scored, kept and dropped."""
        kept = len(self.kept)
        how = f"the sharpest of each {self.scored / max(kept, 1):.3g} by {BLUR_MEASURE}" if self.dropped else "all"
        return (
            f"{self.path.name}: {self.decoded} frames decoded, {self.scored} scored, kept {kept} ({how}), "
            f"dropped {self.dropped} blurrier ones"
        )


@dataclass
class FrameExtraction:
    """What :func:`extract_frames` wrote."""

    images_dir: Path
    videos: list[VideoFrames]
    seconds: float  # wall-clock time of decoding, scoring and writing

    @property
    def num_frames(self) -> int:
        return sum(len(video.kept) for video in self.videos)


def find_videos(paths: Sequence[str | os.PathLike]) -> list[Path]:
    """The video files named by ``paths``: files as given, folders as the videos directly inside them (by name).

    Raises:
        DatasetError: a path does not exist, a folder holds no videos, or a video is named twice.
    """
    videos: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in VIDEO_EXTENSIONS)
            if not found:
                raise DatasetError(f"{path}: no videos in this folder ({', '.join(VIDEO_EXTENSIONS)})")
            videos.extend(found)
        elif path.is_file():
            videos.append(path)
        else:
            raise DatasetError(f"{path}: video does not exist")
    resolved = [video.resolve() for video in videos]
    twice = next((video for video, key in zip(videos, resolved) if resolved.count(key) > 1), None)
    if twice is not None:
        raise DatasetError(f"{twice}: this video is given twice; name each video once")
    return videos


def probe_video(path: Path) -> VideoInfo:
    """The size, frame rate, duration and expected frame count of a video, from its header.

    Raises:
        DatasetError: ffmpeg cannot read the file as a video (the message quotes ffmpeg's reason).
    """
    import imageio_ffmpeg  # videos only: training, and the commands' arguments, need no ffmpeg

    try:
        reader = imageio_ffmpeg.read_frames(str(path))
        meta = next(reader)
        reader.close()
    except (OSError, RuntimeError, StopIteration) as err:
        raise _unreadable(path, err) from err
    width, height = meta.get("size") or (0, 0)
    fps, duration = float(meta.get("fps") or 0.0), float(meta.get("duration") or 0.0)
    num_frames = round(fps * duration)
    if width <= 0 or height <= 0 or num_frames <= 0:
        raise DatasetError(
            f"{path}: cannot tell the video's frames from its header (size {width}x{height}, {fps:g} fps, "
            f"{duration:g} s); re-encode it, e.g. `ffmpeg -i {path.name} -c:v libx264 fixed.mp4`"
        )
    return VideoInfo(path, width, height, fps, duration, num_frames)


def _unreadable(path: Path, err: BaseException) -> DatasetError:
    """The error for a video ffmpeg could not open, has no video stream, or none of whose frames decodes, with
    ffmpeg's reason (from the stderr an imageio-ffmpeg error quotes)."""
    stderr = str(err).split("=== stderr ===")[-1]
    lines = [re.sub(r"^(\[[^\]]*\] )+", "", line.strip()) for line in stderr.splitlines() if line.strip()]
    opening = next((line for line in lines if line.startswith("Error opening input: ")), None)
    if opening is not None:
        return DatasetError(f"{path}: cannot read the video ({opening.removeprefix('Error opening input: ')})")
    if not any(line.startswith("Stream #") and "Video:" in line for line in lines):
        return DatasetError(f"{path}: cannot read the video (no video stream in the file)")
    failing = [line for line in lines if "error" in line.lower() or "invalid" in line.lower()]
    reason = next((line for line in failing if "Decoding error" in line), failing[0] if failing else lines[-1])
    return _undecodable(path, f"ffmpeg: {reason}")


def _undecodable(path: Path, why: str) -> DatasetError:
    return DatasetError(
        f"{path}: no frame could be decoded ({why}); the video is damaged or in a format ffmpeg cannot decode"
    )


def frame_targets(infos: Sequence[VideoInfo], frames: int | None = None, fps: float | None = None) -> list[int]:
    """Frames to keep from each video: ``fps`` per second of each video, or ``frames`` in all (default
    :data:`DEFAULT_FRAMES`) shared in proportion to duration; at least 1 and at most the video's frame count.

    Raises:
        ValueError: both ``frames`` and ``fps`` given, or one of them not positive.
    """
    if frames is not None and fps is not None:
        raise InputError("give a frame count (--frames) or a frame rate (--fps), not both")
    if fps is not None:
        if not fps > 0:
            raise InputError(f"--fps must be > 0, got {fps}")
        wanted = [fps * info.duration for info in infos]
    else:
        total = DEFAULT_FRAMES if frames is None else frames
        if total < 1:
            raise InputError(f"--frames must be >= 1, got {total}")
        durations = np.array([info.duration for info in infos])
        wanted = list(total * durations / durations.sum())
    return [int(min(max(round(count), 1), info.num_frames)) for count, info in zip(wanted, infos)]


def candidate_windows(num_frames: int, target: int, oversample: int = OVERSAMPLE) -> dict[int, int]:
    """Candidate frames of a video of ``num_frames`` frames and their windows: ``{frame index: window}`` with
    ``min(num_frames, target * oversample)`` candidates spread evenly and ``target`` windows of consecutive ones."""
    count = min(num_frames, target * oversample)
    return {(2 * i + 1) * num_frames // (2 * count): i * target // count for i in range(count)}


def sharpness(image: np.ndarray) -> float:
    """Variance of the Laplacian of the grey image (uint8 ``[H, W, 3]``, grey in [0, 255]): low for a blurred image."""
    grey = image.astype(np.float32) @ _LUMA  # [H, W]
    laplacian = (
        grey[:-2, 1:-1] + grey[2:, 1:-1] + grey[1:-1, :-2] + grey[1:-1, 2:] - 4.0 * grey[1:-1, 1:-1]
    )  # [H - 2, W - 2]
    return float(laplacian.var())


def extract_frames(
    videos: Sequence[str | os.PathLike],
    images_dir: str | os.PathLike,
    frames: int | None = None,
    fps: float | None = None,
    oversample: int = OVERSAMPLE,
    on_stage: Callable[[str, str], None] | None = None,
    on_video: Callable[[VideoFrames], None] | None = None,
    replaced: Sequence[str | os.PathLike] = (),
) -> FrameExtraction:
    """Write the sharpest frames of ``videos`` (files, or folders of videos) into the new folder ``images_dir``.

    Args:
        videos: video files or folders (the videos directly inside, by name), in the order to number them.
        images_dir: folder to create (it may exist if empty); it appears only when every video was read.
        frames, fps: how many frames to keep (see :func:`frame_targets`).
        oversample: candidates scored per kept frame (1: no blur filtering).
        on_stage: called once as ``("frames", what)`` when the videos are probed and decoding starts.
        on_video: called with each video's :class:`VideoFrames` when it is done.
        replaced: folders a later step deletes and rewrites; videos inside them are refused before any work.

    Raises:
        DatasetError: a video is missing, unreadable, yields no frames or lies in a ``replaced`` folder, or
            ``images_dir`` already holds files.
        ValueError: bad ``frames``, ``fps`` or ``oversample``.
    """
    started = time.perf_counter()
    if oversample < 1:
        raise InputError(f"--oversample must be >= 1, got {oversample}")
    out = Path(images_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DatasetError(
            f"{out}: already exists and is not empty; to run structure from motion on the frames in it, pass "
            f"--images {out}, else choose a new --out"
        )
    paths = find_videos(videos)
    for folder in map(Path, replaced):
        inside = next((path for path in paths if folder.resolve() in path.resolve().parents), None)
        if inside is not None:
            raise DatasetError(
                f"{inside}: the video is inside {folder}, which this command deletes and rewrites; move it elsewhere"
            )
    infos = [probe_video(path) for path in paths]
    targets = frame_targets(infos, frames, fps)
    prefixes = _prefixes([info.path for info in infos])
    if on_stage is not None:
        count = f"{len(infos)} videos" if len(infos) > 1 else infos[0].path.name
        on_stage(
            "frames",
            f"{sum(targets)} frames from {count}, the sharpest of each {oversample} candidates by {BLUR_MEASURE}, "
            f"into {out}",
        )
    results = []
    with _new_folder(out) as partial:
        for info, target, prefix in zip(infos, targets, prefixes):
            result = _extract(info, candidate_windows(info.num_frames, target, oversample), partial, prefix)
            if not result.kept:
                raise _undecodable(info.path, f"{info.num_frames} expected from the header")
            results.append(result)
            if on_video is not None:
                on_video(result)
    return FrameExtraction(out, results, time.perf_counter() - started)


def _prefixes(paths: list[Path]) -> list[str]:
    """File name prefixes: "frame" for one video, else each video's name (letters, digits, - and .), made unique."""
    if len(paths) == 1:
        return ["frame"]
    prefixes: list[str] = []
    for path in paths:
        base = re.sub(r"[^A-Za-z0-9.-]+", "-", path.stem).strip("-.") or "video"
        prefix, copy = base, 1
        while prefix in prefixes:
            copy += 1
            prefix = f"{base}-{copy}"
        prefixes.append(prefix)
    return prefixes


@contextmanager
def _new_folder(out: Path) -> Iterator[Path]:
    """A temporary folder beside ``out`` that becomes ``out`` when the block succeeds; on an error it is removed,
    and so are the parents of ``out`` that the block created."""
    created = [parent for parent in (out.parent, *out.parent.parents) if not parent.exists()]
    partial = out.with_name(f".{out.name}.partial{os.getpid()}")
    partial.mkdir(parents=True)
    try:
        yield partial
        os.replace(partial, out)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
        for parent in created:  # innermost first
            if parent.exists() and not any(parent.iterdir()):
                parent.rmdir()


def _extract(info: VideoInfo, windows: dict[int, int], folder: Path, prefix: str) -> VideoFrames:
    """Decode one video and write the sharpest candidate of each window into ``folder`` as ``<prefix>_<n>.jpg``."""
    result = VideoFrames(info.path, decoded=0, scored=0)
    digits = max(5, len(str(max(windows.values()) + 1)))
    best: tuple[int, int, float, np.ndarray] | None = None  # window, frame index, sharpness, image of the best yet

    def write(window_best: tuple[int, int, float, np.ndarray]) -> None:
        _, index, score, image = window_best
        name = f"{prefix}_{len(result.kept) + 1:0{digits}d}.jpg"
        Image.fromarray(image).save(folder / name, quality=JPEG_QUALITY, subsampling=0)
        result.kept.append(index)
        result.names.append(name)
        result.sharpness.append(score)

    import imageio_ffmpeg  # videos only: training, and the commands' arguments, need no ffmpeg

    reader = imageio_ffmpeg.read_frames(str(info.path))
    try:
        width, height = next(reader)["size"]
        for index, data in enumerate(reader):
            result.decoded += 1
            window = windows.get(index)
            if window is None:
                continue
            image = np.frombuffer(data, dtype=np.uint8).reshape(height, width, 3)  # [H, W, 3]
            score = sharpness(image)
            result.scored += 1
            if best is not None and best[0] != window:
                write(best)
                best = None
            if best is None or score > best[2]:
                best = (window, index, score, image.copy())
    except (OSError, RuntimeError) as err:
        raise _unreadable(info.path, err) from err
    finally:
        reader.close()
    if best is not None:
        write(best)
    return result


def sfm_from_videos(
    videos: Sequence[str | os.PathLike],
    out_dir: str,
    *,
    frames: int | None = None,
    fps: float | None = None,
    oversample: int = OVERSAMPLE,
    on_stage: Callable[[str, str], None] | None = None,
    on_video: Callable[[VideoFrames], None] | None = None,
    **sfm_options: Any,
) -> SfmReport:
    """Structure from motion on the sharpest frames of ``videos`` (``gsrecon data colmap --video``): the frames go
    to ``<out_dir>/input/`` (:func:`extract_frames`), then :func:`~gsrecon.data.prepare.sfm.run_sfm` runs on them
    with ``sfm_options``. ``on_stage`` hears each of :data:`VIDEO_STAGES` as it starts.

    Returns:
        The SfM report; its ``seconds`` has the frames' stage first.

    Raises:
        PycolmapUnavailableError: pycolmap is not installed (said before any frame is extracted).
        DatasetError: what :func:`extract_frames` and ``run_sfm`` refuse.
    """
    import_pycolmap("gsrecon data colmap")  # before spending time on the videos
    extraction = extract_frames(
        videos,
        Path(out_dir) / "input",
        frames=frames,
        fps=fps,
        oversample=oversample,
        on_stage=on_stage,
        on_video=on_video,
        replaced=[Path(out_dir) / name for name in REPLACED],
    )
    report = run_sfm(str(extraction.images_dir), out_dir, on_stage=on_stage, **sfm_options)
    return dataclasses.replace(report, seconds={"frames": extraction.seconds, **report.seconds})
