"""The training datapipeline: loads a scene with the reader ``data.dataset`` names (built from its own section,
``data.<name>``), caches its images and serves batches.

Camera sampling is a pure function of (seed, step, rank): each epoch is a fresh seeded permutation
of the training views, the global batch of a step is ``batch_size × world_size`` consecutive views
of that sequence and rank ``r`` takes its own slice. Resuming at any step therefore continues the
exact same sequence, and ranks always see disjoint views within a step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from gsrecon.cameras import CameraModel, Cameras
from gsrecon.config import build_from_config, named_section
from gsrecon.data.formats.images import FACTORS
from gsrecon.data.prefetch import (
    CACHE_MODES,
    FrameDecoder,
    Prefetcher,
    available_device_bytes,
    available_host_bytes,
    choose_cache,
    decode_threads,
    decoded_bytes,
)
from gsrecon.data.scene import Frame, Scene, decoded
from gsrecon.data.splits import EVAL_SPLITS
from gsrecon.errors import InputError
from gsrecon.registry import DATASET_REGISTRY

BACKGROUNDS = ("black", "white", "random")
FISHEYE_MODES = ("undistort", "lens")


@dataclass
class Batch:
    """Views rendered together in one step."""

    images: Tensor  # [B, H, W, 3] float in [0, 1], composited over ``backgrounds`` where RGBA
    cameras: Cameras  # the B cameras the images were seen through (their frames' poses, intrinsics and model)
    backgrounds: Tensor  # [B, 3]
    names: list[str]
    masks: Tensor | None = None  # [B, H, W, 1] float, 1 where a pixel counts in the loss and metrics, 0 where ignored
    depths: Tensor | None = None  # [B, H, W, 1] float metres (`Frame.depth`), 0 where unknown; None: no view has one


class DataPipeline:
    """Owns the :class:`Scene` and turns its frames into :class:`Batch` es on the training device."""

    @dataclass
    class Config:
        dataset: str = (
            "synthetic"  # a DATASET_REGISTRY name: synthetic | colmap | transforms (alias blender) | your own
        )
        path: str = ""  # scene folder (colmap, transforms)
        factor: int = 1  # image downscale factor: 1, 2, 4, 8 (16, 32)
        eval_split: str = "every_8"  # every_8 | none | dataset
        max_images: int = 0  # > 0: use at most this many images (quick runs)
        background: str = "black"  # black | white | random (per step, for RGBA images)
        cache: str = "device"  # uint8 images kept on the training device | cpu | disk (decoded when needed) | auto
        prefetch: int = 4  # cache disk: batches decoded ahead of use, by up to 4 threads
        batch_size: int = 1  # views per step and process
        # Fisheye cameras: undistort (resampled once to the widest pinhole view inside 80 degrees off axis; any
        # renderer) | lens (trained on the whole image through the lens model: the torch renderer projects each
        # Gaussian through it, gsplat uses its unscented transform and needs strategy mcmc or none)
        fisheye: str = "undistort"
        # Read the images, masks, depth maps and point cloud a transforms.json names also where they lie outside its
        # folder (refused otherwise, so that a capture from elsewhere reads nothing else on this machine; a COLMAP
        # model's image names are always inside its images/)
        outside_capture: bool = False
        # The reader's own options, written under its name (``synthetic: {width: 64}``), checked by its Config
        reader: dict[str, Any] = named_section("dataset", DATASET_REGISTRY.names)  # noqa: RUF009 (a dataclasses.field)

        def __post_init__(self) -> None:
            if self.background not in BACKGROUNDS:
                raise ValueError(f"data.background must be one of {', '.join(BACKGROUNDS)}; got '{self.background}'")
            if self.cache not in CACHE_MODES:
                raise ValueError(f"data.cache must be one of {', '.join(CACHE_MODES)}; got '{self.cache}'")
            if self.prefetch < 1:
                raise ValueError(f"data.prefetch must be >= 1, got {self.prefetch}")
            if self.batch_size < 1:
                raise ValueError(f"data.batch_size must be >= 1, got {self.batch_size}")
            if self.factor not in FACTORS:
                raise ValueError(f"data.factor must be one of {', '.join(map(str, FACTORS))}; got {self.factor}")
            if self.eval_split not in EVAL_SPLITS:
                raise ValueError(f"data.eval_split must be one of {', '.join(EVAL_SPLITS)}; got '{self.eval_split}'")
            if self.fisheye not in FISHEYE_MODES:
                raise ValueError(f"data.fisheye must be one of {', '.join(FISHEYE_MODES)}; got '{self.fisheye}'")

    def __init__(
        self,
        cfg: Config,
        device: torch.device,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        select: Callable[[Scene], tuple[Scene, str]] | None = None,
        source: str = "config",
    ) -> None:
        """``select``: the part of the scene to train on and a line saying what it is (a block's, see
        :mod:`gsrecon.partition`); the scene is then read with its pixels left in their files and only the selected
        frames are decoded. ``source`` (the config file) names where a refused value was set."""
        if cfg.dataset not in DATASET_REGISTRY:
            known = ", ".join(DATASET_REGISTRY.names())
            raise InputError(f"{source}: key 'data.dataset': unknown dataset '{cfg.dataset}'; known datasets: {known}")
        self.cfg = cfg
        self.device = device
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.selection_note = ""  # what ``select`` chose, said in the first log line
        if select is None:
            self.scene: Scene = read_scene(cfg)
        else:
            self.scene, self.selection_note = select(read_scene(dataclasses.replace(cfg, cache="disk")))
        if not self.scene.train:
            raise InputError(
                f"{source}: key 'data.path': dataset '{cfg.dataset}' ({cfg.path or 'built-in'}) has no training images"
            )
        if cfg.batch_size > 1 and len({(f.width, f.height) for f in self.scene.train}) > 1:
            raise InputError(
                f"{source}: key 'data.batch_size': > 1 needs training images of one size; this scene mixes sizes"
            )
        if cfg.batch_size > 1 and len({f.camera_model.kind for f in self.scene.train}) > 1:
            raise InputError(
                f"{source}: key 'data.batch_size': > 1 needs one kind of camera; this scene mixes fisheye and pinhole "
                "images (data.fisheye: lens): use batch_size 1 or data.fisheye=undistort"
            )
        self.cache, self.cache_note = self._choose_cache()
        self.mask_note = _mask_note(self.scene)  # "" without masks
        cache_device = device if self.cache == "device" else torch.device("cpu")
        self._train = [_to_device(f if self.cache == "disk" else f.decoded(), cache_device) for f in self.scene.train]
        self._test = [_to_device(f if self.cache == "disk" else f.decoded(), cache_device) for f in self.scene.test]
        self.decoder: FrameDecoder | None = None  # cache disk: decodes the frames of the batches to come
        if self.cache == "disk":
            self.decoder = FrameDecoder(decode_threads(cfg.prefetch, cfg.batch_size))
            self._train_ahead = Prefetcher(self.decoder, self._train, self.train_indices, cfg.prefetch)
            self._val_ahead = Prefetcher(self.decoder, self._test, self._val_indices, cfg.prefetch)
        # On the device once: a per-step copy from the host would wait for the GPU (PyTorch syncs blocking copies).
        self._background = self.fixed_background().to(device)  # [3]

    @property
    def notes(self) -> list[str]:
        """What the first log line says about the data: where the images are kept, the masks, the part selected."""
        return [note for note in (self.cache_note, self.mask_note, self.selection_note) if note]

    @property
    def train_frames(self) -> list[Frame]:
        """The training frames as served: on the cache's device (poses float32), or their pixels left in files."""
        return self._train

    @property
    def num_train(self) -> int:
        return len(self._train)

    @property
    def num_val(self) -> int:
        return len(self._test)

    def train_indices(self, step: int) -> list[int]:
        """Indices of the training views this rank renders at ``step``."""
        n, b = len(self._train), self.cfg.batch_size
        start = (step * self.world_size + self.rank) * b
        indices = []
        for position in range(start, start + b):
            epoch, offset = divmod(position, n)
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            indices.append(int(torch.randperm(n, generator=generator)[offset]))
        return indices

    def next_train(self, step: int) -> Batch:
        """The training batch of ``step`` (deterministic in seed, step and rank)."""
        if self.decoder is not None:
            frames = self._train_ahead.get(step)
        else:
            frames = [self._train[i] for i in self.train_indices(step)]
        if self.cfg.background == "random":
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + 7919 * step + self.rank)
            backgrounds = torch.rand(len(frames), 3, generator=generator)
        else:
            backgrounds = self._background.expand(len(frames), 3).contiguous()  # [B, 3]
        return self._batch(frames, backgrounds.to(self.device))

    def val_batches(self) -> Iterator[Batch]:
        """One batch per validation view, over the fixed background (black for ``random``)."""
        for index, frame in enumerate(self._test):  # no decoded frame is held while the batch is used
            yield self._batch(
                self._val_ahead.get(index) if self.decoder is not None else [frame], self._background[None]
            )

    def train_batches(self) -> Iterator[Batch]:
        """Every training view once, a batch each, over the fixed background (black for ``random``)."""
        for index in range(len(self._train)):
            yield self.train_view(index)

    def train_view(self, index: int) -> Batch:
        """The training view ``index`` alone, over the fixed background (black for ``random``)."""
        return self._batch([self._train[index]], self._background[None])

    def fixed_background(self) -> Tensor:
        """The background colour used where it is not random, [3]."""
        return fixed_background(self.cfg)

    def _val_indices(self, index: int) -> list[int]:
        return [index] if index < len(self._test) else []

    def _choose_cache(self) -> tuple[str, str]:
        """(where decoded images are kept: device | cpu | disk, the sentence the first log line gives for it)."""
        mode = self.cfg.cache
        if mode == "auto":
            needed = decoded_bytes(self.scene.train + self.scene.test)
            chosen, why = choose_cache(needed, self.device, available_device_bytes(self.device), available_host_bytes())
            return chosen, f"data.cache auto chose {chosen}: {why}"
        if mode == "disk":
            threads = decode_threads(self.cfg.prefetch, self.cfg.batch_size)
            return mode, (
                f"images decoded from disk when needed, {self.cfg.prefetch} batches ahead by {threads} threads "
                "(data.cache: disk)"
            )
        where = self.device if mode == "device" else "cpu"
        return mode, f"images decoded once and kept on {where} (data.cache: {mode})"

    def _batch(self, frames: list[Frame], backgrounds: Tensor) -> Batch:
        images = torch.stack([f.image.to(self.device) for f in frames]).float() / 255.0  # [B, H, W, 3|4]
        if images.shape[-1] == 4:
            alpha = images[..., 3:]
            images = images[..., :3] * alpha + backgrounds[:, None, None, :] * (1.0 - alpha)
        return Batch(
            images=images,
            cameras=Cameras(
                viewmats=torch.stack([f.viewmat for f in frames]).to(self.device),
                Ks=torch.stack([f.K for f in frames]).to(self.device),
                width=frames[0].width,
                height=frames[0].height,
                model=CameraModel.stack([f.camera_model for f in frames]).to(self.device),
            ),
            backgrounds=backgrounds,
            names=[f.name for f in frames],
            masks=self._masks(frames),
            depths=self._depths(frames),
        )

    def _masks(self, frames: list[Frame]) -> Tensor | None:
        """[B, H, W, 1] float of the frames' masks (ones for a frame without one); None where none has one."""
        if all(f.mask is None for f in frames):
            return None
        masks = [torch.ones(f.height, f.width, dtype=torch.bool) if f.mask is None else decoded(f.mask) for f in frames]
        return torch.stack([m.to(self.device) for m in masks]).float()[..., None]

    def _depths(self, frames: list[Frame]) -> Tensor | None:
        """[B, H, W, 1] float of the frames' depth maps (zeros for a frame without one); None where none has one."""
        if all(f.depth is None for f in frames):
            return None
        depths = [torch.zeros(f.height, f.width) if f.depth is None else decoded(f.depth) for f in frames]
        return torch.stack([d.to(self.device) for d in depths]).float()[..., None]


def fixed_background(cfg: DataPipeline.Config) -> Tensor:
    """[3] the background colour a run of the data config ``cfg`` draws where it is not random (black for
    ``random``)."""
    return torch.ones(3) if cfg.background == "white" else torch.zeros(3)


def _mask_note(scene: Scene) -> str:
    """The log line saying how many frames have masks and what they do; "" where none has one."""
    frames = scene.train + scene.test
    masked = sum(f.mask is not None for f in frames)
    if masked == 0:
        return ""
    unmasked = f" ({len(frames) - masked} have none: all their pixels count)" if masked < len(frames) else ""
    return (
        f"masks: {masked} of {len(frames)} images have one{unmasked}; the loss and the test-view metrics "
        "(PSNR, SSIM over kept pixels; LPIPS with masked pixels blacked out) ignore their masked pixels"
    )


def _to_device(frame: Frame, device: torch.device) -> Frame:
    """``frame`` with its tensors on ``device`` (poses as float32); pixels left in files stay there."""
    fields = {f.name: getattr(frame, f.name) for f in dataclasses.fields(frame)}
    moved = {name: value.to(device) for name, value in fields.items() if isinstance(value, Tensor)}
    moved |= {"viewmat": frame.viewmat.float().to(device), "K": frame.K.float().to(device)}
    moved["camera_model"] = frame.camera_model.to(device)
    return dataclasses.replace(frame, **moved)


def read_scene(cfg: DataPipeline.Config) -> Scene:
    """The scene the reader ``cfg.dataset`` reads (built from its section ``data.<dataset>``); its pixels are left in
    their files with ``cfg.cache`` disk or auto."""
    reader = build_from_config(DATASET_REGISTRY.get(cfg.dataset), cfg.reader, prefix=f"data.{cfg.dataset}")
    return reader.read(cfg)


def folder_arguments(cfg: DataPipeline.Config, layout: str) -> dict[str, Any]:
    """The arguments the folder readers (colmap, transforms) take from ``data:``: ``path`` (refused when empty,
    ``layout`` saying what the folder holds), factor, eval_split, max_images, lazy and keep_fisheye."""
    if not cfg.path:
        raise InputError(f"data.path is empty; set data.path=/path/to/scene ({layout})")
    return {
        "path": cfg.path,
        "factor": cfg.factor,
        "eval_split": cfg.eval_split,
        "max_images": cfg.max_images,
        "lazy": cfg.cache in ("disk", "auto"),
        "keep_fisheye": cfg.fisheye == "lens",
    }
