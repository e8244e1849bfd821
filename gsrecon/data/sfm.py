"""Structure from motion with pycolmap: a folder of photos -> a COLMAP scene folder that load_colmap reads.

Output layout (as the 3DGS ``convert.py`` script makes it)::

    <out>/images/          undistorted images
    <out>/sparse/0/        cameras.bin (PINHOLE), images.bin, points3D.bin
    <out>/distorted/       database.db and the raw (distorted) reconstruction

A run replaces these folders (and ``<out>/stereo/``), so the photos must live elsewhere, e.g. in
``<out>/input/`` as with ``convert.py``; :func:`run_sfm` refuses photo folders that overlap them.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from gsrecon.data.colmap_format import read_model
from gsrecon.data.errors import DatasetError
from gsrecon.data.images import IMAGE_EXTENSIONS

MATCHERS = ("exhaustive", "sequential")
MIN_REGISTERED = 3
REPLACED = ("images", "sparse", "stereo", "distorted")  # folders under the output folder that a run replaces


@dataclass
class SfmReport:
    """What :func:`run_sfm` produced."""

    scene_dir: Path  # the folder to pass to load_colmap
    num_images: int  # images found in the input folder
    num_registered: int  # images with a recovered pose
    num_points: int  # sparse points
    unregistered: list[str]  # names of the input images without a pose


def _import_pycolmap():
    try:
        import pycolmap
    except ImportError as err:
        raise ImportError(
            "gsrecon data colmap needs pycolmap: install it with `pip install -e .[sfm]` (or `pip install pycolmap`)"
        ) from err
    return pycolmap


def run_sfm(
    images_dir: str,
    out_dir: str,
    camera_model: str = "SIMPLE_RADIAL",
    single_camera: bool = True,
    matcher: str = "exhaustive",
    max_image_size: int = 3200,
    use_gpu: bool = True,
) -> SfmReport:
    """Run feature extraction, matching, incremental mapping and undistortion on the photos in ``images_dir``.

    Args:
        images_dir: folder of photos (sub-folders allowed).
        out_dir: scene folder to write (created; a previous run's output there is replaced). It must not
            be inside ``images_dir``, and ``images_dir`` must not be inside its ``images/``, ``sparse/``,
            ``stereo/`` or ``distorted/`` folders.
        camera_model: COLMAP model to estimate: "SIMPLE_RADIAL" (robust default), "OPENCV" (strong
            distortion, separate fx/fy; needs many photos), "PINHOLE", ...
        single_camera: all photos share one camera (same device and zoom).
        matcher: "exhaustive" (any order, up to a few hundred photos) or "sequential" (video frames).
        max_image_size: photos are downscaled to this longest side for feature extraction.
        use_gpu: use CUDA for SIFT when pycolmap was built with it.

    Raises:
        ValueError: unknown ``matcher``.
        DatasetError: the folders overlap, no images in ``images_dir``, or fewer than 3 images registered.
        ImportError: pycolmap is not installed.
    """
    if matcher not in MATCHERS:
        raise ValueError(f"matcher must be one of {MATCHERS}, got {matcher!r}")
    images_path, out = Path(images_dir), Path(out_dir)
    _check_folders(images_path, out)
    names = _image_names(images_path)
    pycolmap = _import_pycolmap()
    work = out / "distorted"
    database, mapped = work / "database.db", work / "sparse"
    work.mkdir(parents=True, exist_ok=True)
    database.unlink(missing_ok=True)
    shutil.rmtree(mapped, ignore_errors=True)
    mapped.mkdir()

    device = pycolmap.Device.auto if use_gpu else pycolmap.Device.cpu
    extraction = pycolmap.FeatureExtractionOptions()
    extraction.max_image_size = max_image_size
    pycolmap.extract_features(
        database,
        images_path,
        camera_mode=pycolmap.CameraMode.SINGLE if single_camera else pycolmap.CameraMode.AUTO,
        reader_options=pycolmap.ImageReaderOptions(camera_model=camera_model),
        extraction_options=extraction,
        device=device,
    )
    if matcher == "exhaustive":
        pycolmap.match_exhaustive(database, device=device)
    else:
        pycolmap.match_sequential(database, device=device)
    options = pycolmap.IncrementalPipelineOptions()
    options.min_model_size = MIN_REGISTERED
    reconstructions = pycolmap.incremental_mapping(database, images_path, mapped, options=options)
    if not reconstructions:
        raise DatasetError(
            f"{images_path}: structure from motion registered no images out of {len(names)}; the photos need more "
            "overlap and texture (move around the subject, keep 60-80% overlap between neighbours, avoid blur)"
        )
    best_index, best = max(reconstructions.items(), key=lambda item: item[1].num_reg_images())
    registered = {best.images[image_id].name for image_id in best.reg_image_ids()}
    if len(registered) < MIN_REGISTERED:
        raise DatasetError(
            f"{images_path}: structure from motion registered only {len(registered)} of {len(names)} images "
            f"(at least {MIN_REGISTERED} needed); take more overlapping, textured, sharp photos"
        )

    for stale in (out / "images", out / "sparse"):
        shutil.rmtree(stale, ignore_errors=True)
    pycolmap.undistort_images(output_path=out, input_path=mapped / str(best_index), image_path=images_path)
    sparse0 = out / "sparse" / "0"
    sparse0.mkdir()
    for model_file in (out / "sparse").glob("*.bin"):
        model_file.rename(sparse0 / model_file.name)
    shutil.rmtree(out / "stereo", ignore_errors=True)  # multi-view stereo set-up, not used by gsrecon
    for script in out.glob("run-colmap-*.sh"):
        script.unlink()
    model = read_model(sparse0)
    return SfmReport(
        scene_dir=out,
        num_images=len(names),
        num_registered=len(model.images),
        num_points=len(model.points),
        unregistered=sorted(set(names) - registered),
    )


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


def _image_names(images_dir: Path) -> list[str]:
    """Image files under ``images_dir``, as paths relative to it."""
    if not images_dir.is_dir():
        raise DatasetError(f"{images_dir}: images folder does not exist")
    names = sorted(
        p.relative_to(images_dir).as_posix()
        for p in images_dir.rglob("*")
        if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS
    )
    if not names:
        raise DatasetError(f"{images_dir}: no images found ({', '.join(IMAGE_EXTENSIONS)})")
    return names
