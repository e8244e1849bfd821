"""Training on a real capture (the statuette COLMAP scene in ../shared; skipped where it is absent)."""

from __future__ import annotations

import pytest


@pytest.mark.slow  # trains the statuette's real photos: 8 s on a quiet machine
def test_statuette_trains_and_test_psnr_rises(make_trainer, shared_data) -> None:
    statuette = shared_data / "statuette_colmap"
    data = {"dataset": "colmap", "path": str(statuette), "factor": 8, "background": "white"}
    trainer = make_trainer(
        max_steps=400,
        val_interval=400,
        data=data,
        model={"sh_degree": 0},
        hooks=[{"name": "LogHook", "progress": False}],
    )
    assert trainer.datapipeline.num_train == 20 and trainer.datapipeline.num_val == 3
    before = trainer.validation()["psnr"]
    trainer.train()
    after = trainer.val_metrics["psnr"]
    assert after > before + 3.0, (before, after)
