"""Training on a real capture (the statuette COLMAP scene in ../shared; skipped where it is absent)."""

from __future__ import annotations

import pytest
from conftest import SHARED_DATA

STATUETTE = SHARED_DATA / "statuette_colmap"


@pytest.mark.skipif(not STATUETTE.is_dir(), reason="../shared/data/statuette_colmap is not available")
def test_statuette_trains_and_test_psnr_rises(make_trainer) -> None:
    data = {"dataset": "colmap", "path": str(STATUETTE), "factor": 8, "background": "white"}
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
