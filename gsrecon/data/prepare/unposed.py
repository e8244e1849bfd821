"""Photos or videos without poses, as ``gsrecon train --data`` trains them: structure from motion first (what
``gsrecon data colmap`` runs), into gsrecon's cache and never into the user's folder, and reused by the next run
while the photos or videos are unchanged."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gsrecon.cache import cache_file
from gsrecon.data.errors import DatasetError, why_missing
from gsrecon.data.formats.images import read_image_size
from gsrecon.data.prepare.sfm import (
    MIN_REGISTERED,
    STAGES,
    SfmReport,
    exit_on_signal,
    image_names,
    import_pycolmap,
    listing,
    remove_partial,
    run_sfm,
)
from gsrecon.errors import InputError

if TYPE_CHECKING:
    from gsrecon.data.prepare.video import VideoFrames, VideoInfo

# gsrecon.data.prepare.video is imported where a video is read: imageio-ffmpeg is for videos only (training needs
# no ffmpeg).

SCENES_CACHE = "scenes"  # the cache of scene folders that structure from motion made from photos or videos
# Given the stages in order, a function that announces each as it starts: (stage name, what it does) -> None.
StageAnnouncer = Callable[[tuple[str, ...]], Callable[[str, str], None]]


@dataclass
class Unposed:
    """Photos or videos without poses: what structure from motion starts from (:func:`find_unposed`)."""

    photos_dir: Path | None = None  # a folder of photos (sub-folders included) ...
    photos: list[Path] = field(default_factory=list)  # ... and the photos in it that can be read
    videos: list[VideoInfo] = field(default_factory=list)  # or videos

    def describe(self) -> str:
        """What the capture is, e.g. ``23 JPG photos (1000x656)``, ``a video (clip.mp4: 1920x1080, 12 s at 30 fps)``."""
        if self.photos_dir is not None:
            kinds = "/".join(sorted({photo.suffix.lstrip(".").upper() for photo in self.photos}))
            return f"{len(self.photos)} {kinds} photos ({'x'.join(map(str, read_image_size(self.photos[0])))})"
        each = ", ".join(
            f"{v.path.name}: {v.width}x{v.height}, {v.duration:.3g} s at {v.fps:.3g} fps" for v in self.videos
        )
        return f"a video ({each})" if len(self.videos) == 1 else f"{len(self.videos)} videos ({each})"


def find_unposed(paths: Sequence[Path]) -> Unposed | None:
    """The photos or videos at ``paths``: video files, or one folder of photos (else of videos); None for one folder
    that holds neither.

    Raises:
        DatasetError: a path that does not exist, is not a video, or a video ffmpeg cannot read; photos of which
            fewer than :data:`MIN_REGISTERED` can be read.
    """
    from gsrecon.data.prepare.video import VIDEO_EXTENSIONS, probe_video

    folder = paths[0] if len(paths) == 1 and paths[0].is_dir() else None
    if folder is None:
        for path in paths:
            if path.is_dir():
                raise DatasetError(f"{path}: --data takes one scene folder, or video files (each with its --data)")
            if not path.is_file() or path.suffix.lower() not in VIDEO_EXTENSIONS:
                what = why_missing(path) if not path.exists() else "is not a video"
                raise DatasetError(
                    f"{path}: {what}; --data takes a scene folder, a folder of photos or videos, or video files "
                    f"({', '.join(VIDEO_EXTENSIONS)})"
                )
        return Unposed(videos=[probe_video(path) for path in paths])
    photos = [folder / name for name in image_names(folder)]
    if photos:
        readable = [photo for photo in photos if _readable(photo)]
        if len(readable) < MIN_REGISTERED:
            unreadable = [photo.relative_to(folder).as_posix() for photo in photos if photo not in readable]
            which = f" (not: {listing(unreadable)})" if unreadable else ""
            raise DatasetError(
                f"{folder}: {len(readable)} of {len(photos)} photos can be read as images{which}; structure from "
                f"motion needs at least {MIN_REGISTERED}"
            )
        return Unposed(photos_dir=folder, photos=readable)
    videos = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in VIDEO_EXTENSIONS)
    return Unposed(videos=[probe_video(path) for path in videos]) if videos else None


def are_videos(paths: Sequence[Path]) -> bool:
    """Whether every path names a video file by its extension."""
    from gsrecon.data.prepare.video import VIDEO_EXTENSIONS

    return all(path.suffix.lower() in VIDEO_EXTENSIONS for path in paths)


def _readable(photo: Path) -> bool:
    try:
        read_image_size(photo)
    except DatasetError:
        return False
    return True


def sfm_scene(unposed: Unposed, announcer: StageAnnouncer, log: Callable[[str], None]) -> Path:
    """The COLMAP scene folder (``images/`` + ``sparse/0/``) that structure from motion makes of ``unposed``: from
    gsrecon's cache when an earlier run made it of the same files (path, size, modification time), else made there
    now, each stage announced (``announcer``) and the outcome logged to ``log``.

    Raises:
        PycolmapUnavailableError: pycolmap is not installed.
        DatasetError: what ``gsrecon data colmap`` refuses (too few images registered, unreadable videos).
        OSError: the cache folder cannot be written.
    """
    inputs = unposed.photos if unposed.photos_dir is not None else [video.path for video in unposed.videos]
    key = {"inputs": [[str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns] for p in inputs]}
    scene = cache_file(SCENES_CACHE, key, "")
    if (scene / "sparse" / "0").is_dir():
        log(f"structure from motion: reusing the scene made of these {unposed.describe()} by an earlier run ({scene})")
        return scene
    import_pycolmap("gsrecon train --data (photos or videos without poses)")
    log(f"structure from motion of {unposed.describe()} into gsrecon's cache ({scene}), reused by the next run")
    partial = scene.with_name(f".{scene.name}.partial{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    try:
        with exit_on_signal("structure from motion", cleanup=lambda: remove_partial(Path(partial))):
            if unposed.photos_dir is not None:
                report = capture_sfm(partial, announcer, photos=unposed.photos_dir)
            else:
                report = capture_sfm(partial, announcer, videos=[video.path for video in unposed.videos])
            os.replace(partial, scene)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    log(report.summary())
    return scene


def capture_sfm(
    out_dir: str | Path,
    announcer: StageAnnouncer,
    *,
    photos: str | Path | None = None,
    videos: Sequence[str | os.PathLike] = (),
    frames: int | None = None,
    fps: float | None = None,
    oversample: int | None = None,
    on_video: Callable[[VideoFrames], None] | None = None,
    **sfm_options: Any,
) -> SfmReport:
    """Structure from motion into ``out_dir`` on a folder of ``photos``, or on the sharpest frames of ``videos``
    (``frames`` or ``fps`` of them, the sharpest of each ``oversample``), each stage announced (``announcer``);
    ``sfm_options`` go to :func:`~gsrecon.data.prepare.sfm.run_sfm`.

    Raises:
        InputError: ``frames``, ``fps`` or ``oversample`` with photos.
        PycolmapUnavailableError, DatasetError: what structure from motion refuses.
    """
    if photos is not None:
        if frames is not None or fps is not None or oversample is not None:
            raise InputError(
                "--frames, --fps and --oversample choose video frames: use them with --video, not --images"
            )
        return run_sfm(str(photos), str(out_dir), on_stage=announcer(STAGES), **sfm_options)
    from gsrecon.data.prepare.video import OVERSAMPLE, VIDEO_STAGES, sfm_from_videos

    return sfm_from_videos(
        videos, str(out_dir), frames=frames, fps=fps, oversample=OVERSAMPLE if oversample is None else oversample,
        on_stage=announcer(VIDEO_STAGES), on_video=on_video, **sfm_options,
    )  # fmt: skip


def announce_stages(log: Callable[[str], None]) -> StageAnnouncer:
    """A :data:`StageAnnouncer` that logs each stage as it starts: ``[2/4] matching: exhaustive matching``."""

    def announcer(stages: tuple[str, ...]) -> Callable[[str, str], None]:
        def on_stage(name: str, what: str) -> None:
            log(f"[{stages.index(name) + 1}/{len(stages)}] {name}: {what}")

        return on_stage

    return announcer
