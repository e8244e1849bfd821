"""Writers: TensorBoard event files and JSONL scalars read back."""

from __future__ import annotations

import json

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def test_tensorboard_writer_records_scalars_and_images(make_trainer) -> None:
    hooks = [
        {"name": "IterTimerHook", "log_interval": 1},
        {"name": "LogHook", "log_interval": 1, "histogram_interval": 3},
    ]
    trainer = make_trainer(writers=[{"name": "TensorboardWriter"}], hooks=hooks)
    trainer.train()
    events = EventAccumulator(str(trainer.exp_dir / "tb"), size_guidance={"images": 0, "scalars": 0, "histograms": 0})
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    expected = {
        "train/loss",
        "train/loss/l1",
        "train/loss/ssim",
        "train/num_gaussians",
        "train/lr/means",
        "train/lr/shN",
        "time/step_s",
        "val/psnr",
        "val/ssim",
    }
    assert expected <= scalars
    assert "val/lpips" not in scalars  # lpips_net: none in the tiny config
    assert [e.step for e in events.Scalars("train/loss")] == list(range(1, 7))
    assert [e.step for e in events.Scalars("val/psnr")] == [3, 6]
    lr = [e.value for e in events.Scalars("train/lr/means")]
    assert lr[-1] < lr[0]  # the means' learning rate decays
    images = events.Tags()["images"]
    assert images and all(tag.startswith("val/") for tag in images)
    image = events.Images(images[0])[-1]
    assert (image.width, image.height) == (32 * 3, 24)  # render | ground truth | depth
    assert "config" in "".join(events.Tags()["tensors"])
    assert {"gaussians/opacity", "gaussians/log_scale"} <= set(events.Tags()["histograms"])
    assert [e.step for e in events.Histograms("gaussians/opacity")] == [3, 6]


def test_jsonl_writer_appends_records(make_trainer) -> None:
    trainer = make_trainer(max_steps=3, writers=[{"name": "JsonlWriter", "filename": "s.jsonl"}])
    trainer.train()
    records = [json.loads(line) for line in (trainer.exp_dir / "s.jsonl").read_text().splitlines()]
    names = {r["name"] for r in records}
    assert {"train/loss", "val/psnr", "time/step_s"} <= names
    assert all(set(r) == {"name", "value", "step"} for r in records)
    metrics = json.loads((trainer.exp_dir / "metrics.json").read_text())
    assert metrics["step"] == 3 and len(metrics["images"]) == 2
    assert metrics["mean"]["psnr"] == sum(v["psnr"] for v in metrics["images"]) / 2


def test_missing_lpips_weights_give_null_and_one_logged_warning(make_trainer, tmp_path, monkeypatch) -> None:
    import gsrecon.metrics

    monkeypatch.setenv("GSRECON_CACHE", str(tmp_path / "empty_cache"))
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "empty_torch_home"))
    monkeypatch.setattr(gsrecon.metrics, "_warned_no_lpips", False)  # the warning is once per process
    trainer = make_trainer(max_steps=6, metrics={"lpips_net": "alex"})
    trainer.train()
    metrics = json.loads((trainer.exp_dir / "metrics.json").read_text())
    assert metrics["mean"]["lpips"] is None and metrics["lpips"]["weights"] is None
    log = (trainer.exp_dir / "train.log").read_text()
    assert log.count("LPIPS is disabled") == 1 and "gsrecon weights lpips" in log


def test_progress_is_logged_as_lines_off_a_terminal(make_trainer) -> None:
    trainer = make_trainer(max_steps=4, hooks=[{"name": "LogHook", "log_interval": 2}])
    trainer.train()
    log = (trainer.exp_dir / "train.log").read_text().splitlines()
    progress = [line for line in log if "INFO step " in line and "Gaussians" in line and "it/s" in line]
    assert [line.split("INFO ")[1].split(":")[0] for line in progress] == ["step 2/4", "step 4/4"]
    assert all(line[:4].isdigit() for line in log)  # timestamped


def test_log_hook_writes_num_val_images_panels_into_the_writers_subdir(make_trainer) -> None:
    hooks = [{"name": "LogHook", "log_interval": 1, "num_val_images": 1}]
    trainer = make_trainer(writers=[{"name": "TensorboardWriter", "subdir": "events"}], hooks=hooks)
    trainer.train()
    assert len(trainer.val_results) == 2 and not (trainer.exp_dir / "tb").exists()
    events = EventAccumulator(str(trainer.exp_dir / "events"), size_guidance={"images": 0})
    events.Reload()
    assert events.Tags()["images"] == [f"val/{trainer.val_results[0]['name']}"]
