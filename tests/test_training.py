"""Training the synthetic scene actually reconstructs it."""

from __future__ import annotations


def test_training_raises_validation_psnr_by_a_wide_margin(make_trainer) -> None:
    synthetic = {"dataset": "synthetic", "synthetic": {"width": 64, "height": 48, "num_views": 17, "num_points": 1500}}
    trainer = make_trainer(
        max_steps=300,
        val_interval=300,
        data=synthetic,
        model={"sh_degree": 1, "sh_degree_interval": 150},
        hooks=[{"name": "LogHook", "progress": False, "log_interval": 50}],
    )
    before = trainer.validation()["psnr"]
    trainer.train()
    after = trainer.val_metrics["psnr"]
    assert after > before + 5.0, (before, after)
    assert after > 20.0
