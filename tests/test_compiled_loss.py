"""The L1 and SSIM terms on the CPU kernels against the torch code they replace (run in float64 as the reference):
values and gradients, masks, borders, thread counts, and which path a call takes (the run's choice, not what the
process loaded before)."""

from __future__ import annotations

import pytest
import torch

from gsrecon.kernels.build import load_kernels, missing_toolchain
from gsrecon.losses.l1 import l1_loss
from gsrecon.losses.ssim import gaussian_window, ssim

if missing_toolchain() is not None:
    pytest.skip(f"no C++ toolchain here: {missing_toolchain()}", allow_module_level=True)
KERNELS = load_kernels()  # what a run that takes the compiled path hands its terms


def compiled_l1(pred, gt, mask=None):
    return l1_loss(pred, gt, mask, KERNELS)


def compiled_ssim(pred, gt, mask=None):
    return ssim(pred, gt, mask, KERNELS)


def _images(shape: tuple[int, int, int], masked: bool, seed: int = 0):
    """A render near its photo (as in training), and a mask keeping about 70 % of the pixels or None."""
    generator = torch.Generator().manual_seed(seed)
    gt = torch.rand(*shape, 3, generator=generator)
    pred = (gt + 0.2 * torch.randn(*shape, 3, generator=generator)).clamp(0, 1)
    mask = (torch.rand(*shape, 1, generator=generator) > 0.3).float() if masked else None
    return pred, gt, mask


def _value_and_grad(term, pred, gt, mask):
    pred = pred.clone().requires_grad_()
    value = term(pred, gt, mask)
    (grad,) = torch.autograd.grad(value, pred)
    return value, grad


@pytest.mark.parametrize("term", [compiled_l1, compiled_ssim], ids=["l1", "ssim"])
@pytest.mark.parametrize("masked", [False, True], ids=["plain", "masked"])
@pytest.mark.parametrize("shape", [(1, 82, 125), (2, 48, 64), (1, 7, 9)])
def test_the_compiled_terms_match_the_torch_code_to_float32_rounding(term, masked, shape):
    """(1, 7, 9): every pixel's window reaches a reflected border."""
    pred, gt, mask = _images(shape, masked)
    value, grad = _value_and_grad(term, pred, gt, mask)
    assert "_Term" in type(value.grad_fn).__name__  # the compiled path
    ref_value, ref_grad = _value_and_grad(
        term, pred.double(), gt.double(), None if mask is None else mask.double()
    )  # float64 images take the torch code
    assert "_Term" not in type(ref_value.grad_fn).__name__
    assert value.dtype == torch.float32 and value.item() == pytest.approx(ref_value.item(), rel=1e-6, abs=1e-7)
    torch.testing.assert_close(grad.double(), ref_grad, rtol=1e-4, atol=1e-6 * ref_grad.abs().max().item())


def test_the_compiled_terms_are_bit_identical_across_calls_and_thread_counts():
    pred, gt, mask = _images((2, 48, 64), masked=True)
    threads = torch.get_num_threads()
    try:
        results = []
        for n_threads in (1, 1, 2, 3):
            torch.set_num_threads(n_threads)
            results.append([t for term in (compiled_l1, compiled_ssim) for t in _value_and_grad(term, pred, gt, mask)])
    finally:
        torch.set_num_threads(threads)
    for result in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(result, results[0]))


def test_without_gradients_the_compiled_terms_give_the_same_values():
    """The metrics' SSIM under no_grad, and a photo that needs a gradient (which the compiled terms do not give)."""
    pred, gt, mask = _images((1, 48, 64), masked=False)
    with_grad = compiled_ssim(pred.clone().requires_grad_(), gt, mask)
    with torch.no_grad():
        assert torch.equal(compiled_ssim(pred, gt, mask), with_grad.detach())
    gt_grad = gt.clone().requires_grad_()
    value = compiled_ssim(pred, gt_grad, mask)
    assert "_Term" not in type(value.grad_fn).__name__ and value.item() == pytest.approx(with_grad.item(), abs=1e-6)
    assert torch.autograd.grad(value, gt_grad)[0].abs().sum() > 0


def test_the_window_first_made_in_inference_mode_serves_a_step_with_gradients():
    """The SSIM window is made once per dtype and device: made first under inference mode (a validation), it must
    still be a tensor autograd can save (the torch code's convolutions save it for backward)."""
    gaussian_window.cache_clear()
    pred, gt, _ = _images((1, 20, 24), masked=False)
    with torch.inference_mode():
        ssim(pred.double(), gt.double())
    _, grad = _value_and_grad(ssim, pred.double(), gt.double(), None)
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0


@pytest.mark.parametrize("renderer", ["torch", "cpu"])
def test_a_run_takes_the_compiled_path_by_its_renderer_not_by_what_the_process_loaded(make_trainer, renderer):
    """This module loaded the kernels: a run on the torch renderer still takes the torch code (its L1 and SSIM terms
    and its metrics' SSIM), one on the cpu renderer the kernels."""
    trainer = make_trainer(renderer={"name": renderer})
    expected = KERNELS if renderer == "cpu" else None
    assert trainer.loss.terms["l1"].kernels is expected and trainer.loss.terms["ssim"].kernels is expected
    pred, gt, _ = _images((1, 24, 32), masked=False)
    reference = compiled_ssim if renderer == "cpu" else ssim
    assert trainer.metrics(pred[0], gt[0])["ssim"] == float(reference(pred, gt))
