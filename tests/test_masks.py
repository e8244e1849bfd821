"""Per-image masks: finding and preparing them (resize, undistortion), the masked loss and metrics, training
on a capture with a masked-out occluder, bad masks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_config, write_yaml
from PIL import Image
from test_colmap import _make_scene
from test_triangulate import _write_transforms

from gsrecon.cli import main
from gsrecon.config import parse_structured
from gsrecon.data.errors import DatasetError
from gsrecon.data.formats.images import ImageTransform, camera_image_file, read_image, resize_image
from gsrecon.data.formats.lens import Distortion, intrinsics_matrix
from gsrecon.data.formats.masks import MaskFile
from gsrecon.data.pipeline import DataPipeline
from gsrecon.data.readers.colmap import load_colmap
from gsrecon.data.readers.synthetic import SyntheticConfig, load_synthetic
from gsrecon.data.readers.transforms import load_transforms
from gsrecon.engine.evaluator import evaluate_views
from gsrecon.engine.trainer import DefaultTrainer
from gsrecon.io.ply import write_points_ply
from gsrecon.losses.l1 import l1_loss
from gsrecon.losses.ssim import ssim
from gsrecon.metrics import ImageMetrics, mean_metrics, psnr

torch.set_num_threads(1)

OCCLUDER = (255, 0, 255)  # a magenta rectangle, painted into the training images where a mask hides it


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GSRECON_CACHE", str(tmp_path / "cache"))


def occluder_box(index: int, width: int, height: int) -> tuple[slice, slice]:
    """(rows, columns) of the occluder in view ``index``: 40% x 45% of the image, moving from frame to frame."""
    h, w = round(0.4 * height), round(0.45 * width)
    top = (index * 5) % (height - h)
    left = (index * 11) % (width - w)
    return slice(top, top + h), slice(left, left + w)


def write_capture(root: Path, scene_cfg: SyntheticConfig, *, occluder: bool, masks: bool) -> list[str]:
    """The synthetic scene as a transforms.json capture with its points (``ply_file_path``); ``occluder`` paints
    a moving rectangle into every training view (every_8: views 1-7, 9-15, ...) and ``masks`` writes
    ``masks/<name>.png`` hiding it. Test views stay clean and have no mask. Returns the training views' names."""
    scene = load_synthetic(scene_cfg, eval_split="none")
    frames = scene.train
    _write_transforms(root, frames)
    write_points_ply(root / "sparse_pc.ply", scene.points.numpy(), np.rint(scene.colors.numpy() * 255).astype(np.uint8))
    content = json.loads((root / "transforms.json").read_text())
    (root / "transforms.json").write_text(json.dumps({"ply_file_path": "sparse_pc.ply", **content}))
    trained = [f.name for i, f in enumerate(frames) if i % 8 != 0]
    for index, frame in enumerate(frames):
        if frame.name not in trained:
            continue
        rows, cols = occluder_box(index, frame.width, frame.height)
        if occluder:
            pixels = frame.image.numpy().copy()
            pixels[rows, cols] = OCCLUDER
            Image.fromarray(pixels).save(root / "images" / f"{frame.name}.png")
        if masks:
            keep = np.full((frame.height, frame.width), 255, np.uint8)
            keep[rows, cols] = 0
            (root / "masks").mkdir(exist_ok=True)
            Image.fromarray(keep).save(root / "masks" / f"{frame.name}.png")
    return trained


def _capture_config(exp_dir: Path, cache: Path, root: Path, **top) -> dict:
    """A tiny training config on the transforms.json capture at ``root`` (its points, every_8 split)."""
    return tiny_config(exp_dir, cache, data={"dataset": "blender", "path": str(root), "eval_split": "every_8"}, **top)


TINY = SyntheticConfig(width=32, height=24, num_views=9, num_points=300, supersample=2)


# ---------------------------------------------------------------------------------------- preparing masks


@pytest.mark.parametrize(
    ("factor", "dist"),
    [
        (4, Distortion()),
        (1, Distortion(k1=-0.2, p1=0.01)),
        (2, Distortion(k1=0.15)),
        (2, Distortion(k1=0.3, fisheye=True)),
    ],
)
def test_a_prepared_mask_hides_every_pixel_the_ignored_ones_reach(
    tmp_path: Path, factor: int, dist: Distortion
) -> None:
    """Two images differing only in the ignored pixels, prepared alike (resized, undistorted), differ nowhere the
    prepared mask keeps (by at most the rounding of one 8-bit level), and the mask keeps most of the image."""
    rng = np.random.default_rng(0)
    width, height = 96, 64
    keep = np.ones((height, width), bool)
    keep[13:31, 21:47] = False  # odd edges: not aligned to any factor
    keep[50:53, 70:72] = False
    first = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    second = first.copy()
    second[~keep] = rng.integers(0, 256, (int((~keep).sum()), 3), dtype=np.uint8)
    for name, pixels in (("first", first), ("second", second)):
        Image.fromarray(pixels).save(tmp_path / f"{name}.png")
    Image.fromarray(keep.astype(np.uint8) * 255).save(tmp_path / "mask.png")

    K = intrinsics_matrix(80.0, 80.0, 48.0, 32.0)
    prepared = [
        camera_image_file(tmp_path / f"{n}.png", (width, height), K, dist, factor, camera="test")[0]
        for n in ("first", "second")
    ]
    kept = MaskFile(tmp_path / "mask.png", prepared[0].transform).load()  # [h, w] bool
    images = [p.load().astype(int) for p in prepared]
    assert kept.shape == images[0].shape[:2] == (prepared[0].size[1], prepared[0].size[0])
    assert np.abs(images[0] - images[1])[kept].max() <= 1
    assert (np.abs(images[0] - images[1]).max(-1) > 1).any()  # the ignored pixels do reach some pixels...
    assert 0.5 < kept.mean() < keep.mean()  # ... which the mask hides, and little more


def test_a_resized_mask_ignores_the_box_and_a_thin_rim_and_keeps_the_rest(tmp_path: Path) -> None:
    keep = np.full((48, 64), 255, np.uint8)
    keep[16:32, 16:32] = 0
    Image.fromarray(keep).save(tmp_path / "mask.png")
    kept = MaskFile(tmp_path / "mask.png", ImageTransform((32, 24))).load()  # [24, 32]
    assert kept.shape == resize_image(np.zeros((48, 64, 3), np.uint8), (32, 24)).shape[:2]
    assert not kept[8:16, 8:16].any()  # the box itself
    assert kept[:4].all() and kept[:, :4].all() and kept[20:].all() and kept[:, 20:].all()


def test_masks_are_found_beside_images_in_both_layouts_and_frames_without_one_are_unmasked(tmp_path: Path) -> None:
    # COLMAP: masks/<stem>.png or COLMAP's own masks/<name>.png; nonzero keeps (any colour channel).
    root, _, _ = _make_scene(tmp_path / "colmap")
    (root / "masks").mkdir()
    mask = np.zeros((48, 64, 3), np.uint8)
    mask[:, 32:] = (0, 7, 0)
    Image.fromarray(mask).save(root / "masks" / "img_03.png")
    Image.fromarray(np.full((48, 64), 255, np.uint8)).save(root / "masks" / "img_05.png.png")
    frames = {f.name: f for f in (lambda s: s.train + s.test)(load_colmap(str(root), eval_split="none"))}
    assert frames["img_03"].mask.dtype == torch.bool
    assert torch.equal(frames["img_03"].mask, torch.from_numpy(mask[..., 1] > 0))
    assert frames["img_05"].mask.all()
    assert sum(f.mask is not None for f in frames.values()) == 2

    pipeline = DataPipeline(
        DataPipeline.Config(dataset="colmap", path=str(root), eval_split="none"), torch.device("cpu")
    )
    assert pipeline.mask_note.startswith("masks: 2 of 10 images have one (8 have none: all their pixels count)")
    assert "test-view metrics" in pipeline.mask_note
    batch = next(b for step in range(10) if (b := pipeline.next_train(step)).names == ["img_03"])
    assert (
        batch.masks.shape == (1, 48, 64, 1)
        and batch.masks[0, :, :32].eq(0).all()
        and batch.masks[0, :, 32:].eq(1).all()
    )
    other = next(b for step in range(10) if (b := pipeline.next_train(step)).names == ["img_04"])
    assert other.masks is None  # a batch of unmasked frames carries no mask


def test_lazy_masks_decode_like_eager_ones(tmp_path: Path) -> None:
    root = tmp_path / "capture"
    write_capture(root, TINY, occluder=True, masks=True)
    eager = load_transforms(str(root), factor=2, eval_split="none")
    lazy = load_transforms(str(root), factor=2, eval_split="none", lazy=True)
    masked = [(e, z) for e, z in zip(eager.train, lazy.train) if e.mask is not None]
    assert len(masked) == 7  # views 0 and 8 are test views, without masks
    for e, z in masked:
        assert isinstance(z.mask, MaskFile) and z.mask.size == (16, 12)
        assert torch.equal(z.decoded().mask, e.mask)


def test_a_mask_of_another_size_is_one_line_naming_it_and_exit_2(
    tmp_path: Path, synthetic_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "capture"
    names = write_capture(root, TINY, occluder=False, masks=True)
    bad = root / "masks" / f"{names[2]}.png"
    Image.fromarray(np.full((24, 31), 255, np.uint8)).save(bad)
    with pytest.raises(DatasetError, match=f"{bad}: the mask is 31x24, but its image .*{names[2]}.png is 32x24"):
        load_transforms(str(root))
    config = write_yaml(tmp_path / "run.yaml", _capture_config(tmp_path / "run", synthetic_cache, root))
    assert main(["train", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(bad) in err and "31x24" in err


def test_a_mask_keeping_no_pixel_is_one_line_naming_it_and_exit_2(
    tmp_path: Path, synthetic_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Masks written the other way round (0 where the photo should count) leave nothing to train on or to score:
    refused before training, not trained on nothing with a PSNR of infinity."""
    root = tmp_path / "capture"
    names = write_capture(root, TINY, occluder=False, masks=True)
    for name in names:
        Image.fromarray(np.zeros((24, 32), np.uint8)).save(root / "masks" / f"{name}.png")
    first = root / "masks" / f"{names[0]}.png"
    with pytest.raises(DatasetError, match=f"{first}: the mask keeps no pixel"):
        cfg = parse_structured(DefaultTrainer.Config, _capture_config(tmp_path / "r", synthetic_cache, root))
        DataPipeline(cfg.data, torch.device("cpu"))
    config = write_yaml(tmp_path / "run.yaml", _capture_config(tmp_path / "run", synthetic_cache, root))
    assert main(["train", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(first) in err and "keeps no pixel" in err, err
    assert not (tmp_path / "run" / "metrics.json").exists()


# ----------------------------------------------------------------------------------- the loss and metrics


def test_the_masked_loss_and_metrics_ignore_masked_pixels_and_equal_the_plain_ones_without_a_mask() -> None:
    generator = torch.Generator().manual_seed(0)
    pred = torch.rand(2, 24, 32, 3, generator=generator, requires_grad=True)
    gt = torch.rand(2, 24, 32, 3, generator=generator)
    mask = torch.ones(2, 24, 32, 1)
    mask[0, 5:15, 8:20] = 0
    mask[1, :, :6] = 0
    other_gt = torch.where(mask.bool(), gt, torch.rand(gt.shape, generator=generator))  # differs where ignored

    def photometric(truth: torch.Tensor, keep: torch.Tensor | None) -> dict[str, torch.Tensor]:
        return {"l1": l1_loss(pred, truth, keep), "ssim": ssim(pred, truth, keep)}

    losses = photometric(gt, mask)
    total = 0.8 * losses["l1"] + 0.2 * (1.0 - losses["ssim"])
    other = photometric(other_gt, mask)
    assert torch.equal(total, 0.8 * other["l1"] + 0.2 * (1.0 - other["ssim"]))
    total.backward()
    assert pred.grad[~mask.bool().expand_as(pred)].eq(0).all() and pred.grad.abs().sum() > 0
    kept = mask.bool().expand_as(pred)
    assert torch.isclose(losses["l1"], (pred - gt).abs()[kept].mean())
    plain = photometric(gt, None)
    for key, value in photometric(gt, torch.ones_like(mask)).items():
        assert torch.equal(value, plain[key]), key

    metrics = ImageMetrics(lpips_net="none")
    with torch.no_grad():
        scores = metrics(pred[0], gt[0], mask[0])
        assert scores == metrics(pred[0], other_gt[0], mask[0])
        expected = -10 * torch.log10(((pred[0] - gt[0]) ** 2)[kept[0]].double().mean()).item()
        assert scores["psnr"] == pytest.approx(expected, rel=1e-9)
        assert metrics(pred[0], gt[0], torch.ones_like(mask[0])) == metrics(pred[0], gt[0])
        assert psnr(pred[0], gt[0], torch.ones_like(mask[0])) == psnr(pred[0], gt[0])


# ------------------------------------------------------------------------------------------------ training


def test_with_masks_an_occluder_leaves_no_trace_training_is_bit_identical_to_clean_photos(
    tmp_path: Path, synthetic_cache: Path
) -> None:
    """The same masks over photos with and without the occluder: identical Gaussians after training, identical
    validation, and the first log lines say how many images have masks."""
    occluded, clean = tmp_path / "occluded", tmp_path / "clean"
    write_capture(occluded, TINY, occluder=True, masks=True)
    write_capture(clean, TINY, occluder=False, masks=True)
    trainers = []
    for root in (occluded, clean):
        cfg = parse_structured(
            DefaultTrainer.Config, _capture_config(tmp_path / f"run_{root.name}", synthetic_cache, root, max_steps=8)
        )
        trainer = DefaultTrainer(cfg)
        trainer.train()
        trainers.append(trainer)
    for name, value in trainers[0].model.params.items():
        assert torch.equal(value, trainers[1].model.params[name]), name
    assert trainers[0].val_results == trainers[1].val_results
    log = (tmp_path / "run_occluded" / "train.log").read_text()
    assert "masks: 7 of 9 images have one (2 have none: all their pixels count); the loss and the test-view" in log

    # Without masks the occluder changes what is learned.
    unmasked_root = tmp_path / "unmasked"
    write_capture(unmasked_root, TINY, occluder=True, masks=False)
    top = _capture_config(tmp_path / "run_unmasked", synthetic_cache, unmasked_root, max_steps=8)
    unmasked = DefaultTrainer(parse_structured(DefaultTrainer.Config, top))
    unmasked.train()
    assert not torch.equal(unmasked.model.params["means"], trainers[0].model.params["means"])
    assert "masks:" not in (tmp_path / "run_unmasked" / "train.log").read_text()


def test_test_view_metrics_ignore_masked_pixels(tmp_path: Path, synthetic_cache: Path) -> None:
    """A test view with a mask is scored over its kept pixels: painting its masked part changes nothing."""
    root = tmp_path / "capture"
    write_capture(root, TINY, occluder=False, masks=False)
    cfg = parse_structured(DefaultTrainer.Config, _capture_config(tmp_path / "run", synthetic_cache, root, max_steps=3))
    trainer = DefaultTrainer(cfg)
    trainer.train()
    test_name = trainer.datapipeline.scene.test[0].name
    keep = np.full((24, 32), 255, np.uint8)
    keep[4:14, 6:20] = 0
    (root / "masks").mkdir()
    Image.fromarray(keep).save(root / "masks" / f"{test_name}.png")
    scores = []
    for paint in (False, True):
        if paint:
            pixels = read_image(root / "images" / f"{test_name}.png")
            pixels[4:14, 6:20] = OCCLUDER
            Image.fromarray(pixels).save(root / "images" / f"{test_name}.png")
        pipeline = DataPipeline(cfg.data, torch.device("cpu"))
        scores.append(evaluate_views(trainer.render, pipeline.val_batches(), trainer.metrics))
    assert scores[0] == scores[1]
    (root / "masks" / f"{test_name}.png").unlink()
    plain = evaluate_views(trainer.render, DataPipeline(cfg.data, torch.device("cpu")).val_batches(), trainer.metrics)
    assert plain[0]["psnr"] < scores[1][0]["psnr"]  # unmasked, the painted rectangle counts


BENCH = SyntheticConfig(width=64, height=48, num_views=24, num_points=2000, supersample=2)


def train_capture_psnr(tmp_path: Path, cache: Path, occluder: bool, masks: bool, steps: int, seed: int = 0) -> float:
    """Mean test-view PSNR (clean test views) after training ``steps`` on the capture with/without occluder/masks."""
    name = f"{'occluded' if occluder else 'clean'}_{'masks' if masks else 'nomasks'}_{seed}"
    root = tmp_path / name
    write_capture(root, BENCH, occluder=occluder, masks=masks)
    top = {
        "seed": seed,
        "max_steps": steps,
        "val_interval": steps,
        "model": {"sh_degree": 1, "sh_degree_interval": 300},
        "strategy": {
            "name": "default",
            "refine_start": 100,
            "refine_stop": steps * 2 // 3,
            "refine_every": 100,
            "grow_grad2d": 0.0008,
            "reset_every": 100000,
        },
        "hooks": {"LogHook": {"log_interval": 100, "progress": False}, "CheckInvalidLossHook": {}},
    }
    cfg = parse_structured(DefaultTrainer.Config, _capture_config(tmp_path / f"run_{name}", cache, root, **top))
    trainer = DefaultTrainer(cfg)
    trainer.train()
    return mean_metrics(trainer.val_results)["psnr"]


@pytest.mark.slow
def test_masks_hide_a_moving_occluder_from_training(tmp_path: Path, synthetic_cache: Path) -> None:
    """On 64x48 views with a 40% x 45% occluder moving through every training view: with masks the clean test
    views are as good as training on clean photos; without masks they are worse (BENCHMARKS.md)."""
    steps = 600
    clean = train_capture_psnr(tmp_path, synthetic_cache, occluder=False, masks=False, steps=steps)
    masked = train_capture_psnr(tmp_path, synthetic_cache, occluder=True, masks=True, steps=steps)
    unmasked = train_capture_psnr(tmp_path, synthetic_cache, occluder=True, masks=False, steps=steps)
    print(f"test PSNR after {steps} steps: clean {clean:.2f}, occluded+masks {masked:.2f}, occluded {unmasked:.2f}")
    assert masked > unmasked + 2.0
    assert masked > clean - 1.5
