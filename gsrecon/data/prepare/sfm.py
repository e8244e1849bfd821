"""Structure from motion with pycolmap: a folder of photos -> a COLMAP scene folder that load_colmap reads.

Output layout (as the 3DGS ``convert.py`` script makes it)::

    <out>/images/          undistorted images
    <out>/sparse/0/        cameras.bin (PINHOLE), images.bin, points3D.bin
    <out>/distorted/       database.db and the raw (distorted) reconstruction

A run replaces these folders (and ``<out>/stereo/``), so the photos must live elsewhere, e.g. in
``<out>/input/`` as with ``convert.py``; :func:`run_sfm` refuses photo folders that overlap them.

Photos of one size share one camera (intrinsics estimated once for the group), so a set taken with one
device is solved with a single camera and a mixed set with one camera per device.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from PIL import Image

from gsrecon.data.errors import DatasetError
from gsrecon.data.formats.colmap_model import read_model
from gsrecon.data.formats.images import IMAGE_EXTENSIONS
from gsrecon.errors import InputError

MATCHERS = ("exhaustive", "sequential")
AUTO_MATCHER = "auto"  # run_sfm picks one of MATCHERS from the image names (see :func:`auto_matcher`)
CAMERA_MODES = ("auto", "per_image")
CAMERA_MODEL = "SIMPLE_RADIAL"  # the COLMAP camera model run_sfm fits unless told otherwise
MIN_REGISTERED = 3
STAGES = ("features", "matching", "mapping", "undistortion")  # run_sfm's stages, in order
MIN_FEATURES = 100  # SIFT features below which a photo is too small, blurred or plain to be matched
_LISTED = 5  # file names quoted in an error message before "and N more"
REPLACED = ("images", "sparse", "stereo", "distorted")  # folders under the output folder that a run replaces
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)  # kill, timeout, Slurm, Kubernetes; Ctrl-C


@dataclass
class SfmReport:
    """What :func:`run_sfm` produced."""

    scene_dir: Path  # the folder to pass to load_colmap
    num_images: int  # images found in the input folder
    num_registered: int  # images with a recovered pose
    num_points: int  # sparse points
    unregistered: list[str]  # names of the input images without a pose
    num_cameras: int  # cameras (intrinsics) in the model: 1 when all registered photos have one size
    seconds: dict[str, float]  # wall-clock time of each stage that ran (:data:`STAGES`, video frames first), in order

    def summary(self) -> str:
        """One line: what was registered and how long each stage took."""
        left_out = f" (not registered: {listing(self.unregistered)})" if self.unregistered else ""
        stages = ", ".join(f"{name} {value:.1f} s" for name, value in self.seconds.items())
        return (
            f"structure from motion: registered {self.num_registered} of {self.num_images} images{left_out}, "
            f"{self.num_points} points, in {sum(self.seconds.values()):.1f} s ({stages})"
        )

    def lines(self) -> list[str]:
        """The report of ``gsrecon data colmap``: what was registered, each stage's time, and how to train on it."""
        stages = ", ".join(f"{name} {value:.1f} s" for name, value in self.seconds.items())
        return [
            f"registered {self.num_registered} of {self.num_images} images with {self.num_cameras} camera(s), "
            f"{self.num_points} points",
            *([f"not registered: {', '.join(self.unregistered)}"] if self.unregistered else []),
            f"time per stage: {stages} (total {sum(self.seconds.values()):.1f} s)",
            f"scene folder: {self.scene_dir} (train with data.dataset=colmap data.path={self.scene_dir})",
        ]


class PycolmapUnavailableError(ImportError, InputError):
    """pycolmap is not installed (an InputError too: the command line reports it as one line, exit 2)."""


def import_pycolmap(command: str) -> ModuleType:
    """The pycolmap module; :class:`PycolmapUnavailableError` saying how to install it for ``command`` if absent.

    Importing it makes its logging library (glog) answer SIGTERM with a native stack trace; what SIGTERM did before
    (in the main thread: gsrecon's stop at a step boundary, or the system's default) is put back.
    """
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main else None
    try:
        import pycolmap
    except ImportError:
        raise PycolmapUnavailableError(f"{command} needs pycolmap: install it with `pip install pycolmap`") from None
    if previous is not None:
        signal.signal(signal.SIGTERM, previous)
    return pycolmap


def remove_partial(folder: Path) -> None:
    """Remove ``folder``, a partial output that native work may still be writing into: renamed aside first, so that
    nothing new lands in it while it is removed (the work names its files by the old path)."""
    aside = folder.with_name(f".{folder.name}.removing-{os.getpid()}")
    try:
        folder.rename(aside)
    except FileNotFoundError:
        return
    shutil.rmtree(aside, ignore_errors=True)


@contextlib.contextmanager
def exit_on_signal(what: str, cleanup: Callable[[], None] | None = None) -> Iterator[None]:
    """Inside the block (native work that may not return to Python for minutes: structure from motion) a SIGTERM or
    Ctrl-C (SIGINT) ends the process at once: ``cleanup`` (a partial output removed), one line on stderr naming
    ``what``, exit 143 or 130 (128 + the signal). Outside the main thread it does nothing.

    The system's handler that Python installs writes the signal's number to a pipe whichever thread it lands on;
    a thread waiting on that pipe acts on it, since the main thread runs no Python until the native call returns.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    read, write = os.pipe()
    os.set_blocking(write, False)
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            numbers = os.read(read, 512)
            received = [signum for signum in STOP_SIGNALS if signum in numbers]
            if received:
                if cleanup is not None:
                    with contextlib.suppress(OSError):  # the native work may still write there: the exit comes first
                        cleanup()
                removed = "; its partial output removed" if cleanup is not None else ""
                sys.stderr.write(f"stopped by {received[0].name} during {what}{removed}\n")
                sys.stderr.flush()
                os._exit(128 + received[0])

    previous_fd = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    previous = {signum: signal.signal(signum, lambda signum, frame: None) for signum in STOP_SIGNALS}  # the watcher's
    watcher = threading.Thread(target=watch, name="signal-watcher", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        os.write(write, b"\0")
        watcher.join()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        signal.set_wakeup_fd(previous_fd)
        os.close(read)
        os.close(write)


def run_sfm(
    images_dir: str,
    out_dir: str,
    camera_model: str = CAMERA_MODEL,
    camera_mode: str = "auto",
    matcher: str = AUTO_MATCHER,
    max_image_size: int = 3200,
    use_gpu: bool = True,
    verbose: bool = False,
    on_stage: Callable[[str, str], None] | None = None,
) -> SfmReport:
    """Run feature extraction, matching, incremental mapping and undistortion on the photos in ``images_dir``.

    Args:
        images_dir: folder of photos (sub-folders allowed).
        out_dir: scene folder to write (created; a previous run's output there is replaced). It must not
            be inside ``images_dir``, and ``images_dir`` must not be inside its ``images/``, ``sparse/``,
            ``stereo/`` or ``distorted/`` folders.
        camera_model: COLMAP model to estimate: "SIMPLE_RADIAL" (robust default), "OPENCV" (strong
            distortion, separate fx/fy; needs many photos), "PINHOLE", ...
        camera_mode: "auto": the photos of each image size share one camera (a single camera when all
            have the same size); "per_image": every photo has its own intrinsics (zoom changed between
            shots, or photos cropped differently).
        matcher: "exhaustive" (any order, up to a few hundred photos), "sequential" (video frames) or "auto"
            (chosen by :func:`auto_matcher`; the matching stage's announcement says which and why).
        max_image_size: photos are downscaled to this longest side for feature extraction.
        use_gpu: use CUDA for SIFT when pycolmap was built with it.
        verbose: let pycolmap log its progress (to stderr); otherwise it logs errors only.
        on_stage: called as each stage starts with its name (:data:`STAGES`) and what it does.

    Raises:
        ValueError: unknown ``camera_mode`` or ``matcher``.
        DatasetError: the folders overlap, no images in ``images_dir``, a photo's size cannot be read
            (``camera_mode="auto"``), or fewer than 3 images registered (the message names the cause when
            the database shows it: unreadable or featureless photos, no matching pairs).
        PycolmapUnavailableError: pycolmap is not installed.
    """
    if camera_mode not in CAMERA_MODES:
        raise ValueError(f"camera_mode must be one of {CAMERA_MODES}, got {camera_mode!r}")
    if matcher not in (*MATCHERS, AUTO_MATCHER):
        raise ValueError(f"matcher must be one of {(*MATCHERS, AUTO_MATCHER)}, got {matcher!r}")
    images_path, out = Path(images_dir), Path(out_dir)
    _check_folders(images_path, out)
    names = _image_names(images_path)
    groups = [names] if camera_mode == "per_image" else _same_size_groups(images_path, names)
    matcher, matching = (
        auto_matcher(images_path, names) if matcher == AUTO_MATCHER else (matcher, f"{matcher} matching")
    )
    pycolmap = import_pycolmap("gsrecon data colmap")
    work = out / "distorted"
    database, mapped = work / "database.db", work / "sparse"
    work.mkdir(parents=True, exist_ok=True)
    database.unlink(missing_ok=True)
    shutil.rmtree(mapped, ignore_errors=True)
    mapped.mkdir()

    clock = _StageClock(on_stage)
    device = pycolmap.Device.auto if use_gpu else pycolmap.Device.cpu
    extraction = pycolmap.FeatureExtractionOptions()
    extraction.max_image_size = max_image_size
    options = mapping_options(pycolmap)
    with pycolmap_logging(pycolmap, verbose):
        clock.start("features", f"SIFT features of {len(names)} photos ({len(groups)} camera group(s))")
        for group in groups:  # with SINGLE, each call adds one camera for its photos
            pycolmap.extract_features(
                database,
                images_path,
                image_names=group,
                camera_mode=pycolmap.CameraMode.PER_IMAGE if camera_mode == "per_image" else pycolmap.CameraMode.SINGLE,
                reader_options=pycolmap.ImageReaderOptions(camera_model=camera_model),
                extraction_options=extraction,
                device=device,
            )
        clock.start("matching", matching)
        match_features(pycolmap, database, matcher, device)
        clock.start("mapping", "incremental mapping (camera poses and 3D points)")
        reconstructions = pycolmap.incremental_mapping(database, images_path, mapped, options=options)
        clock.stop()
    best_index = max(reconstructions, key=lambda index: reconstructions[index].num_reg_images(), default=None)
    registered: set[str] = set()
    if best_index is not None:
        best = reconstructions[best_index]
        registered = {best.images[image_id].name for image_id in best.reg_image_ids()}
    if len(registered) < MIN_REGISTERED:
        found = f"no images out of {len(names)}" if not registered else f"only {len(registered)} of {len(names)} images"
        causes = "".join(f"; {cause}" for cause in _failure_causes(pycolmap, database, names, options.min_num_matches))
        raise DatasetError(
            f"{images_path}: structure from motion registered {found} (at least {MIN_REGISTERED} needed){causes}; "
            "take more overlapping, textured, sharp photos (move around the subject, keep 60-80% overlap between "
            "neighbours, avoid blur)"
        )

    for stale in (out / "images", out / "sparse"):
        shutil.rmtree(stale, ignore_errors=True)
    clock.start("undistortion", f"undistorting the {len(registered)} registered photos into {out / 'images'}")
    with pycolmap_logging(pycolmap, verbose):
        pycolmap.undistort_images(output_path=out, input_path=mapped / str(best_index), image_path=images_path)
    sparse0 = out / "sparse" / "0"
    sparse0.mkdir()
    for model_file in (out / "sparse").glob("*.bin"):
        model_file.rename(sparse0 / model_file.name)
    shutil.rmtree(out / "stereo", ignore_errors=True)  # multi-view stereo set-up, not used by gsrecon
    for script in out.glob("run-colmap-*.sh"):
        script.unlink()
    clock.stop()
    model = read_model(sparse0)
    return SfmReport(
        scene_dir=out,
        num_images=len(names),
        num_registered=len(model.images),
        num_points=len(model.points),
        unregistered=sorted(set(names) - registered),
        num_cameras=len({image.camera_id for image in model.images.values()}),
        seconds=clock.seconds,
    )


def mapping_options(pycolmap: ModuleType) -> object:
    """COLMAP's incremental mapping options, seeded. Its ``min_model_size`` (10) is kept: a later model holding fewer
    photos is dropped and its photos tried again (kept at 3, they split 60 video frames into six models, the largest of
    9)."""
    options = pycolmap.IncrementalPipelineOptions()
    options.random_seed = SFM_SEED
    return options


class _StageClock:
    """Announces stages through an ``on_stage`` callback and times each one until the next starts or ``stop``."""

    def __init__(self, on_stage: Callable[[str, str], None] | None) -> None:
        self.on_stage = on_stage or (lambda name, what: None)
        self.seconds: dict[str, float] = {}  # stage name -> seconds, in the order the stages ran
        self._running: tuple[str, float] | None = None

    def start(self, name: str, what: str) -> None:
        self.stop()
        self.on_stage(name, what)
        self._running = (name, time.perf_counter())

    def stop(self) -> None:
        if self._running is not None:
            name, started = self._running
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started
            self._running = None


_FRAME_NAME = re.compile(r"(.*?)(\d+)")  # a file name's stem: a prefix and a trailing number


def auto_matcher(images_dir: Path, names: list[str]) -> tuple[str, str]:
    """The matcher for the photos ``names`` (sorted relative paths in ``images_dir``): "sequential" when they look
    like the frames of one video (in name order, one common prefix and consecutive numbers: frame_00001.jpg,
    frame_00002.jpg, ...; and no camera model in the first one's EXIF, which a phone's IMG_0001.JPG, IMG_0002.JPG
    ... photos carry), else "exhaustive"; and one sentence saying why.
    """
    stems = [_FRAME_NAME.fullmatch(name.rsplit(".", 1)[0]) for name in names]
    numbers = [int(stem.group(2)) for stem in stems if stem is not None]
    frame_names = (
        len(names) >= MIN_REGISTERED
        and len(numbers) == len(names)
        and len({stem.group(1) for stem in stems if stem is not None}) == 1
        and all(b == a + 1 for a, b in itertools.pairwise(numbers))
    )
    camera = _exif_camera(images_dir / names[0]) if frame_names else ""
    if frame_names and not camera:
        return "sequential", (
            f"sequential matching: the {len(names)} images look like video frames ({names[0]} ... {names[-1]}: "
            "one prefix, consecutive numbers, no camera in the EXIF), so each is matched with its neighbours; "
            "pass --matcher exhaustive to match every pair"
        )
    why = (
        f"are a camera's photos ({camera}, in their EXIF), not video frames"
        if camera
        else "do not look like the frames of one video (one prefix, consecutive numbers)"
    )
    return "exhaustive", (
        f"exhaustive matching: the {len(names)} images {why}, so every pair is matched; pass --matcher sequential "
        "for video frames"
    )


def _exif_camera(path: Path) -> str:
    """The camera make and model an image's EXIF names ("" for none, or an unreadable file)."""
    try:
        with Image.open(path) as image:
            exif = image.getexif()
    except (OSError, ValueError):
        return ""
    return " ".join(str(exif[tag]).strip() for tag in (0x010F, 0x0110) if str(exif.get(tag, "")).strip())  # Make, Model


@contextlib.contextmanager
def pycolmap_logging(pycolmap: ModuleType, verbose: bool) -> Iterator[None]:
    """Inside the block pycolmap logs errors only (everything with ``verbose``); its setting is restored after."""
    previous = pycolmap.logging.minloglevel
    pycolmap.logging.minloglevel = pycolmap.logging.INFO if verbose else pycolmap.logging.ERROR
    try:
        yield
    finally:
        pycolmap.logging.minloglevel = previous


def _same_size_groups(images_dir: Path, names: list[str]) -> list[list[str]]:
    """The photos grouped by image size (width, height), groups in order of size, names in input order."""
    groups: dict[tuple[int, int], list[str]] = {}
    for name in names:
        try:
            with Image.open(images_dir / name) as image:
                size = image.size
        except (OSError, Image.DecompressionBombError) as err:  # PIL.UnidentifiedImageError is an OSError too
            raise DatasetError(f"{images_dir / name}: cannot read the photo ({err}); remove or re-save it") from err
        groups.setdefault(size, []).append(name)
    return [groups[size] for size in sorted(groups)]


SFM_SEED = 0  # pycolmap's verification and mapping draw from this seed (its default, -1, draws a new one each run)


def match_features(pycolmap: ModuleType, database: Path, matcher: str, device: object) -> None:
    """Match the features in ``database``: of every pair of images ("exhaustive") or of neighbours in name
    order ("sequential", for video frames); ``device``: a ``pycolmap.Device``. The same database gives the same
    matches each run (a fixed RANSAC seed; one matching thread, a small share of the time: 2.4 s of the statuette's
    15 s, 1.7 s on two threads)."""
    match = pycolmap.match_exhaustive if matcher == "exhaustive" else pycolmap.match_sequential
    verification = pycolmap.TwoViewGeometryOptions()
    verification.ransac.random_seed = SFM_SEED
    matching = pycolmap.FeatureMatchingOptions()
    matching.num_threads = 1  # on more, pycolmap's CPU matcher leaves a different few pairs unmatched each run
    match(database, matching_options=matching, verification_options=verification, device=device)


def database_counts(pycolmap: ModuleType, database: Path, min_matches: int) -> tuple[dict[str, int], int]:
    """From a pycolmap database: the number of features of each image (by name), and the number of image pairs
    with at least ``min_matches`` geometrically verified matches."""
    db = pycolmap.Database.open(database)
    try:
        features = {image.name: db.num_keypoints_for_image(image.image_id) for image in db.read_all_images()}
        _, geometries = db.read_two_view_geometries()
    finally:
        db.close()
    return features, sum(len(geometry.inlier_matches) >= min_matches for geometry in geometries)


def _failure_causes(pycolmap: ModuleType, database: Path, names: list[str], min_matches: int) -> list[str]:
    """Why mapping registered too few photos, as far as the database shows: photos pycolmap could not read,
    photos with too few features, fewer matched pairs of photos than 3 photos need (empty: not known)."""
    features, matched = database_counts(pycolmap, database, min_matches)
    causes = []
    unread = [name for name in names if name not in features]
    if unread:
        causes.append(f"pycolmap could not read {_photos(len(unread))} ({listing(unread)})")
    plain = [name for name in names if features.get(name, MIN_FEATURES) < MIN_FEATURES]
    if plain:
        causes.append(
            f"{_photos(len(plain))} with fewer than {MIN_FEATURES} features, i.e. too small, blurred or plain "
            f"({listing(plain)})"
        )
    if matched < MIN_REGISTERED - 1:
        pairs = "no two photos share" if matched == 0 else "only one pair of photos shares"
        causes.append(f"{pairs} {min_matches} or more geometrically consistent feature matches")
    return causes


def _photos(count: int) -> str:
    """ "1 photo" or "<count> photos"."""
    return f"{count} photo" if count == 1 else f"{count} photos"


def listing(names: list[str]) -> str:
    """The first few names, comma-separated, and how many more there are."""
    more = f" and {len(names) - _LISTED} more" if len(names) > _LISTED else ""
    return ", ".join(names[:_LISTED]) + more


def _check_folders(images_dir: Path, out: Path) -> None:
    """Refuse photo and output folders where a run would delete the photos or read its own output as photos."""
    photos, out_resolved = images_dir.resolve(), out.resolve()
    if photos == out_resolved or photos in out_resolved.parents:
        raise DatasetError(
            f"{out}: the output folder is, or is inside, the photos folder {images_dir}, so the images it writes would "
            f"be read as photos by the next run; choose an output folder outside {images_dir}"
        )
    for name in REPLACED:
        replaced = out_resolved / name
        if photos == replaced or replaced in photos.parents:
            raise DatasetError(
                f"{images_dir}: the photos are inside {out / name}, which this command deletes and rewrites; "
                f"move them to another folder, e.g. {out / 'input'}, and pass that folder as the photos folder"
            )


def image_names(images_dir: Path) -> list[str]:
    """The image files under ``images_dir`` (sub-folders included) as paths relative to it, sorted; [] where none."""
    return sorted(
        p.relative_to(images_dir).as_posix()
        for p in images_dir.rglob("*")
        if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS
    )


def _image_names(images_dir: Path) -> list[str]:
    """Image files under ``images_dir``, as paths relative to it."""
    if not images_dir.is_dir():
        raise DatasetError(f"{images_dir}: images folder does not exist")
    names = image_names(images_dir)
    if not names:
        raise DatasetError(f"{images_dir}: no images found ({', '.join(IMAGE_EXTENSIONS)})")
    return names
