"""The per-view modules' optimiser: Adam over the rows of the views a step trains on."""

from __future__ import annotations

import torch

from gsrecon.distributed import DistributedContext
from gsrecon.model.views.base import ViewModules
from gsrecon.model.views.optim import VisitedRowsAdam
from gsrecon.model.views.pose import PoseCorrection


def test_every_row_each_step_is_torch_adam() -> None:
    generator = torch.Generator().manual_seed(0)
    start = torch.randn(5, 3, generator=generator)
    ours, theirs = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    ours_adam, theirs_adam = VisitedRowsAdam([ours], lr=1e-2), torch.optim.Adam([theirs], lr=1e-2, eps=1e-15)
    for _ in range(20):
        grad = torch.randn(5, 3, generator=generator)
        ours.grad, theirs.grad = grad.clone(), grad.clone()
        ours_adam.step()
        theirs_adam.step()
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)


def test_a_row_trained_now_and_then_moves_as_its_own_adam_and_the_others_stay() -> None:
    """Dense Adam moves a row on its momentum in the steps after its gradient, and its bias correction counts
    every step; here the row steps exactly as a one-row Adam that saw only its own updates."""
    generator = torch.Generator().manual_seed(1)
    rows = torch.nn.Parameter(torch.randn(5, 3, generator=generator))
    alone = torch.nn.Parameter(rows.detach()[2:3].clone())
    rows_adam, alone_adam = VisitedRowsAdam([rows], lr=1e-2), torch.optim.Adam([alone], lr=1e-2, eps=1e-15)
    others = rows.detach()[[0, 1, 3, 4]].clone()
    for step in range(21):
        grad = torch.randn(1, 3, generator=generator)
        rows.grad = torch.zeros(5, 3)
        if step % 3:  # the other steps train on other views: nothing reaches row 2
            rows_adam.step(torch.tensor([0]))
            continue
        rows.grad[2] = grad[0]
        alone.grad = grad.clone()
        rows_adam.step(torch.tensor([2]))
        alone_adam.step()
    torch.testing.assert_close(rows.detach()[2:3], alone.detach(), rtol=0, atol=1e-6)
    assert torch.equal(rows.detach()[[1, 3, 4]], others[[1, 2, 3]])


def test_a_camera_keeps_its_twist_through_the_steps_on_other_views() -> None:
    """The defect of issue 38: with one Adam over all twists, a camera went on moving in the steps after its own."""
    correction = PoseCorrection(PoseCorrection.Config(lr=1e-2), ["a", "b"])
    views = ViewModules({"pose_opt": correction})
    correction.twists.grad = torch.tensor([[0.0] * 6, [1.0] * 6])
    views.step(["b"], DistributedContext())
    moved = correction.twists.detach().clone()
    assert moved[1].abs().min() > 0 and torch.equal(moved[0], torch.zeros(6))
    for _ in range(5):
        correction.regularization(None, None).backward()  # the pull toward zero reaches every twist's gradient
        views.step(["a"], DistributedContext())
    assert torch.equal(correction.twists.detach()[1], moved[1])
