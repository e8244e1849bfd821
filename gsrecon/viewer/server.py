"""The viser server behind ``gsrecon view`` and the ``ViewerHook``: one Gaussian scene in the browser.

Two displays, switched in the page: viser's WebGL splat renderer in the browser (fast; base colours
only), or gsrecon's own renderer on the server (exact: the scene's SH degree and the renderer's
mode; colour, depth or alpha), whose image is sent as the page's background for each browser's
camera. Training cameras are drawn as frustums; clicking one moves that browser's camera to it.
A run's trained sky (the ``environment`` module's cube map, baked with its horizon:
:meth:`~gsrecon.render.environment.Sky.baked`) is drawn behind the Gaussians in both: on the server through
:meth:`~gsrecon.render.environment.Sky.draw`, in the browser as Gaussians on a far sphere (those of ``export
--format lod``).

Threads: viser calls back from its own threads; those callbacks only record what is asked for.
All rendering and sending happens in the thread that calls :meth:`SceneViewer.set_scene` and
:meth:`SceneViewer.process` (the trainer's, or the main thread of ``gsrecon view``).
"""

from __future__ import annotations

import contextlib
import io
import socket
import threading
import warnings
from collections.abc import Mapping

import numpy as np
import torch
import viser
from torch import Tensor

from gsrecon.cameras.paths import focus_point, mean_up
from gsrecon.cameras.rays import camera_rays
from gsrecon.data.formats.images import to_uint8
from gsrecon.data.scene import Scene
from gsrecon.geometry import camera_centers
from gsrecon.render.base import Renderer, RendererConfig, RenderOutput
from gsrecon.render.colormap import depth_image
from gsrecon.render.environment import Sky, composite, far_sphere_gaussians
from gsrecon.viewer import DISPLAYS, RESOLUTIONS, check_view_settings
from gsrecon.viewer.convert import SPLAT_KEYS, Pose, pose_of, splat_arrays, thumbnail, vertical_fov, view_of

OUTPUTS = ("rgb", "depth", "median depth", "alpha")  # "median depth" where the renderer renders it
OVERVIEW_DISTANCE = 1.6  # the first view is the first camera's, this much farther from what it looks at
THUMBNAIL_SIDE = 96  # px, longer side of the image shown in each training camera's frustum
WILDCARD_HOSTS = ("0.0.0.0", "::", "")
SKY_RADIUS = 50.0  # scene extents from the cameras' centre to the browser's sky sphere: moving about the scene
# shifts it by about 1/50 of the angle (the sky is at infinity; WebGL needs a finite sphere)


class SceneViewer:
    """A viser server showing Gaussian parameters (given by :meth:`set_scene`) and training cameras.

    Args:
        renderer: gsrecon renderer for the server-side display.
        scene: its training cameras are drawn as frustums with thumbnails; the first one is the
            initial view, orbiting the point the cameras look at.
        background: [3] colour behind the Gaussians in server-side renders.
        host, port: where to listen; port 0 picks a free one, a busy port the next free one
            (:attr:`url` says which).
        display: ``browser`` or ``server``, the display shown first.
        resolution: longer side in pixels of server-side renders (changeable in the page).
        pausable: show a Pause/Resume button (for training; see :attr:`paused`).
        max_steps: shown beside the step ("step 300 of 30000").
        median_depth: offer the median depth among the outputs (the renderer renders it: renderer.median_depth).
    """

    def __init__(
        self,
        renderer: Renderer,
        scene: Scene,
        background: Tensor,
        *,
        host: str = "127.0.0.1",
        port: int = 8080,
        display: str = "browser",
        resolution: int = 512,
        pausable: bool = False,
        max_steps: int | None = None,
        median_depth: bool = False,
    ) -> None:
        check_view_settings(display, resolution)
        self.renderer = renderer
        self.median_depth = median_depth
        self.background = background.detach().float()  # [3]
        self.max_steps = max_steps
        self.step: int | None = None
        self.num_gaussians = 0
        self.shown = display  # the display the page shows now (the dropdown may be ahead until `process`)
        self.paused = False
        self._params: Mapping[str, Tensor] | None = None
        self._sh_degree = 0
        self._sky: Sky | None = None  # the environment's baked cube map; None: the run has none
        self._splats_stale = True
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._display_changed = False
        self._to_render: set[int] = set()  # client ids whose server-side render is out of date
        self._with_camera: set[int] = set()  # client ids that have reported their camera
        self._splats: viser.GaussianSplatHandle | None = None

        with _quiet():
            self.server = viser.ViserServer(host=host, port=port, label="gsrecon", verbose=False)
        shown_host = socket.gethostname() if host in WILDCARD_HOSTS else host
        self.url = f"http://{shown_host}:{self.server.get_port()}"
        self._add_gui(display, resolution, pausable)
        self._add_cameras(scene)
        self.server.on_client_connect(self._on_connect)
        self.server.on_client_disconnect(self._on_disconnect)

    # ------------------------------------------------------------------ owner thread

    @property
    def num_clients(self) -> int:
        """Browsers connected now."""
        return len(self.server.get_clients())

    def set_scene(
        self, params: Mapping[str, Tensor], sh_degree: int, step: int | None = None, sky: Tensor | None = None
    ) -> None:
        """Show ``params`` (pre-activation Gaussians, kept by reference: pass a copy of tensors that
        will change) rendered at ``sh_degree``, at training ``step`` (None: unknown), in front of the
        environment cube map ``sky`` [6, R, R, 3] (colours in [0, 1], its horizon baked in: ``trained_sky`` with a
        background; None: the background)."""
        self._params, self._sh_degree, self.step = params, sh_degree, step
        self._sky = None if sky is None else Sky(sky.detach().float())
        self.num_gaussians = int(params["means"].shape[0])
        self._splats_stale = True
        self.info_text.content = self._info()
        self.status_text.content = self._status()
        if self.shown == "browser":
            self._send_splats()
        else:
            with self._lock:
                self._to_render |= self._with_camera
            self._render_pending()

    def set_camera_poses(self, viewmats: Tensor) -> None:
        """Draw the training cameras at ``viewmats`` [F, 4, 4] (world-to-camera, in the scene's training order), e.g.
        where pose refinement moved them."""
        for frustum, viewmat in zip(self._frustums, viewmats, strict=True):
            pose = pose_of(viewmat)
            frustum.wxyz, frustum.position = pose.wxyz, pose.position

    def process(self, timeout: float = 0.0) -> None:
        """Wait up to ``timeout`` seconds for something to do, then do what the page asked for:
        switch the display, render for browsers whose camera or settings changed."""
        if timeout > 0.0:
            self._wake.wait(timeout)
        self._wake.clear()
        with self._lock:
            display_changed, self._display_changed = self._display_changed, False
        if display_changed:
            self._apply_display()
        self._render_pending()

    def serve_forever(self, stop: threading.Event | None = None) -> None:
        """Serve pages until ``stop`` is set (without one: until Ctrl-C raises KeyboardInterrupt)."""
        while stop is None or not stop.is_set():
            self.process(timeout=0.5)

    def close(self) -> None:
        """Stop the server (connected pages lose their connection)."""
        with _quiet():
            self.server.stop()

    def _apply_display(self) -> None:
        self.shown = display_key(self.display_dropdown.value)
        server_side = self.shown == "server"
        self.output_dropdown.visible = server_side
        self.resolution_slider.visible = server_side
        if server_side:
            if self._splats is not None:
                self._splats.visible = False
            with self._lock:
                self._to_render |= self._with_camera
        else:
            for client in self.server.get_clients().values():
                client.scene.set_background_image(None)
            if self._splats_stale:
                self._send_splats()
            elif self._splats is not None:
                self._splats.visible = True
        self.status_text.content = self._status()

    def _send_splats(self) -> None:
        if self._params is None:
            return
        gaussians = self._params
        if self._sky is not None:  # one set of splats, so that the browser sorts the sky's with the scene's
            device = gaussians["means"].device
            sphere = far_sphere_gaussians(self._sky.colors.to(device), self._sky_center.to(device), self._sky_radius)
            gaussians = {key: torch.cat([gaussians[key].float(), sphere[key]]) for key in SPLAT_KEYS}
            self.server.initial_camera.far = max(self.server.initial_camera.far, 4.0 * self._sky_radius)
        arrays = splat_arrays(gaussians)
        self._splats = self.server.scene.add_gaussian_splats(
            "/gaussians", arrays.centers, arrays.covariances, arrays.rgbs, arrays.opacities
        )
        self._splats_stale = False

    def _render_pending(self) -> None:
        with self._lock:
            pending, self._to_render = self._to_render, set()
        if self.shown != "server" or self._params is None:
            return
        clients = self.server.get_clients()
        for client_id in sorted(pending):
            if client_id in clients:
                self._render_for(clients[client_id])

    def _render_for(self, client: viser.ClientHandle) -> None:
        camera = client.camera
        view = view_of(Pose(camera.wxyz, camera.position), camera.fov, camera.aspect, self.resolution_slider.value)
        device = self._params["means"].device
        with torch.no_grad():
            cameras, background = view.to(device), self.background.to(device)[None]  # [1, 3]
            out = self.renderer.render(self._params, cameras, self._sh_degree, background)
            if self._sky is not None:
                out = composite(out, self._sky.draw(camera_rays(cameras), background), background)
        image = output_image(out, self.output_dropdown.value)
        with warnings.catch_warnings():  # the page may have closed during the render: nothing to send to
            warnings.filterwarnings("ignore", message="Queued a .* on a closed connection")
            client.scene.set_background_image(image, format="jpeg", jpeg_quality=90)

    # ------------------------------------------------------------------ page

    def _add_gui(self, display: str, resolution: int, pausable: bool) -> None:
        gui = self.server.gui
        self.info_text = gui.add_markdown(self._info())
        self.display_dropdown = gui.add_dropdown("Display", list(DISPLAYS.values()), initial_value=DISPLAYS[display])
        self.status_text = gui.add_markdown("")
        outputs = [o for o in OUTPUTS if o != "median depth" or self.median_depth]
        self.output_dropdown = gui.add_dropdown("Output", outputs, visible=display == "server")
        self.resolution_slider = gui.add_slider(
            "Resolution (px)",
            min=RESOLUTIONS[0],
            max=RESOLUTIONS[1],
            step=32,
            initial_value=resolution,
            visible=display == "server",
        )
        self.cameras_checkbox = gui.add_checkbox("Training cameras", True)
        self.pause_button = gui.add_button("Pause training", icon=viser.Icon.PLAYER_PAUSE, visible=pausable)
        self.status_text.content = self._status()

        self.display_dropdown.on_update(lambda _: self._request(display_changed=True))
        self.output_dropdown.on_update(lambda _: self._request(render_all=True))
        self.resolution_slider.on_update(lambda _: self._request(render_all=True))
        self.cameras_checkbox.on_update(lambda _: self._show_cameras(self.cameras_checkbox.value))
        self.pause_button.on_click(lambda _: self.set_paused(not self.paused))

    def _add_cameras(self, scene: Scene) -> None:
        viewmats = scene.train_cameras.viewmats.double().cpu()  # [F, 4, 4]
        self._sky_center = camera_centers(viewmats).mean(dim=0).float()  # [3]
        self._sky_radius = SKY_RADIUS * scene.extent
        self.server.scene.set_up_direction(tuple(mean_up(viewmats).tolist()))
        first, distance = scene.train[0], orbit_distance(viewmats, scene)
        forward = viewmats[0, 2, :3]  # [3] the first camera's optical axis in world coordinates
        focus = camera_centers(viewmats[0]) + distance * forward  # [3]
        initial = self.server.initial_camera
        initial.position = tuple((focus - OVERVIEW_DISTANCE * distance * forward).tolist())
        initial.look_at = tuple(focus.tolist())
        initial.up = tuple((-viewmats[0, 1, :3]).tolist())
        initial.fov = vertical_fov(first.K, first.height)
        size = 0.05 * scene.extent
        self._frustums = []
        for index, frame in enumerate(scene.train):
            pose = pose_of(frame.viewmat)
            frustum = self.server.scene.add_camera_frustum(
                f"/cameras/{index:05d}",
                fov=vertical_fov(frame.K, frame.height),
                aspect=frame.width / frame.height,
                scale=size,
                thickness=0.05 * size,
                color=(230, 120, 20),
                image=thumbnail(frame.image, THUMBNAIL_SIDE),
                wxyz=pose.wxyz,
                position=pose.position,
            )
            frustum.on_click(self._move_to_frustum)
            self._frustums.append(frustum)

    def _info(self) -> str:
        if self._params is None:
            return "**Scene:** waiting for Gaussians"
        step = "" if self.step is None else f" · step {self.step:,}"
        if self.step is not None and self.max_steps is not None:
            step += f" of {self.max_steps:,}"
        paused = " · **training paused**" if self.paused else ""
        return f"**Scene:** {self.num_gaussians:,} Gaussians{step}{paused}"

    def _status(self) -> str:
        if self.shown == "browser":
            return "Shown: viser's WebGL splats in the browser (base colour only: SH degree 0, no antialiasing)"
        cfg = getattr(self.renderer, "cfg", None)
        mode = "antialiased" if isinstance(cfg, RendererConfig) and cfg.antialiased else "classic"
        device = "" if self._params is None else f" on {self._params['means'].device}"
        return (
            f"Shown: gsrecon's {type(self.renderer).__name__}{device}, rendered on the server: "
            f"SH degree {self._sh_degree}, {mode} mode"
        )

    # ------------------------------------------------------------------ viser's threads

    def set_paused(self, paused: bool) -> None:
        """Pause or resume (what the page's button does); :attr:`paused` is read by the training loop."""
        self.paused = paused
        self.pause_button.label = "Resume training" if paused else "Pause training"
        self.pause_button.icon = viser.Icon.PLAYER_PLAY if paused else viser.Icon.PLAYER_PAUSE
        self.info_text.content = self._info()
        self._wake.set()

    def _request(self, display_changed: bool = False, render_all: bool = False) -> None:
        with self._lock:
            self._display_changed |= display_changed
            if render_all:
                self._to_render |= self._with_camera
        self._wake.set()

    def _on_connect(self, client: viser.ClientHandle) -> None:
        """viser calls this once the page has reported its camera: render for it without waiting for a move."""

        def camera_moved(_: viser.CameraHandle | None = None) -> None:
            with self._lock:
                self._with_camera.add(client.client_id)
                self._to_render.add(client.client_id)
            self._wake.set()

        client.camera.on_update(camera_moved)
        camera_moved()

    def _on_disconnect(self, client: viser.ClientHandle) -> None:
        with self._lock:
            self._with_camera.discard(client.client_id)
        if self.paused and not self.server.get_clients():
            self.set_paused(False)  # nobody is left to press Resume
        self._wake.set()

    def _show_cameras(self, visible: bool) -> None:
        for frustum in self._frustums:
            frustum.visible = visible

    def _move_to_frustum(self, event: viser.SceneNodePointerEvent) -> None:
        frustum, client = event.target, event.client
        with client.atomic():
            client.camera.fov = frustum.fov
            client.camera.wxyz = frustum.wxyz
            client.camera.position = frustum.position


def _quiet() -> contextlib.AbstractContextManager:
    """Silence viser's own stdout messages (its URL banner, "Server stopped"): gsrecon reports the URL."""
    return contextlib.redirect_stdout(io.StringIO())


def orbit_distance(viewmats: Tensor, scene: Scene) -> float:
    """Distance from the first camera of ``viewmats`` [F, 4, 4] to the point the cameras look at
    (the scene radius where that point is undefined: parallel cameras and no scene points)."""
    try:
        focus = focus_point(viewmats, scene.points)  # [3]
    except ValueError:
        return scene.extent
    return float((focus - camera_centers(viewmats[0])).norm())


def display_key(label: str) -> str:
    """The :data:`DISPLAYS` key of the Display dropdown's ``label``."""
    return next(key for key, text in DISPLAYS.items() if text == label)


def output_image(out: RenderOutput, output: str) -> np.ndarray:
    """The first camera of ``out`` as uint8 [H, W, 3]: ``rgb``, ``depth`` or ``median depth`` (colour-mapped) or
    ``alpha`` (grey)."""
    if output in ("depth", "median depth"):
        return depth_image(out, "median" if output == "median depth" else "expected")
    if output == "alpha":
        return to_uint8(out.alpha[0].expand(-1, -1, 3))
    return to_uint8(out.image[0])
