"""PSNR / SSIM / LPIPS: known values, and SSIM and LPIPS agreeing with torchmetrics."""

from __future__ import annotations

import math
import warnings
from importlib.metadata import version
from pathlib import Path

import lpips
import pytest
import torch
import torchvision
from torchmetrics.functional.image import structural_similarity_index_measure
from torchmetrics.image.lpip import LearnedPerceptualImagePatchSimilarity

from gsrecon import metrics
from gsrecon.losses.ssim import ssim
from gsrecon.lpips_net import LPIPS, lpips_linear_weights_path
from gsrecon.lpips_weights import lpips_backbone_path
from gsrecon.metrics import ImageMetrics, psnr


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def alex_backbone() -> dict[str, torch.Tensor]:
    """The converted AlexNet backbone from the user's gsrecon cache (never downloaded by tests)."""
    path = lpips_backbone_path("alex")
    if not path.is_file():
        pytest.skip(f"LPIPS weights not in {path.parent}: run `gsrecon weights lpips` first")
    return torch.load(path, weights_only=True)


def _image_pair(sigma: float = 0.08) -> tuple[torch.Tensor, torch.Tensor]:
    """A noisy copy (Gaussian noise, std ``sigma``) of a smooth 64x64 pattern, and the pattern.

    Both are [64, 64, 3] in [0, 1].
    """
    y, x = torch.meshgrid(torch.linspace(0, 1, 64), torch.linspace(0, 1, 64), indexing="ij")
    gt = torch.stack([0.5 + 0.5 * torch.sin(12 * x), 0.5 + 0.5 * torch.cos(9 * y), x * y], dim=-1)
    noise = torch.randn(gt.shape, generator=torch.Generator().manual_seed(0))
    return (gt + sigma * noise).clamp(0, 1), gt


def _tensor_nchw(image: torch.Tensor) -> torch.Tensor:
    return image.permute(2, 0, 1)[None]


def test_psnr_of_identical_images_is_the_finite_ceiling():
    image = torch.rand(8, 8, 3)
    assert psnr(image, image.clone()) == metrics.MAX_PSNR == 100.0
    assert psnr(image, image + 1e-6) == metrics.MAX_PSNR  # an MSE of 1e-12 is below the ceiling's 1e-10
    assert psnr(image, image + 1e-4) == pytest.approx(80.0, abs=0.01)


def test_psnr_of_a_mask_keeping_no_pixel_is_refused():
    image = torch.rand(4, 4, 3)
    with pytest.raises(ValueError, match="keeps no pixel"):
        psnr(image, image.clone(), torch.zeros(4, 4, 1))


def test_a_metric_without_a_finite_value_is_none():
    """A render with NaN (a diverged model) has no PSNR or SSIM: None (null in metrics.json), never NaN."""
    pred, gt = _image_pair()
    pred[3, 5] = float("nan")
    assert ImageMetrics(lpips_net="none")(pred, gt) == {"psnr": None, "ssim": None, "lpips": None}


def test_psnr_known_noise():
    gt = torch.full((16, 16, 3), 0.5)
    signs = torch.ones(16, 16, 3)
    signs[::2] = -1
    assert psnr(gt + 0.1 * signs, gt) == pytest.approx(20.0, abs=1e-4)  # MSE 0.01 -> 20 dB
    assert psnr(gt + 0.01 * signs, gt) == pytest.approx(40.0, abs=1e-3)


def test_image_metrics_psnr_ssim():
    compute = ImageMetrics(lpips_net="none")
    pred, gt = _image_pair()
    same = compute(gt, gt.clone())
    assert same == {"psnr": metrics.MAX_PSNR, "ssim": pytest.approx(1.0, abs=1e-6), "lpips": None}
    noisy = compute(pred, gt)
    assert noisy["psnr"] == pytest.approx(psnr(pred, gt))
    assert 15 < noisy["psnr"] < 30
    assert 0 < noisy["ssim"] < 0.95
    with pytest.raises(ValueError, match="same shape"):
        compute(pred, gt[:32])


@pytest.mark.parametrize("shape", [(1, 82, 125), (2, 48, 64)])
def test_ssim_and_its_gradient_match_torchmetrics(shape):
    """The separable window computes torchmetrics' SSIM (Gaussian 11x11, sigma 1.5, reflected borders)."""
    generator = torch.Generator().manual_seed(0)
    gt = torch.rand(*shape, 3, generator=generator)
    pred = (gt + 0.2 * torch.randn(*shape, 3, generator=generator)).clamp(0, 1).requires_grad_()
    ours = ssim(pred, gt)
    reference = structural_similarity_index_measure(
        pred.permute(0, 3, 1, 2), gt.permute(0, 3, 1, 2), sigma=1.5, kernel_size=11, data_range=1.0
    )
    (grad_ours,) = torch.autograd.grad(ours, pred)
    (grad_reference,) = torch.autograd.grad(reference, pred)
    assert ours.item() == pytest.approx(reference.item(), abs=1e-6)
    torch.testing.assert_close(grad_ours, grad_reference, rtol=1e-4, atol=1e-7)


def test_missing_lpips_weights_warn_once(tmp_path, monkeypatch):
    monkeypatch.setenv("GSRECON_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setattr(metrics, "_warned_no_lpips", False)  # the once-per-process state, fresh for this test
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first, second = ImageMetrics("alex"), ImageMetrics("alex")
    hints = [w for w in caught if "gsrecon weights lpips" in str(w.message)]
    assert len(hints) == 1
    pred, gt = _image_pair()
    assert first(pred, gt)["lpips"] is None
    assert second.lpips_info == {"net": "alex", "lpips_version": version("lpips"), "weights": None}


def test_unknown_lpips_net():
    with pytest.raises(ValueError, match="squeeze"):
        ImageMetrics("squeeze")


def test_broken_lpips_weights_file(tmp_path, monkeypatch):
    monkeypatch.setenv("GSRECON_CACHE", str(tmp_path))
    path = lpips_backbone_path("alex")
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="lpips_alex_backbone.pt.*gsrecon weights lpips --force"):
        ImageMetrics("alex")


def test_lpips_matches_torchmetrics(alex_backbone, tmp_path, monkeypatch):
    pred, gt = _image_pair()
    ours = ImageMetrics("alex")
    value = ours(pred, gt)["lpips"]
    assert ours.lpips_info["weights"] == str(lpips_backbone_path("alex"))

    # torchmetrics builds its AlexNet through torchvision's download cache: put the same backbone there
    # (classifier as stride-0 zeros, which LPIPS does not use) so it loads without a download.
    torch_home = tmp_path / "torch"
    checkpoint = torch_home / "hub" / "checkpoints" / Path(torchvision.models.AlexNet_Weights.IMAGENET1K_V1.url).name
    checkpoint.parent.mkdir(parents=True)
    features = {"features." + key.split(".", 1)[1]: tensor for key, tensor in alex_backbone.items()}
    full = {
        key: features.get(key, torch.zeros(1).expand(tensor.shape))
        for key, tensor in torchvision.models.alexnet(weights=None).state_dict().items()
    }
    torch.save(full, checkpoint)
    monkeypatch.setenv("TORCH_HOME", str(torch_home))
    reference = LearnedPerceptualImagePatchSimilarity(net_type="alex", normalize=True)
    assert reference(_tensor_nchw(pred), _tensor_nchw(gt)).item() == pytest.approx(value, rel=1e-4)

    # ImageMetrics falls back to the same torchvision cache when the gsrecon cache is empty.
    monkeypatch.setenv("GSRECON_CACHE", str(tmp_path / "empty"))
    fallback = ImageMetrics("alex")
    assert fallback.lpips_info["weights"] == str(checkpoint)
    assert fallback(pred, gt)["lpips"] == pytest.approx(value, rel=1e-6)

    # A random backbone gives a clearly different number: the ImageNet weights are in effect.
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        random_net = lpips.LPIPS(net="alex", pnet_rand=True, verbose=False)
    random_value = random_net(_tensor_nchw(pred) * 2 - 1, _tensor_nchw(gt) * 2 - 1).item()
    assert abs(random_value - value) > 0.5 * value
    assert ours(gt, gt.clone())["lpips"] == pytest.approx(0.0, abs=1e-6)


def test_lpips_vgg_backbone():
    path = lpips_backbone_path("vgg")
    if not path.is_file():
        pytest.skip(f"LPIPS weights not in {path.parent}: run `gsrecon weights lpips` first")
    pred, gt = _image_pair()
    compute = ImageMetrics("vgg")
    value = compute(pred, gt)["lpips"]
    noisier = compute(*_image_pair(sigma=0.3))["lpips"]
    assert 0.05 < value < noisier < 1.0
    assert compute(gt, gt.clone())["lpips"] == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("net, smallest", [("alex", 31), ("vgg", 16)])
def test_lpips_of_images_smaller_than_its_backbone_takes_is_none(net, smallest, tmp_path):
    """A 24x18 render (a factor-4 capture of 96x72 photos) ended training with exit 1 in LPIPS's pooling."""
    if not lpips_backbone_path(net).is_file():
        pytest.skip("LPIPS weights not in the gsrecon cache: run `gsrecon weights lpips` first")
    compute = ImageMetrics(net)
    pred, gt = _image_pair()
    small = compute(pred[: smallest - 1, :40], gt[: smallest - 1, :40])
    assert small["lpips"] is None
    assert math.isfinite(small["psnr"]) and 0.0 < small["ssim"] < 1.0
    assert compute(pred[:smallest, :40], gt[:smallest, :40])["lpips"] > 0.0
    assert compute(pred[:40, : smallest - 1], gt[:40, : smallest - 1])["lpips"] is None


@pytest.mark.parametrize("net", ["alex", pytest.param("vgg", marks=pytest.mark.slow)])
def test_our_lpips_network_computes_lpips_packages_numbers_and_draws_nothing_at_random(net: str) -> None:
    """gsrecon's LPIPS (the feature layers only, weights from files) against ``lpips.LPIPS`` with the same weights:
    the same bits; building it leaves the global random generator as it was."""
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = lpips.LPIPS(net=net, pnet_rand=True, verbose=False).eval()  # random backbone, lpips' linear layers
    backbone = reference.net.state_dict()
    linear = torch.load(lpips_linear_weights_path(net), map_location="cpu", weights_only=True)
    before = torch.get_rng_state()
    ours = LPIPS(net, backbone, linear).eval()
    assert torch.equal(torch.get_rng_state(), before)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in reference.parameters())
    generator = torch.Generator().manual_seed(1)
    x = torch.rand(2, 3, 40, 48, generator=generator) * 2 - 1
    y = (x + 0.2 * torch.randn(x.shape, generator=generator)).clamp(-1, 1)
    with torch.no_grad():
        assert torch.equal(ours(x, y), reference(x, y))
        assert ours(x, x).abs().max() == 0.0
    # torchvision's file naming (features.<i>) gives the same network; a missing layer is named
    torchvision_keys = {f"features.{key.split('.', 1)[1]}": value for key, value in backbone.items()}
    with torch.no_grad():
        assert torch.equal(LPIPS(net, torchvision_keys, linear)(x, y), reference(x, y))
    with pytest.raises(KeyError, match="feature layer 0"):
        LPIPS(net, {k: v for k, v in backbone.items() if not k.endswith("0.weight")}, linear)
