"""A published evaluation protocol, written down once: which scenes, which images at which downscale, which test
views, which background, which steps, how the reference tables computed their metrics, and their numbers."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gsrecon.data.errors import DatasetError

COLMAP, TRANSFORMS = "colmap", "transforms"  # the scene layouts a suite reads


@dataclass(frozen=True)
class Reference:
    """One published result: a method's mean over a suite's scenes (or one scene's), and where it was read."""

    method: str  # e.g. "gsplat-30k"
    steps: int | None  # training steps (None: the method's own schedule, e.g. NeRF's)
    source: str  # where the numbers were read, precisely enough to find them again
    psnr: float | None = None
    ssim: float | None = None
    lpips: float | None = None
    lpips_net: str | None = None  # "alex" (torchmetrics, as gsplat) or "vgg" (the 3DGS paper's lpipsPyTorch)
    train_s: float | None = None
    memory_gb: float | None = None
    gaussians: float | None = None
    hardware: str | None = None
    scene: str | None = None  # None: the mean over the scenes the source lists (``scenes`` says which)
    scenes: tuple[str, ...] = ()  # the scenes a mean is over, where fewer than the suite's


@dataclass(frozen=True)
class Scene:
    """A scene of a suite: its folder name and the images it trains and tests on."""

    name: str
    images: str = "images"  # the published folder of images at the protocol's resolution (e.g. images_4)
    factor: int = 1  # that folder's downscale of images/ (gsrecon's data.factor reads images_<factor>/)
    size: tuple[int, int] | None = None  # (width, height) at the protocol's resolution, where the protocol fixes it


@dataclass(frozen=True)
class Suite:
    """A dataset's published protocol: its scenes and how each reference table trained and scored them."""

    name: str
    layout: str  # COLMAP (images/ + sparse/0/) or TRANSFORMS (transforms_{train,test}.json)
    config: str  # the shipped config the suite trains with (configs/<config>)
    eval_split: str  # gsrecon's data.eval_split: "every_8" (llffhold 8) or "dataset" (transforms_test.json)
    background: str  # "black" or "white"
    scenes: tuple[Scene, ...]
    steps: tuple[int, ...] = (7000, 30000)
    references: tuple[Reference, ...] = ()
    metrics_note: str = ""  # which SSIM and LPIPS the reference tables used
    missing: tuple[str, ...] = ()  # references named by the issue that could not be read, and why
    overrides: tuple[str, ...] = field(default=())  # more key=value pairs of the protocol

    def scene(self, name: str) -> Scene:
        for scene in self.scenes:
            if scene.name == name:
                return scene
        raise DatasetError(f"suite {self.name} has no scene {name!r}; its scenes: {', '.join(self.scene_names)}")

    @property
    def scene_names(self) -> tuple[str, ...]:
        return tuple(scene.name for scene in self.scenes)

    def data_overrides(self, root: Path, scene: Scene) -> list[str]:
        """gsrecon's ``key=value`` pairs that read ``root/<scene>`` as the protocol does (its folder checked first:
        :func:`check_scene`)."""
        factor = check_scene(self, root, scene)
        return [
            f"data.path={root / scene.name}",
            f"data.dataset={self.layout}",
            f"data.factor={factor}",
            f"data.eval_split={self.eval_split}",
            f"data.background={self.background}",
            *self.overrides,
        ]


def check_scene(suite: Suite, root: Path, scene: Scene) -> int:
    """The ``data.factor`` that reads ``root/<scene>`` at the protocol's resolution.

    Raises:
        DatasetError: the scene folder is missing, is in another layout than the suite's, or has no images at the
            protocol's downscale (neither ``scene.images`` nor ``images/`` at ``scene.size``); the message names
            the scene and the path.
    """
    folder = root / scene.name
    if not folder.is_dir():
        raise DatasetError(f"{folder}: suite {suite.name} needs scene {scene.name!r} here, and it is missing")
    if suite.layout == TRANSFORMS:
        for name in ("transforms_train.json", "transforms_test.json"):
            if not (folder / name).is_file():
                raise DatasetError(
                    f"{folder}: scene {scene.name!r} is not in the {suite.name} layout: no {name} (the protocol's "
                    "test views are transforms_test.json's)"
                )
        return 1
    from gsrecon.data.formats.colmap_model import find_sparse_dir, read_model

    try:
        sparse = find_sparse_dir(folder)
    except DatasetError as e:
        raise DatasetError(f"{folder}: scene {scene.name!r} is not in the {suite.name} layout ({e})") from None
    if scene.factor > 1 and (folder / scene.images).is_dir():
        return scene.factor
    if scene.size is not None and (folder / "images").is_dir():
        sizes = {(camera.width, camera.height) for camera in read_model(sparse).cameras.values()}
        if sizes == {scene.size}:
            return 1  # images/ and the model already at the protocol's resolution
    if scene.factor == 1 and (folder / scene.images).is_dir():
        return 1
    at = f" or images/ with a model at {scene.size[0]}x{scene.size[1]}" if scene.size else ""
    raise DatasetError(
        f"{folder / scene.images}: scene {scene.name!r} has no images at the {suite.name} protocol's downscale "
        f"(1/{scene.factor}: {scene.images}/{at})"
    )
