"""The cpu renderer's training step in two compiled calls (`gsrecon.render.cpu.step`): the losses and gradients of
the render followed by the terms bit for bit, the torch renderer's within the renderers' tolerance, bit-identical at
every thread count, taken where it computes the run's whole loss and nowhere else."""

from __future__ import annotations

import math

import pytest
import torch
import yaml
from conftest import random_gaussians
from torch import Tensor

from gsrecon.cameras import CameraModel, Cameras
from gsrecon.cli import main
from gsrecon.component import RunSetup
from gsrecon.data.pipeline import Batch
from gsrecon.engine.checkpoints import load_checkpoint_file
from gsrecon.engine.forward import TrainingForward, fused_step
from gsrecon.engine.runtime import set_cpu_threads
from gsrecon.kernels.build import load_kernels, missing_toolchain
from gsrecon.losses.base import DEFAULT_LOSS, build_loss
from gsrecon.losses.l1 import l1_loss
from gsrecon.losses.ssim import ssim
from gsrecon.model.views.base import ViewModules
from gsrecon.render.cpu.renderer import CpuRenderer
from gsrecon.render.torch_renderer import TorchRenderer

if missing_toolchain() is not None:
    pytest.skip(f"no C++ toolchain here: {missing_toolchain()}", allow_module_level=True)
KERNELS = load_kernels()

PARAMS = ("means", "scales", "quats", "opacities", "sh0", "shN")
WIDTH, HEIGHT = 64, 48


def _scene(n: int = 3000, seed: int = 0) -> dict[str, Tensor]:
    """``n`` random Gaussians at SH degree 3 in front of the cameras of :func:`_batch`."""
    return random_gaussians(n, 3, seed, scale=0.05)


def _batch(n_cams: int = 2, masked: bool = False, model: CameraModel | None = None, size=(WIDTH, HEIGHT)) -> Batch:
    """Photos of random colours seen by ``n_cams`` pinhole cameras, over backgrounds of different colours."""
    g = torch.Generator().manual_seed(7)
    width, height = size
    viewmats = torch.eye(4).repeat(n_cams, 1, 1)
    for c in range(1, n_cams):
        a = 0.2 * c
        viewmats[c, :3, :3] = torch.tensor([[math.cos(a), 0, math.sin(a)], [0, 1, 0], [-math.sin(a), 0, math.cos(a)]])
        viewmats[c, 0, 3] = 0.3 * c
    Ks = torch.tensor([[60.0, 0, width / 2], [0, 60.0, height / 2], [0, 0, 1]]).repeat(n_cams, 1, 1)
    cameras = Cameras(viewmats, Ks, width, height, **({} if model is None else {"model": model}))
    masks = (torch.rand(n_cams, height, width, 1, generator=g) > 0.3).float() if masked else None
    images = torch.rand(n_cams, height, width, 3, generator=g)
    backgrounds = torch.rand(n_cams, 3, generator=g)
    return Batch(images, cameras, backgrounds, [f"view{c}" for c in range(n_cams)], masks)


def _forward(renderer, loss_entries=None, views: ViewModules | None = None) -> TrainingForward:
    loss = build_loss(loss_entries if loss_entries is not None else DEFAULT_LOSS)
    run = RunSetup(lambda _: None, None, None, renderer.compiled, renderer.render)
    for term in loss.terms.values():
        term.setup(run)
    return TrainingForward(renderer, views if views is not None else ViewModules({}), loss, None)


def _step(forward: TrainingForward, params: dict[str, Tensor], batch: Batch, weights=None):
    """One step's losses, the parameters' gradients and the strategies' means2d gradients (and AbsGS sums)."""
    leaves = {k: v.clone().requires_grad_() for k, v in params.items()}
    step = forward(leaves, batch, 3)
    step.out.info["means2d"].retain_grad()
    losses = step.losses
    total = sum(losses.values()) if weights is None else sum(w * v for w, v in zip(weights, losses.values()))
    total.backward()
    means2d = step.out.info["means2d"]
    return step, {k: v.grad for k, v in leaves.items()}, means2d.grad, getattr(means2d, "absgrad", None)


def _cosine(a: Tensor, b: Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a.flatten().double(), b.flatten().double(), dim=0))


def _psnr(a: Tensor, b: Tensor) -> float:
    return float(10 * torch.log10(1.0 / ((a.detach() - b.detach()) ** 2).mean()))


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("absgrad", [False, True])
def test_the_fused_step_gives_the_losses_and_gradients_of_the_render_then_the_terms_bit_for_bit(masked, absgrad):
    params, batch = _scene(), _batch(masked=masked)
    fused = _forward(CpuRenderer(CpuRenderer.Config(absgrad=absgrad)))
    apart = _forward(CpuRenderer(CpuRenderer.Config(absgrad=absgrad, fused_step=False)))
    assert fused.fused is not None and apart.fused is None
    step, grads, means2d, abs2d = _step(fused, params, batch)
    ref, ref_grads, ref_means2d, ref_abs2d = _step(apart, params, batch)
    assert list(step.losses) == list(ref.losses) == ["l1", "ssim"]
    for key in step.losses:
        assert torch.equal(step.losses[key], ref.losses[key]), key
    for name in ("image", "alpha", "depth"):
        assert torch.equal(getattr(step.out, name), getattr(ref.out, name)), name
    assert torch.equal(step.out.info["radii"], ref.out.info["radii"])
    for key in PARAMS:
        assert torch.equal(grads[key], ref_grads[key]), key
    assert torch.equal(means2d, ref_means2d)
    if absgrad:
        assert torch.equal(abs2d, ref_abs2d)
    assert not step.out.image.requires_grad  # the render is scored inside: only the terms carry gradients


def test_any_weighting_of_the_two_terms_is_differentiated_as_apart():
    """The terms' weights reach backward as autograd's gradients: a sum other than the trainer's (2 L1 - 3 SSIM
    term, or one term alone) gives the gradients the render then the terms give."""
    params, batch = _scene(n=1500), _batch()
    fused = _forward(CpuRenderer())
    apart = _forward(CpuRenderer(CpuRenderer.Config(fused_step=False)))
    for weights in ([2.0, -3.0], [1.0, 0.0], [0.0, 1.0]):
        _, grads, means2d, _ = _step(fused, params, batch, weights)
        _, ref_grads, ref_means2d, _ = _step(apart, params, batch, weights)
        for key in PARAMS:
            assert torch.equal(grads[key], ref_grads[key]), (weights, key)
        assert torch.equal(means2d, ref_means2d)


@pytest.mark.parametrize("entries", [{"l1": {"weight": 1.0}}, {"ssim": {"weight": 0.5}, "l1": {"weight": 0.5}}])
def test_a_loss_of_one_term_or_in_another_order_is_fused_as_listed(entries):
    params, batch = _scene(n=1000), _batch(n_cams=1)
    fused = _forward(CpuRenderer(), entries)
    apart = _forward(CpuRenderer(CpuRenderer.Config(fused_step=False)), entries)
    assert fused.fused is not None
    step, grads, _, _ = _step(fused, params, batch)
    ref, ref_grads, _, _ = _step(apart, params, batch)
    assert list(step.losses) == list(ref.losses) == list(entries)
    for key in step.losses:
        assert torch.equal(step.losses[key], ref.losses[key]), key
    for key in PARAMS:
        assert torch.equal(grads[key], ref_grads[key]), key


def test_the_fused_step_matches_the_torch_renderer_and_torch_terms():
    """As the cpu renderer does today: the image at >= 40 dB, gradients at cosine >= 0.99."""
    params, batch = _scene(), _batch(masked=True)
    step, grads, means2d, _ = _step(_forward(CpuRenderer()), params, batch)
    leaves = {k: v.clone().requires_grad_() for k, v in params.items()}
    ref = TorchRenderer().render(leaves, batch.cameras, 3, batch.backgrounds)
    ref.info["means2d"].retain_grad()
    masks = batch.masks
    total = 0.8 * l1_loss(ref.image, batch.images, masks) + 0.2 * (1.0 - ssim(ref.image, batch.images, masks))
    total.backward()
    assert _psnr(step.out.image, ref.image) >= 40.0
    assert _psnr(step.out.alpha, ref.alpha) >= 40.0
    assert float(sum(step.losses.values()).detach()) == pytest.approx(float(total.detach()), rel=1e-3)
    for key in PARAMS:
        assert _cosine(grads[key], leaves[key].grad) >= 0.99, key
    assert _cosine(means2d, ref.info["means2d"].grad) >= 0.99


def test_the_fused_step_is_bit_identical_at_every_thread_count():
    params, batch = _scene(n=4000), _batch(n_cams=2, masked=True)
    forward = _forward(CpuRenderer(CpuRenderer.Config(absgrad=True)))
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2, 3):
            set_cpu_threads(threads)
            results.append(_step(forward, params, batch))
    finally:
        torch.set_num_threads(before)
    (first, first_grads, first_2d, first_abs), *others = results
    for step, grads, means2d, abs2d in others:
        assert all(torch.equal(step.losses[k], first.losses[k]) for k in first.losses)
        assert torch.equal(step.out.image, first.out.image)
        assert all(torch.equal(grads[k], first_grads[k]) for k in PARAMS)
        assert torch.equal(means2d, first_2d) and torch.equal(abs2d, first_abs)


def test_a_batch_the_fused_step_cannot_take_is_rendered_and_scored_apart():
    """Fisheye cameras, images under the SSIM window and no gradients: the render then the terms, the same losses."""
    forward = _forward(CpuRenderer())
    apart = _forward(CpuRenderer(CpuRenderer.Config(fused_step=False)))
    params = _scene(n=500)
    fisheye = _batch(n_cams=1, model=CameraModel.fisheye(torch.tensor([[0.01, 0.0, 0.0, 0.0]])))
    for batch in (fisheye, _batch(n_cams=1, size=(5, 30))):
        assert not forward.fused.applies(params, batch)
        step = forward(params, batch, 3)
        torch.testing.assert_close(sum(step.losses.values()), sum(apart(params, batch, 3).losses.values()))
    with torch.no_grad():
        assert not forward.fused.applies(params, _batch(n_cams=1))


def test_the_fused_step_is_taken_only_where_it_computes_the_whole_loss():
    assert fused_step(CpuRenderer(), ViewModules({}), _loss(DEFAULT_LOSS)) is not None
    assert fused_step(TorchRenderer(), ViewModules({}), _loss(DEFAULT_LOSS)) is None
    assert fused_step(CpuRenderer(CpuRenderer.Config(median_depth=True)), ViewModules({}), _loss(DEFAULT_LOSS)) is None
    assert fused_step(CpuRenderer(), ViewModules({}), _loss({**DEFAULT_LOSS, "depth_normal": {"weight": 0.1}})) is None
    assert fused_step(CpuRenderer(), ViewModules({}), build_loss(DEFAULT_LOSS)) is None  # terms not on the kernels


def _loss(entries):
    return _forward(CpuRenderer(), entries).loss


def test_a_run_with_a_per_view_module_renders_and_scores_apart(make_trainer):
    cpu = {"name": "cpu"}
    plain = make_trainer("plain", renderer=cpu)
    assert plain.forward.fused is not None
    with_module = make_trainer("appearance", renderer=cpu, views={"appearance": {"name": "affine"}})
    assert with_module.forward.fused is None
    off = make_trainer("off", renderer={"name": "cpu", "fused_step": False})
    assert off.forward.fused is None


def test_a_run_on_the_fused_step_resumes_bit_identically(make_trainer):
    """Eight steps straight, and the same run again from its step-4 checkpoint: the same Gaussians and moments bit for
    bit (densification included: the tiny config refines from step 2)."""
    hooks = [{"name": "CheckPointHook", "interval": 4}]
    cpu = {"name": "cpu"}
    whole = make_trainer("whole", max_steps=8, hooks=hooks, renderer=cpu)
    assert whole.forward.fused is not None
    whole.train()
    checkpoint = whole.exp_dir / "checkpoints" / "step_000004.pt"
    resumed = make_trainer("resumed", max_steps=8, hooks=hooks, renderer=cpu, resume=str(checkpoint))
    resumed.train()
    a = load_checkpoint_file(whole.exp_dir / "checkpoints" / "last.pt")
    b = load_checkpoint_file(resumed.exp_dir / "checkpoints" / "last.pt")
    assert a["step"] == b["step"] == 8
    for key in PARAMS:
        assert torch.equal(a["params"][key], b["params"][key]), key
    assert a["optimizers"].keys() == b["optimizers"].keys()
    for key, state in a["optimizers"].items():
        for index, moments in state["state"].items():
            for name, value in moments.items():
                assert torch.equal(value, b["optimizers"][key]["state"][index][name]), (key, name)


def test_a_run_trains_the_same_gaussians_bit_for_bit_with_the_step_fused_or_apart(make_trainer):
    """Eight steps with densification, on two threads: the fused step changes the time a run takes, not its result."""
    params = {}
    for fused in (True, False):
        trainer = make_trainer(
            f"fused_{fused}", max_steps=8, num_threads=2, renderer={"name": "cpu", "fused_step": fused},
            strategy={"name": "default", "refine_start": 1, "refine_every": 2, "grow_grad2d": 1e-5},
        )  # fmt: skip
        assert (trainer.forward.fused is not None) == fused
        trainer.train()
        params[fused] = trainer.model.params
    assert len(params[True]["means"]) > 300  # it grew
    for key in PARAMS:
        assert torch.equal(params[True][key], params[False][key]), key


@pytest.mark.parametrize("value", ["3", "0.5", "maybe"])
def test_a_fused_step_setting_that_is_not_a_boolean_is_refused_naming_the_key(make_config, tmp_path, capsys, value):
    """A number, which OmegaConf would take as true, included; nothing is written."""
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(make_config()))
    code = main(["train", "--config", str(tmp_path / "run.yaml"), "renderer.name=cpu", f"renderer.fused_step={value}"])
    assert code == 2
    err = capsys.readouterr().err
    assert "key 'renderer.fused_step'" in err and value in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()
