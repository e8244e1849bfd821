"""The PlayCanvas engine in headless Chromium drawing a streamed SOG site (``lod-meta.json``) from a camera.

A local HTTP server serves a page, the engine (from the web readers' ``node_modules``) and the site; the page
loads the site into a unified gsplat component held at one level (``lodRangeMin`` = ``lodRangeMax``), places a
camera at the given world-to-camera pose (OpenCV axes) with the given pinhole intrinsics, waits until the engine
has streamed the level in and the frame stopped changing, and posts the canvas back as a PNG.
"""

from __future__ import annotations

import base64
import http.server
import io
import json
import subprocess
import threading
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

DEADLINE_S = 120

PAGE = """<!doctype html>
<html><body style="margin:0;background:#000">
<canvas id="c" width="{width}" height="{height}" style="width:{width}px;height:{height}px"></canvas>
<script type="module">
import * as pc from '/node_modules/playcanvas/build/playcanvas.mjs';
const setup = {setup};
const report = (path, body) => fetch(path, {{method: 'POST', body}});
try {{
  const canvas = document.getElementById('c');
  const device = await pc.createGraphicsDevice(canvas, {{
    deviceTypes: ['webgl2'], antialias: false, preserveDrawingBuffer: true
  }});
  const app = new pc.Application(canvas, {{graphicsDevice: device}});
  app.setCanvasFillMode(pc.FILLMODE_NONE);
  app.setCanvasResolution(pc.RESOLUTION_FIXED, setup.width, setup.height);
  app.start();
  const camera = new pc.Entity('camera');
  const [r, g, b] = setup.background;
  camera.addComponent('camera', {{
    clearColor: new pc.Color(r, g, b, 1), fov: setup.fov, horizontalFov: false,
    nearClip: setup.near, farClip: setup.far, toneMapping: pc.TONEMAP_NONE, gammaCorrection: pc.GAMMA_SRGB
  }});
  const m = new pc.Mat4();
  m.data.set(setup.cameraToWorld);
  camera.setPosition(m.getTranslation());
  camera.setRotation(new pc.Quat().setFromMat4(m));
  app.root.addChild(camera);
  const asset = new pc.Asset('site', 'gsplat', {{url: setup.url}});
  app.assets.add(asset);
  await new Promise((resolve, reject) => {{
    asset.once('load', resolve);
    asset.once('error', reject);
    app.assets.load(asset);
  }});
  const splats = new pc.Entity('splats');
  splats.addComponent('gsplat', {{asset, unified: true}});
  splats.gsplat.lodRangeMin = setup.level;
  splats.gsplat.lodRangeMax = setup.level;
  app.root.addChild(splats);
  const pixels = () => {{
    const gl = device.gl;
    const out = new Uint8Array(setup.width * setup.height * 4);
    gl.readPixels(0, 0, setup.width, setup.height, gl.RGBA, gl.UNSIGNED_BYTE, out);
    return out;
  }};
  let last = null, same = 0, frames = 0;
  app.on('frameend', () => {{
    frames += 1;
    if (frames < 30 || same < 0) return;
    const now = pixels();
    const changed = last === null || now.some((v, i) => v !== last[i]);
    same = changed ? 0 : same + 1;
    last = now;
    if (same >= 20) {{
      same = -1;
      report('/shot', canvas.toDataURL('image/png'));
    }}
  }});
}} catch (error) {{
  report('/error', String(error && error.stack || error));
}}
</script></body></html>
"""


def camera_to_world_playcanvas(viewmat: np.ndarray) -> list[float]:
    """PlayCanvas's camera-to-world matrix (column-major, 16 floats: x right, y up, looking down -z) of a
    world-to-camera ``viewmat`` [4, 4] in OpenCV axes (x right, y down, z forward)."""
    c2w = np.linalg.inv(viewmat.astype(np.float64))
    c2w[:3, 1:3] *= -1
    return c2w.T.reshape(-1).tolist()


def draw_site(
    chromium: str,
    node_modules: Path,
    site: Path,
    viewmat: np.ndarray,
    K: np.ndarray,
    width: int,
    height: int,
    background: tuple[float, float, float],
    level: int,
    profile: Path,
) -> np.ndarray:
    """The PlayCanvas engine's picture (uint8 [height, width, 3]) of the site whose ``lod-meta.json`` is in ``site``,
    at ``level``, seen from ``viewmat`` [4, 4] (OpenCV world-to-camera) through the centred pinhole ``K`` [3, 3]."""
    setup = {
        "url": "/site/lod-meta.json",
        "width": width,
        "height": height,
        "background": list(background),
        "fov": float(np.degrees(2 * np.arctan(height / 2 / K[1, 1]))),
        "near": 0.01,
        "far": 1000.0,
        "cameraToWorld": camera_to_world_playcanvas(viewmat),
        "level": level,
    }
    page = PAGE.format(width=width, height=height, setup=json.dumps(setup)).encode()
    roots = {"/node_modules/": node_modules, "/site/": site}
    result: dict[str, Any] = {}
    done = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            body, kind = (page, "text/html") if path == "/" else (None, "")
            for prefix, root in roots.items():
                file = root / path.removeprefix(prefix)
                if path.startswith(prefix) and file.resolve().is_relative_to(root.resolve()) and file.is_file():
                    body = file.read_bytes()
                    kind = "text/javascript" if file.suffix in (".mjs", ".js") else "application/octet-stream"
                    kind = "application/json" if file.suffix == ".json" else kind
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            result[self.path] = self.rfile.read(int(self.headers["Content-Length"])).decode()
            self.send_response(204)
            self.end_headers()
            done.set()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    browser = subprocess.Popen(
        [
            chromium, "--headless", "--no-sandbox", "--disable-gpu", "--use-angle=swiftshader",
            "--enable-unsafe-swiftshader", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run", f"--user-data-dir={profile}", f"--window-size={width},{height}",
            "--remote-debugging-port=0", f"http://127.0.0.1:{server.server_address[1]}/",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        if not done.wait(DEADLINE_S):
            raise AssertionError(f"the page drew nothing within {DEADLINE_S} s")
    finally:
        browser.terminate()
        browser.wait(timeout=DEADLINE_S)
        server.shutdown()
    if "/error" in result:
        raise AssertionError(f"the PlayCanvas page failed: {result['/error']}")
    png = base64.b64decode(result["/shot"].split(",", 1)[1])
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
