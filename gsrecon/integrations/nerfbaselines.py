"""gsrecon as a nerfbaselines method (nerfbaselines 1.2.12's ``Method`` protocol): trains on the dataset nerfbaselines
loads, one gsrecon step per ``train_iteration``, and renders the views nerfbaselines asks for.

The dataset is written once into a temporary transforms.json scene folder (PNG images, per-frame pinhole
intrinsics, the SfM points as a PLY), which gsrecon's own reader reads: nothing of nerfbaselines' loaders is
reimplemented. ``--set KEY=VALUE`` are gsrecon config overrides (``max_steps=7000``, ``num_threads=1``); ``config``
names the shipped YAML (default mipnerf360.yaml; the blender preset: blender_lego.yaml). The class follows the
protocol without importing nerfbaselines (which pins numpy<2), so that gsrecon's own environment can import it.

:func:`write_torchvision_backbones` writes torchvision's AlexNet and VGG16 weights files (the convolutions, from
gsrecon's LPIPS backbones: ``gsrecon weights lpips``) where torch's hub looks, so that nerfbaselines' LPIPS scores
offline (scripts/nerfbaselines_check.sh).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gsrecon.atomic import atomic_path
from gsrecon.cameras import Cameras
from gsrecon.data.formats.images import write_png
from gsrecon.data.prepare.detect import CONFIGS_DIR
from gsrecon.data.readers.transforms import OPENGL_TO_OPENCV
from gsrecon.engine.build import build_scene_renderer
from gsrecon.engine.checkpoints import capture
from gsrecon.engine.inference import load_trained_scene
from gsrecon.engine.resolve import load_run_config
from gsrecon.engine.trainer import DefaultTrainer
from gsrecon.errors import InputError
from gsrecon.logging.console import Logger

CHECKPOINT = "gsrecon.pt"  # in the folder nerfbaselines saves the method to
DEFAULT_CONFIG = "mipnerf360.yaml"
PINHOLE = 0  # nerfbaselines' camera_model_to_int("pinhole"): the first of its CameraModel literals
TORCHVISION_FILES = {"alex": ("alexnet", "alexnet-owt-7be5be79.pth"), "vgg": ("vgg16", "vgg16-397923af.pth")}


def write_scene(dataset: dict[str, Any], folder: Path) -> Path:
    """A nerfbaselines dataset (``cameras``: poses [N, 3, 4] camera-to-world in OpenCV axes, intrinsics [N, 4] fx fy
    cx cy, image_sizes [N, 2]; ``images`` [N][H, W, 3|4] uint8; ``points3D_xyz`` / ``points3D_rgb`` or None) as a
    transforms.json scene folder in ``folder``."""
    import json

    from gsrecon.io.ply import write_points_ply

    cameras = dataset["cameras"]
    (folder / "images").mkdir(parents=True, exist_ok=True)
    frames = []
    for index, image in enumerate(dataset["images"]):
        c2w = np.concatenate([cameras.poses[index], [[0.0, 0.0, 0.0, 1.0]]])  # [4, 4] OpenCV
        fx, fy, cx, cy = (float(v) for v in cameras.intrinsics[index])
        width, height = (int(v) for v in cameras.image_sizes[index])
        path = f"images/{index:05d}.png"
        write_png(folder / path, np.asarray(image)[:height, :width])
        frames.append({
            "file_path": path, "transform_matrix": (c2w @ OPENGL_TO_OPENCV).tolist(),
            "fl_x": fx, "fl_y": fy, "cx": cx, "cy": cy, "w": width, "h": height,
        })  # fmt: skip
    content: dict[str, Any] = {key: frames[0][key] for key in ("fl_x", "fl_y", "cx", "cy", "w", "h")}
    if dataset.get("points3D_xyz") is not None and len(dataset["points3D_xyz"]):
        write_points_ply(folder / "points.ply", dataset["points3D_xyz"], dataset["points3D_rgb"])
        content["ply_file_path"] = "points.ply"
    (folder / "transforms.json").write_text(json.dumps(content | {"frames": frames}))
    return folder


def _background(dataset: dict[str, Any]) -> str:
    colour = dataset.get("metadata", {}).get("background_color")
    return "white" if colour is not None and np.all(np.asarray(colour) == 255) else "black"


class GsreconMethod:
    """gsrecon's trainer behind nerfbaselines' Method protocol."""

    def __init__(
        self,
        *,
        checkpoint: str | None = None,
        train_dataset: dict[str, Any] | None = None,
        config_overrides: dict[str, Any] | None = None,
    ) -> None:
        self._logger = Logger()
        self._trainer: DefaultTrainer | None = None
        if checkpoint is not None:
            scene = load_trained_scene(checkpoint=str(Path(checkpoint) / CHECKPOINT))
            self._cfg, self._params, self._step = scene.cfg, scene.params, scene.step or 0
            self._degree = scene.sh_degree
        elif train_dataset is None:
            raise InputError("gsrecon's nerfbaselines method needs a checkpoint or a train dataset")
        else:
            self._start(train_dataset, dict(config_overrides or {}))
        self._device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self._renderer = build_scene_renderer(self._cfg, self._device, self._logger)

    def _start(self, dataset: dict[str, Any], overrides: dict[str, Any]) -> None:
        self._workdir = tempfile.TemporaryDirectory(prefix="gsrecon-nerfbaselines-")
        work = Path(self._workdir.name)
        config = str(CONFIGS_DIR / str(overrides.pop("config", DEFAULT_CONFIG)))
        keys = [
            f"data.path={write_scene(dataset, work / 'scene')}", "data.dataset=transforms", "data.factor=1",
            "data.eval_split=none", f"data.background={_background(dataset)}", f"exp_dir={work / 'run'}",
            "writers=[]", *(f"{key}={value}" for key, value in overrides.items()),
        ]  # fmt: skip
        cfg, source = load_run_config(config, keys)
        cfg.hooks = {key: None for key in cfg.hooks or {}}  # nerfbaselines logs, checkpoints and evaluates
        self._trainer = DefaultTrainer(cfg, source=source, logger=self._logger)
        self._cfg = cfg

    @classmethod
    def get_method_info(cls) -> dict[str, Any]:
        """nerfbaselines' MethodInfo: colour images through pinhole cameras (it undistorts others first), and the
        dataset's SfM points to start from."""
        return {
            "method_id": "gsrecon",
            "required_features": frozenset(("color", "points3D_xyz")),
            "supported_camera_models": frozenset(("pinhole",)),
            "supported_outputs": ("color",),
            "can_resume_training": False,
        }

    def get_info(self) -> dict[str, Any]:
        """nerfbaselines' ModelInfo: the steps to train (``max_steps``) and the step a checkpoint was saved at."""
        return {
            **self.get_method_info(),
            "num_iterations": self._cfg.max_steps,
            "loaded_step": None if self._trainer is not None else self._step,
        }

    def train_iteration(self, step: int) -> dict[str, float]:
        trainer = self._trainer
        if trainer is None:
            raise InputError("a gsrecon model loaded from a checkpoint renders only; train from a dataset")
        trainer.run_step()
        return {"loss": float(trainer.outputs["loss"]), "num_gaussians": float(trainer.outputs["num_gaussians"])}

    def render(self, camera: Any, *, options: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
        """The colour [H, W, 3] float32 of one pinhole nerfbaselines camera."""
        camera = camera.item()
        if int(camera.camera_models) != PINHOLE:
            raise InputError("gsrecon's nerfbaselines method renders pinhole cameras only")
        c2w = torch.eye(4, dtype=torch.float64)
        c2w[:3] = torch.from_numpy(np.asarray(camera.poses, dtype=np.float64))
        fx, fy, cx, cy = (float(v) for v in camera.intrinsics)
        K = torch.tensor([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]])
        width, height = (int(v) for v in camera.image_sizes)
        cameras = Cameras(torch.linalg.inv(c2w).float()[None], K[None], width, height).to(self._device)
        if self._trainer is not None:
            params, degree = self._trainer.model.params, self._trainer.model.active_sh_degree(self._trainer.step)
        else:
            params, degree = {k: v.to(self._device) for k, v in self._params.items()}, self._degree
        background = (torch.ones(1, 3) if self._cfg.data.background == "white" else torch.zeros(1, 3)).to(self._device)
        with torch.no_grad():
            image = self._renderer.render(params, cameras, degree, background).image[0].clamp(0.0, 1.0)
        return {"color": image.cpu().numpy().astype(np.float32)}

    def save(self, path: str) -> None:
        """Write the trained scene as a gsrecon checkpoint (``gsrecon eval/export/render --checkpoint`` read it)."""
        if self._trainer is None:
            raise InputError("a gsrecon model loaded from a checkpoint is already saved")
        Path(path).mkdir(parents=True, exist_ok=True)
        with atomic_path(Path(path) / CHECKPOINT) as tmp:
            torch.save(capture(self._trainer), tmp)


def torchvision_backbone(net: str) -> dict[str, torch.Tensor]:
    """torchvision's ``alexnet`` / ``vgg16`` state dict with the convolutions of gsrecon's LPIPS backbone ``net``
    (``alex`` / ``vgg``; the layers LPIPS uses), the classifier as torchvision initialises it."""
    import torchvision

    from gsrecon.lpips_weights import lpips_backbone_path

    backbone = torch.load(lpips_backbone_path(net), map_location="cpu", weights_only=True)
    state = getattr(torchvision.models, TORCHVISION_FILES[net][0])(weights=None).state_dict()
    for key, value in backbone.items():  # slice<k>.<index>.<weight|bias> -> features.<index>.<weight|bias>
        _, index, kind = key.split(".")
        state[f"features.{index}.{kind}"] = value
    return state


def write_torchvision_backbones(hub_dir: Path) -> list[Path]:
    """:func:`torchvision_backbone` of both nets as the files torch's hub loads them from (``hub_dir/checkpoints``)."""
    written = []
    for net, (_, name) in TORCHVISION_FILES.items():
        path = hub_dir / "checkpoints" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            torch.save(torchvision_backbone(net), tmp)
        written.append(path)
    return written
