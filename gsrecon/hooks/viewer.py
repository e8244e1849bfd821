"""ViewerHook: the scene in a web browser while it trains (viser, the optional ``[viewer]`` extra)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from gsrecon.engine.hook import Hook, Priority
from gsrecon.model.views.environment import trained_sky
from gsrecon.registry import HOOK_REGISTRY
from gsrecon.viewer import check_view_settings, require_viser

if TYPE_CHECKING:
    from gsrecon.engine.hook import TrainerView
    from gsrecon.viewer.server import SceneViewer


@HOOK_REGISTRY.register()
class ViewerHook(Hook):
    """Serves the training scene to web browsers (`gsrecon.viewer.server.SceneViewer`), on the main process only.

    - ``before_train``: starts the server and logs its URL.
    - ``after_train_iter``: does nothing while no browser is connected. Otherwise shows the current
      Gaussians once at least ``refresh_steps`` steps and ``refresh_seconds`` seconds have passed
      since they were last shown, and renders for browsers whose camera moved (gsrecon display). This
      work runs in the training thread, between steps, and takes at most ``max_overhead`` of the
      training time plus one piece of work: after work of ``t`` seconds the hook does nothing for
      ``t / max_overhead - t`` seconds. (One piece can be long: a gsrecon render at a high
      resolution with the torch renderer on a CPU takes seconds.) While the page's Pause button is
      on, it blocks (still serving the page) until Resume is pressed or the last browser disconnects.
    - ``after_train``: logs how long the viewer worked in the training thread.
    - ``after_run``: with ``keep_alive``, when training reached ``max_steps``, shows the final scene
      and serves it until Ctrl-C; then stops the server.

    Building the hook needs viser (``pip install -e .[viewer]``); a missing viser fails there.
    """

    priority = Priority.VERY_LOW  # after logging and checkpoints: a pause holds a finished step

    @dataclass
    class Config:
        host: str = "127.0.0.1"  # 0.0.0.0 serves other machines too
        port: int = 8080  # the next free one when busy (the log says which); 0: any free port
        display: str = "browser"  # first display: browser (viser's WebGL splats) | server (gsrecon's renderer)
        resolution: int = 512  # px, longer side of server-side renders
        refresh_steps: int = 10  # show new Gaussians at most every this many steps ...
        refresh_seconds: float = 1.0  # ... and at most every this many seconds
        max_overhead: float = 0.1  # fraction of training time the viewer may use while a browser is connected
        keep_alive: bool = True  # after training, serve the final scene until Ctrl-C

    def __init__(self, cfg: Config) -> None:
        require_viser()
        check_view_settings(cfg.display, cfg.resolution)
        if cfg.refresh_steps < 1:
            raise ValueError(f"ViewerHook refresh_steps must be >= 1, got {cfg.refresh_steps}")
        if cfg.refresh_seconds < 0.0:
            raise ValueError(f"ViewerHook refresh_seconds must be >= 0, got {cfg.refresh_seconds}")
        if not 0.0 < cfg.max_overhead <= 1.0:
            raise ValueError(f"ViewerHook max_overhead must be in (0, 1], got {cfg.max_overhead}")
        self.cfg = cfg
        self.viewer: SceneViewer | None = None
        self.busy_seconds = 0.0  # viewer work done in the training thread
        self.paused_at: int | None = None  # the step training is held at by the Pause button
        self._shown_step: int | None = None
        self._shown_time = -math.inf
        self._idle_until = -math.inf

    def before_train(self, trainer: TrainerView) -> None:
        if not trainer.is_main:
            return
        from gsrecon.viewer.server import SceneViewer

        self.viewer = SceneViewer(
            trainer.renderer,
            trainer.datapipeline.scene,
            trainer.datapipeline.fixed_background(),
            host=self.cfg.host,
            port=self.cfg.port,
            display=self.cfg.display,
            resolution=self.cfg.resolution,
            pausable=True,
            max_steps=trainer.max_steps,
        )
        trainer.logger.info(f"viewer: {self.viewer.url}")

    def after_train_iter(self, trainer: TrainerView) -> None:
        if self.viewer is None or self.viewer.num_clients == 0:
            return
        if self.viewer.paused:
            self._hold(trainer)
            return
        start = time.perf_counter()
        if start < self._idle_until:
            return
        if self._shown_step is None or (
            trainer.step - self._shown_step >= self.cfg.refresh_steps
            and start - self._shown_time >= self.cfg.refresh_seconds
        ):
            self._show(trainer)
        self.viewer.process()
        spent = time.perf_counter() - start
        self.busy_seconds += spent
        self._idle_until = start + spent / self.cfg.max_overhead

    def after_train(self, trainer: TrainerView) -> None:
        if self.viewer is not None and self.busy_seconds > 0.0:
            trainer.logger.info(f"viewer: {self.busy_seconds:.2f} s of work in the training loop")

    def after_run(self, trainer: TrainerView) -> None:
        if self.viewer is None:
            return
        try:
            if self.cfg.keep_alive and trainer.step >= trainer.max_steps and not trainer.stop_reason:
                self._show(trainer)
                trainer.logger.info(f"training finished; the viewer still serves {self.viewer.url}: Ctrl-C to exit")
                self.viewer.serve_forever()
        except KeyboardInterrupt:
            pass  # how a user ends keep_alive: the run finished normally
        finally:
            self.viewer.close()
            self.viewer = None

    def _show(self, trainer: TrainerView) -> None:
        """Send a copy of the current Gaussians to the viewer (training goes on changing the originals)."""
        params = {k: v.detach().clone() for k, v in trainer.model.params.items()}
        sky = trained_sky(trainer.views, trainer.datapipeline.fixed_background())
        self.viewer.set_scene(params, trainer.model.active_sh_degree(trainer.step), trainer.step, sky=sky)
        if trainer.views:  # the training cameras where the per-view modules place them (pose refinement)
            frames = trainer.datapipeline.scene.train
            given = trainer.datapipeline.scene.train_cameras.viewmats.float().to(trainer.device)  # [F, 4, 4]
            with torch.no_grad():
                self.viewer.set_camera_poses(trainer.views.camera_poses(given, [frame.name for frame in frames]))
        self._shown_step, self._shown_time = trainer.step, time.perf_counter()

    def _hold(self, trainer: TrainerView) -> None:
        """Serve the page without training until Resume (or until no browser is left)."""
        self.paused_at = trainer.step
        self._show(trainer)
        trainer.logger.info(f"viewer: training paused at step {trainer.step}; press Resume in the page to go on")
        while self.viewer.paused:
            self.viewer.process(timeout=0.5)
        self.paused_at = None
        trainer.logger.info("viewer: training resumed")
