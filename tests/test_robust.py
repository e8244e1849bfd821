"""RobustFilter (``views.robust``): the running-percentile inlier mask, its vote, warm-up, state and refusals; and the
strategies' delayed growth where a per-view module sets transients aside."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import script_module, write_yaml
from PIL import Image

from gsrecon.cli import main
from gsrecon.engine.checkpoints import load_checkpoint_file
from gsrecon.hooks import Hook
from gsrecon.model.views.robust import RobustFilter, inlier_mask, percentile_of, warmup_share

ROBUST_LOSS = {"l1": {"weight": 1.0}, "ssim": {"weight": 0.0}}  # the papers' loss: the masked L1 alone
COUNTS: list[int] = []


class CountGaussians(Hook):
    """Records the number of Gaussians after every step (test helper)."""

    def after_train_iter(self, trainer) -> None:
        COUNTS.append(trainer.model.num_gaussians)


@pytest.fixture(autouse=True)
def _register_test_hooks(hook_registry) -> None:
    hook_registry.register()(CountGaussians)


def batch_of(photo: torch.Tensor, masks: torch.Tensor | None = None) -> SimpleNamespace:
    return SimpleNamespace(images=photo, masks=masks, names=["a"])


def test_the_threshold_is_the_percentile_of_the_decayed_histogram() -> None:
    histogram = torch.zeros(10)
    histogram[[1, 5, 8]] = torch.tensor([6.0, 1.0, 3.0])  # residuals in [0.1, 0.2): 60 %, [0.5, 0.6): 10 %, ...
    assert float(percentile_of(histogram, 0.5)) == pytest.approx(0.1)
    assert float(percentile_of(histogram, 0.7)) == pytest.approx(0.5)  # the lower edge of the bin reaching 70 %
    assert float(percentile_of(histogram, 0.71)) == pytest.approx(0.8)
    assert float(percentile_of(torch.zeros(10), 0.7)) == 1.0  # nothing seen: every pixel is an inlier


def test_the_vote_keeps_an_isolated_outlier_and_sets_aside_a_block() -> None:
    residual = torch.zeros(1, 12, 12)
    residual[0, 2, 2] = 1.0  # one pixel: its neighbours are inliers
    residual[0, 5:10, 5:10] = 1.0  # a 5 x 5 distractor
    kept = inlier_mask(residual, torch.tensor(0.5), vote=3)
    assert kept[0, 2, 2]
    assert not kept[0, 6:9, 6:9].any()  # its inside: no neighbour is an inlier
    assert kept[0, 5, 5] and not kept[0, 5, 7]  # a corner has 5 inliers of 9 in its window, an edge pixel 3
    assert torch.equal(inlier_mask(residual, torch.tensor(0.5), vote=1), residual < 0.5)


def test_the_warmup_mixes_in_all_ones_at_the_papers_rate() -> None:
    assert warmup_share(3e-3, 0) == 1.0  # floor(1 / 1.5) = 0
    assert warmup_share(3e-3, 1499) == pytest.approx(math.exp(-3e-3 * 1000))
    module = RobustFilter(RobustFilter.Config(), ["a"])
    module.threshold.fill_(0.0)  # every pixel an outlier
    module.steps.fill_(1000)  # a = exp(-3e-3 * 667) = 0.135
    photo = torch.zeros(1, 64, 64, 3)
    image = torch.full_like(photo, 0.5).requires_grad_()
    torch.manual_seed(0)
    kept = module.adjust_image(image, batch_of(photo), None) != photo  # the render where kept
    assert kept.all(-1).float().mean() == pytest.approx(warmup_share(3e-3, 1000), abs=0.02)


def test_a_training_step_learns_the_threshold_and_gives_set_aside_pixels_no_gradient() -> None:
    module = RobustFilter(RobustFilter.Config(warmup_rate=0.0, bins=100), ["a"])
    photo = torch.zeros(1, 20, 20, 3)
    residuals = torch.linspace(0.0, 0.99, 400).reshape(1, 20, 20, 1).expand(1, 20, 20, 3)
    first = module.adjust_image(residuals.clone().requires_grad_(), batch_of(photo), None)
    assert torch.equal(first, residuals)  # the first step keeps every pixel (the threshold starts at 1)
    assert float(module.threshold) == pytest.approx(0.69, abs=0.011) and int(module.steps) == 1
    image = residuals.clone().requires_grad_()
    adjusted = module.adjust_image(image, batch_of(photo), None)
    adjusted.sum().backward()
    aside = residuals[..., 0] >= module.threshold  # the bottom 30 % of rows, minus the vote at their top edge
    assert 0.25 < aside.float().mean() < 0.32
    assert (image.grad[..., 0][aside[0:1]] == 0).sum() >= 0.9 * aside.sum()
    assert (image.grad[..., 0][~aside] == 1).all()  # inliers keep their gradient
    assert int(module.steps) == 2
    with torch.no_grad():  # a render without gradients (the multiview strategy's scoring) leaves the state alone
        module.adjust_image(residuals, batch_of(photo), None)
    assert int(module.steps) == 2


def test_pixels_ignored_by_masks_from_files_are_left_out_of_the_histogram_and_never_set_aside() -> None:
    module = RobustFilter(RobustFilter.Config(warmup_rate=0.0, bins=100), ["a"])
    photo = torch.zeros(1, 10, 10, 3)
    image = torch.full_like(photo, 0.2)
    image[:, :, 5:] = 0.9  # the right half far off, and ignored by the mask
    masks = torch.ones(1, 10, 10, 1)
    masks[:, :, 5:] = 0
    module.adjust_image(image.clone().requires_grad_(), batch_of(photo, masks), None)
    assert float(module.histogram.sum()) == 50 and float(module.threshold) == pytest.approx(0.2)
    aside = module.set_aside(image, batch_of(photo, masks))
    assert not aside[:, :, 5:].any()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("views.robust.percentile=1", "key 'views.robust': percentile must be in (0, 1), got 1"),
        ("views.robust.percentile=.nan", "key 'views.robust': percentile must be in (0, 1), got nan"),
        ("views.robust.percentile=abc", "views.robust.percentile"),
        ("views.robust.ema=-0.5", "key 'views.robust': ema must be in [0, 1)"),
        ("views.robust.bins=1", "key 'views.robust': bins must be between 2 and 1000000, got 1"),
        ("views.robust.vote=2", "key 'views.robust': vote must be an odd number of pixels >= 1 (1: no vote), got 2"),
        ("views.robust.warmup_rate=-1", "key 'views.robust': warmup_rate must be a finite number >= 0"),
        ("loss.ssim.weight=0.2", "key 'views.robust': the rule's loss is the masked L1 alone"),
        ("strategy.reset_every=5", "strategy.reset_every=5 resets opacities within the run's 20 steps"),
        ("strategy.transient_growth_start=-1", "strategy.transient_growth_start must be a whole number of steps >= 0"),
    ],
)
def test_bad_robust_config_is_one_line_and_exit_2(
    capsys, make_config, tmp_path: Path, override: str, message: str
) -> None:
    loss = {"l1": {"weight": 1.0}, "ssim": {"weight": 0.2}} if override.startswith("loss.") else ROBUST_LOSS
    top = {"loss": loss, "views": {"robust": {}}, "strategy": {"name": "default"}}
    path = write_yaml(tmp_path / "c.yaml", make_config(max_steps=20, **top))
    code = main(["train", "--config", str(path), override])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_a_resumed_run_is_bit_identical_to_an_uninterrupted_one(make_trainer) -> None:
    differences = script_module("compare_checkpoints").differences
    top = {"loss": ROBUST_LOSS, "views": {"robust": {"warmup_rate": 0.05}}}  # the warm-up draw at every step
    full = make_trainer("full", **top)
    full.train()
    step_3 = full.exp_dir / "checkpoints" / "step_000003.pt"
    saved = load_checkpoint_file(step_3)["views"]["robust"]["module"]
    assert int(saved["steps"]) == 3 and 0 < float(saved["threshold"]) < 1 and saved["histogram"].sum() > 0
    resumed = make_trainer("resumed", resume=str(step_3), **top)
    resumed.train()
    reference = load_checkpoint_file(full.exp_dir / "checkpoints" / "last.pt")
    again = load_checkpoint_file(resumed.exp_dir / "checkpoints" / "last.pt")
    assert again["step"] == reference["step"] == 6
    assert differences(reference["params"], again["params"]) == []
    assert differences(reference["views"], again["views"]) == []
    assert differences(reference["rng"], again["rng"]) == []


def test_a_distractor_is_set_aside_once_the_histogram_has_seen_the_photos() -> None:
    generator = torch.Generator().manual_seed(0)
    module = RobustFilter(RobustFilter.Config(warmup_rate=0.0), ["a"])
    photos = torch.rand(4, 32, 32, 3, generator=generator)
    render = (photos + 0.05 * torch.rand(photos.shape, generator=generator)).clamp(0, 1)  # a scene learnt to ~0.03
    photos[1, 8:20, 10:24] = torch.tensor([1.0, 0.0, 1.0])  # a distractor in one photo
    for _ in range(5):
        module.adjust_image(render.clone().requires_grad_(), batch_of(photos), None)
    aside = module.set_aside(render, batch_of(photos))[..., 0]  # [4, 32, 32]
    assert aside[1, 8:20, 10:24].all()
    outside = aside.clone()
    outside[1, 8:20, 10:24] = False
    # 30 % of the scene's residuals are above the percentile; scattered, the vote keeps most (not at the frame's edge)
    assert outside.float().mean() < 0.08


@pytest.mark.parametrize("strategy", ["default", "multiview", "mcmc"])
def test_growth_is_held_back_while_a_module_sets_transients_aside(make_trainer, strategy: str) -> None:
    options = {"refine_start": 0, "refine_stop": 100, "refine_every": 2, "transient_growth_start": 8}
    options |= {"cap_max": 400, "grow_rate": 1.05} if strategy == "mcmc" else {"grow_grad2d": 0.0, "prune_opa": 0.0}
    hooks = [{"name": "CountGaussians"}, {"name": "LogHook", "progress": False}]
    counts = {}
    for views in ({}, {"robust": {}}, {"transients": {}}):
        COUNTS.clear()
        strategy_config = {"name": strategy, **options}
        name = f"{strategy}_{'_'.join(views) or 'off'}"
        trainer = make_trainer(name, max_steps=12, loss=ROBUST_LOSS, views=views, strategy=strategy_config, hooks=hooks)
        trainer.train()
        assert trainer.strategy.growth_from == (8 if views else 0)
        counts[tuple(views)] = list(COUNTS)
    assert counts[()][2] > 300  # grown at step 2
    for held in (counts[("robust",)], counts[("transients",)]):
        assert all(count <= 300 for count in held[:8])  # nothing grown before step 8 (pruning goes on)
        assert held[8] > held[7]  # grown at step 8


def test_the_rule_trains_beside_the_sky_module(make_trainer) -> None:
    views = {"sky": {"name": "environment"}, "robust": {}}
    trainer = make_trainer("sky", loss=ROBUST_LOSS, views=views)
    texels = trainer.views.modules["sky"].state_dict()
    texels = {key: value.clone() for key, value in texels.items()}
    trainer.train()
    robust = trainer.views.modules["robust"]
    assert int(robust.steps) == 6 and 0 < float(robust.threshold) < 1
    assert any(not torch.equal(value, trainer.views.modules["sky"].state_dict()[key]) for key, value in texels.items())


def test_transient_images_show_what_the_rule_sets_aside_under_its_last_threshold(make_trainer) -> None:
    hooks = [{"name": "TransientImages"}, {"name": "LogHook", "progress": False}]
    trainer = make_trainer("images", loss=ROBUST_LOSS, views={"robust": {"warmup_rate": 0.0}}, hooks=hooks)
    trainer.train()
    batches = list(trainer.datapipeline.train_batches())
    written = {path.stem: path for path in (trainer.exp_dir / "transients").glob("*.png")}
    assert sorted(written) == sorted(name for batch in batches for name in batch.names)
    aside_total = pixels = 0
    with torch.no_grad():
        for batch in batches:
            expected = trainer.views.modules["robust"].set_aside(trainer.render(batch).image, batch)[
                ..., 0
            ]  # [B, H, W]
            aside_total, pixels = aside_total + int(expected.sum()), pixels + expected.numel()
            for name, aside in zip(batch.names, expected):
                shown = torch.from_numpy(np.array(Image.open(written[name]))).float()  # [H, 2W, 3]: photo | tinted
                photo, tinted = shown.chunk(2, dim=1)
                assert torch.equal((tinted - photo).abs().amax(-1) > 1, aside), name
    assert 0 < aside_total < pixels  # the last threshold sets some pixels aside, not all
    share = f"transients: {100 * aside_total / pixels:.1f} % of the training pixels set aside from the trained scene"
    assert share in (trainer.exp_dir / "train.log").read_text()
