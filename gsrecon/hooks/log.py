"""LogHook: EMA loss, the progress bar, training scalars, and validation metrics and images."""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from gsrecon.engine.hook import Hook, Priority
from gsrecon.logging.console import ProgressLogger
from gsrecon.registry import HOOK_REGISTRY

if TYPE_CHECKING:
    from gsrecon.engine.hook import TrainerView

STARTS = {"sfm": "SfM points", "random": "random points", "ply": "a PLY"}  # GaussianModel.start, in words


@HOOK_REGISTRY.register()
class LogHook(Hook):
    """Reports training through the trainer's writers and console.

    - every step: updates the EMA of the loss (``ema = f·loss + (1 - f)·ema``, on the device) and the
      progress bar (on an interactive terminal; elsewhere a plain progress line every ``log_interval`` steps);
    - every ``log_interval`` steps (the only steps it reads values back from the GPU): ``train/loss``,
      ``train/ema_loss``, ``train/loss/<key>`` for every weighted term the step's loss was the sum of (loss
      terms, per-view and strategy regularisation), ``train/num_gaussians``, ``train/sh_degree`` and
      ``train/lr/<group>``; the progress bar's loss is refreshed then;
    - every ``histogram_interval`` steps (0: never): histograms of opacities and log-scales;
    - after each validation: ``val/<metric>`` scalars, render | ground truth | depth images of the
      first ``num_val_images`` views and a console line.
    """

    priority = Priority.BELOW_NORMAL

    @dataclass
    class Config:
        log_interval: int = 10
        ema_factor: float = 0.4  # weight of the newest loss in the EMA
        progress: bool = True  # draw the progress bar (on interactive terminals)
        num_val_images: int = 4  # validation views written as images
        histogram_interval: int = 0

    def __init__(self, cfg: Config) -> None:
        if cfg.log_interval < 1:
            raise ValueError(f"LogHook log_interval must be >= 1, got {cfg.log_interval}")
        if not 0 < cfg.ema_factor <= 1:
            raise ValueError(f"LogHook ema_factor must be in (0, 1], got {cfg.ema_factor}")
        self.cfg = cfg
        self._ema: torch.Tensor | None = None  # float64 scalar on the loss's device; NaN before the first finite loss
        self._ema_text = "-"  # the EMA as last read, shown by the progress bar
        self._progress: ProgressLogger | None = None
        self._mark = (0, 0.0)  # (step, time) of the last plain progress line

    def before_train(self, trainer: TrainerView) -> None:
        train = trainer.datapipeline.scene.train
        sizes = sorted({f"{f.width}x{f.height}" for f in train})
        sources = Counter(f.source for f in train if f.source)
        made = "; ".join(how if n == len(train) else f"{n} {how}" for how, n in sources.items())
        start = getattr(trainer.model, "start", "") if trainer.step == 0 else ""
        started = f" from {STARTS.get(start, start)}" if start else ""
        factor = trainer.resolved_config["data"]["factor"]
        trainer.logger.info(
            f"training {trainer.model.num_gaussians} Gaussians{started} on {trainer.datapipeline.num_train} views at "
            f"{', '.join(sizes)} (data.factor {factor}{'; images ' + made if made else ''}; "
            f"{trainer.datapipeline.num_val} for validation) on {trainer.device}, "
            f"{torch.get_num_threads()} CPU threads; output in {trainer.exp_dir}"
        )
        hint = trainer.datapipeline.scene.points_hint
        if start == "random" and hint:
            trainer.logger.warning(f"the data has no SfM points to start from; {hint}")
        if self.cfg.progress and trainer.is_main and trainer.logger.console.is_terminal:
            self._progress = ProgressLogger(trainer.max_steps, trainer.logger.console)
            self._progress.start(trainer.step)
        self._mark = (trainer.step, time.perf_counter())

    def after_train_iter(self, trainer: TrainerView) -> None:
        out, step = trainer.outputs, trainer.step
        self._update_ema(out["loss"])
        if step % self.cfg.log_interval == 0:
            self._log_step(trainer, step)
        elif self._progress is not None:
            self._progress.update(step, loss=self._ema_text, num_gaussians=out["num_gaussians"])
        if self.cfg.histogram_interval > 0 and step % self.cfg.histogram_interval == 0:
            params = trainer.model.params
            writers = trainer.writers
            writers.write_histogram("gaussians/opacity", torch.sigmoid(params["opacities"].detach()), step)
            writers.write_histogram("gaussians/log_scale", params["scales"].detach().flatten(), step)

    def _log_step(self, trainer: TrainerView, step: int) -> None:
        """The progress line and the training scalars: the only per-step values read back from the device."""
        out = trainer.outputs
        loss, ema = float(out["loss"]), self.ema_loss
        self._ema_text = "-" if ema is None else f"{ema:.4f}"
        if self._progress is not None:
            self._progress.update(step, loss=self._ema_text, num_gaussians=out["num_gaussians"])
        elif self.cfg.progress:
            last_step, last_time = self._mark
            now = time.perf_counter()
            speed = (step - last_step) / max(now - last_time, 1e-9)
            trainer.logger.info(
                f"step {step}/{trainer.max_steps}: loss {ema or loss:.4f}, "
                f"{out['num_gaussians']} Gaussians, {speed:.1f} it/s"
            )
            self._mark = (step, now)
        writers = trainer.writers
        writers.write_scalar("train/loss", loss, step)
        if ema is not None:
            writers.write_scalar("train/ema_loss", ema, step)
        for key, value in out["losses"].items():
            writers.write_scalar(f"train/loss/{key}", float(value), step)
        writers.write_scalar("train/num_gaussians", out["num_gaussians"], step)
        writers.write_scalar("train/sh_degree", out["sh_degree"], step)
        for name, optimizer in trainer.optimizers.items():
            writers.write_scalar(f"train/lr/{name}", optimizer.param_groups[0]["lr"], step)

    def after_val_iter(self, trainer: TrainerView, index: int, outputs: dict[str, Any]) -> None:
        if index >= self.cfg.num_val_images:
            return
        from gsrecon.render.colormap import depth_to_rgb

        depth = torch.from_numpy(depth_to_rgb(outputs["depth"][..., 0], outputs["alpha"][..., 0])).float() / 255.0
        panel = torch.cat([outputs["render"].cpu(), outputs["gt"].cpu(), depth], dim=1)  # [H, 3W, 3]
        trainer.writers.write_image(f"val/{outputs['name']}", panel, trainer.step)

    def after_val(self, trainer: TrainerView) -> None:
        metrics = trainer.val_metrics
        for name, value in metrics.items():
            if value is not None:
                trainer.writers.write_scalar(f"val/{name}", value, trainer.step)
        text = ", ".join(f"{k} {v:.4f}" if v is not None else f"{k} n/a" for k, v in metrics.items())
        trainer.logger.info(f"step {trainer.step}: validation {text} ({len(trainer.val_results)} views)")
        trainer.writers.flush()

    def after_train(self, trainer: TrainerView) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def _update_ema(self, loss: torch.Tensor) -> None:
        """``ema = f·loss + (1 - f)·ema`` on the loss's device, skipping a non-finite loss; nothing is read back."""
        loss = loss.detach().double()
        previous = loss.new_tensor(math.nan) if self._ema is None else self._ema.to(loss.device)
        f = self.cfg.ema_factor
        blended = torch.where(torch.isnan(previous), loss, f * loss + (1.0 - f) * previous)
        self._ema = torch.where(torch.isfinite(loss), blended, previous)

    @property
    def ema_loss(self) -> float | None:
        """The EMA of the training loss (None before the first finite loss); reading it waits for the GPU."""
        value = math.nan if self._ema is None else float(self._ema)
        return None if math.isnan(value) else value

    def state_dict(self) -> dict[str, Any]:
        return {"ema_loss": self.ema_loss}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        ema = state.get("ema_loss")
        self._ema = None if ema is None else torch.tensor(ema, dtype=torch.float64)
