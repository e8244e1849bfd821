"""Make the documentation's pictures from a real run of README's quickstart (the synthetic scene).

    python scripts/make_doc_pictures.py --work /tmp/doc_pictures [--steps 3000] [--threads 2]

Writes into docs/: ``quickstart_scene.png`` (test views as rendered beside their photos), ``viewer.png`` (``gsrecon
view`` in headless Chromium), ``tensorboard_scalars.png`` and ``tensorboard_images.png`` (TensorBoard served from the
run's ``tb/``, offline), ``lod_synthetic_playcanvas.png`` (the PlayCanvas engine drawing the run's streamed SOG site,
level 0 and level 2; needs node and ``scripts/web_readers.sh``) and ``bench_psnr_vs_time.png`` (``scripts/
bench_quality.py`` on the same config). Needs ``chromium`` (``apt-get install chromium``) and the viewer extra.
"""

from __future__ import annotations

import argparse
import base64
import io
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the Chromium drivers the viewer's and the lod site's tests use

from lod_browser import draw_site  # noqa: E402
from test_viewer import Chromium, _view_in_chromium, _white, wait_for  # noqa: E402

from gsrecon.engine.build import build_datapipeline  # noqa: E402
from gsrecon.engine.inference import load_trained_scene  # noqa: E402

DOCS = ROOT / "docs"
# The close button of viser's note that this headless browser draws WebGL in software (about this machine, not the
# scene): the innermost element holding the note's text, then the nearest enclosing button.
DISMISS_NOTE = """(() => {
  let node = [...document.querySelectorAll('div')].filter(d => (d.innerText || '').startsWith('Software WebGL')).pop();
  while (node && !node.querySelector('button')) node = node.parentElement;
  node?.querySelector('button')?.click();
})()"""
MAX_KIB = 300  # each picture's size in the repository
ZOOM = 4  # the synthetic scene's 64 x 48 views, shown 4x larger (nearest: its pixels as trained)


def profile(work: Path) -> Path:
    """A fresh Chromium profile folder (a used one holds a stale DevTools port)."""
    return Path(tempfile.mkdtemp(prefix="chromium_", dir=work))


def gsrecon(*args: str) -> None:
    """Run a gsrecon command as a user types it."""
    subprocess.run([sys.executable, "-m", "gsrecon", *args], cwd=ROOT, check=True)


def save(image: Image.Image, name: str) -> None:
    """Write ``docs/<name>`` as a PNG under ``MAX_KIB`` (smaller by a tenth until it is) and say how large it is."""
    path = DOCS / name
    while True:
        image.save(path, optimize=True)
        if path.stat().st_size <= MAX_KIB * 1024:
            break
        image = image.resize((image.width * 9 // 10, image.height * 9 // 10), Image.LANCZOS)
    print(f"wrote {path} ({image.width}x{image.height}, {path.stat().st_size // 1024} KiB)")


def quickstart_scene(exp_dir: Path) -> None:
    """Each test view: its photo above the trained scene's render, side by side."""
    renders = sorted((exp_dir / "eval" / "renders" / "test").glob("*.png"))
    columns = [
        np.concatenate([np.asarray(Image.open(exp_dir / "eval" / "gt" / r.name).convert("RGB")),
                        np.asarray(Image.open(r).convert("RGB"))], axis=0)
        for r in renders
    ]  # fmt: skip
    gap = np.full((columns[0].shape[0], 2, 3), 255, np.uint8)
    strip = np.concatenate([part for column in columns for part in (column, gap)][:-1], axis=1)
    image = Image.fromarray(strip)
    save(image.resize((image.width * ZOOM, image.height * ZOOM), Image.NEAREST), "quickstart_scene.png")


def evaluate(browser: Chromium, expression: str) -> object:
    """The value of a JavaScript expression in the browser's page."""
    return browser.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")


def capture(browser: Chromium) -> Image.Image:
    png = base64.b64decode(browser.call("Page.captureScreenshot", format="png")["data"])
    return Image.open(io.BytesIO(png)).convert("RGB")


def viewer(exp_dir: Path, work: Path) -> None:
    """viser's page of the trained scene: the browser's splats and the training cameras' frustums."""
    with _view_in_chromium(str(exp_dir), profile(work)) as (url, browser):
        browser.open(url)
        browser.screenshot(work / "viewer.png", lambda shot: _white(shot) < 0.8, "the splats")
        evaluate(browser, DISMISS_NOTE)
        time.sleep(1.0)
        save(capture(browser), "viewer.png")


def tensorboard_page(browser: Chromium, url: str, tags: str, kind: str) -> Image.Image:
    """TensorBoard's time series of the tags matching the regular expression ``tags``, of one ``kind`` of card
    (All, Scalars, Image), without its settings pane."""
    browser.call("Page.navigate", url=url)
    wait_for(
        lambda: "cards" in str(evaluate(browser, "document.body?.innerText ?? ''")), f"TensorBoard's cards at {url}"
    )
    evaluate(
        browser,
        f"""(() => {{ const input = document.querySelector('input[placeholder^="Filter tags"]');
        input.value = {tags!r}; input.dispatchEvent(new Event('input', {{bubbles: true}})); }})()""",
    )
    evaluate(browser, f"[...document.querySelectorAll('button')].find(b => b.innerText.trim() == {kind!r})?.click()")
    evaluate(browser, "[...document.querySelectorAll('button')].find(b => b.innerText.trim() == 'Settings')?.click()")
    time.sleep(6.0)  # the charts draw
    return capture(browser)


def tensorboard(exp_dir: Path, work: Path) -> None:
    """TensorBoard serving the run's events (offline): the training loss, Gaussians and test PSNR; the test views."""
    server = subprocess.Popen(
        [str(Path(sys.executable).with_name("tensorboard")), "--logdir", str(exp_dir / "tb"), "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        line = next(line for line in server.stdout if "http://" in line)
        url = next(word for word in line.split() if word.startswith("http://"))
        browser = Chromium(profile(work))
        try:
            browser.call(
                "Emulation.setDeviceMetricsOverride", width=1000, height=1000, deviceScaleFactor=1, mobile=False
            )
            scalars = tensorboard_page(browser, url, "train/loss$|train/num_gaussians|val/psnr", "Scalars")
            save(scalars, "tensorboard_scalars.png")
            save(tensorboard_page(browser, url, "val/", "Image"), "tensorboard_images.png")
        finally:
            browser.close()
    finally:
        server.terminate()
        server.wait()


def lod_site(exp_dir: Path, work: Path) -> None:
    """Level 0 (left) and level 2 (right) of the run's streamed site as the PlayCanvas engine draws them."""
    node_modules = ROOT / ".web_readers" / "node_modules"
    if not (node_modules / "playcanvas").is_dir():
        print(f"skipped lod_synthetic_playcanvas.png: no PlayCanvas engine in {node_modules} (scripts/web_readers.sh)")
        return
    gsrecon("lod", "--exp-dir", str(exp_dir), "--levels", "2")
    site = work / "site"
    gsrecon("export", "--exp-dir", str(exp_dir), "--format", "lod", "--out", str(site / "lod-meta.json"), "--overwrite")
    scene = load_trained_scene(exp_dir=str(exp_dir))
    pipeline = build_datapipeline(scene.cfg.data, torch.device("cpu"), scene.cfg.seed, scene.source)
    frame = pipeline.scene.test[0]
    K = frame.K.numpy().copy()
    K[:2] *= ZOOM
    background = tuple(pipeline.fixed_background().tolist())
    shots = [
        draw_site(shutil.which("chromium"), node_modules, site, frame.viewmat.numpy(), K, frame.width * ZOOM,
                  frame.height * ZOOM, background, level, profile(work))
        for level in (0, 2)
    ]  # fmt: skip
    gap = np.full((shots[0].shape[0], 4, 3), 255, np.uint8)
    save(Image.fromarray(np.concatenate([shots[0], gap, shots[1]], axis=1)), "lod_synthetic_playcanvas.png")


def psnr_vs_time(work: Path, steps: int, threads: int) -> None:
    marks = ",".join(str(s) for s in (250, 500, 1000, 2000, 3000) if s < steps) + f",{steps}"
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_quality.py"), "--config", "configs/synthetic.yaml",
         "--out", str(work / "bench_quality"), "--steps", marks, "--threads", str(threads), "--clock", "cpu",
         "--seconds", "10,20,40,60,90,120,180,240"],
        cwd=ROOT, check=True,
    )  # fmt: skip
    save(Image.open(work / "bench_quality" / "psnr_vs_time.png").convert("RGB"), "bench_psnr_vs_time.png")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, required=True, help="a folder for the run and the servers' profiles")
    parser.add_argument("--steps", type=int, default=3000, help="training steps (the quickstart's config: 3000)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the training runs")
    args = parser.parse_args()
    if shutil.which("chromium") is None:
        raise SystemExit("needs chromium on PATH (apt-get install chromium)")
    args.work.mkdir(parents=True, exist_ok=True)
    exp_dir = args.work.resolve() / "synthetic"
    run = [f"exp_dir={exp_dir}", f"max_steps={args.steps}", f"num_threads={args.threads}"]
    gsrecon("train", "--config", "configs/synthetic.yaml", *run, "--overwrite")
    gsrecon("eval", "--exp-dir", str(exp_dir))
    quickstart_scene(exp_dir)
    viewer(exp_dir, args.work)
    tensorboard(exp_dir, args.work)
    lod_site(exp_dir, args.work)
    psnr_vs_time(args.work, args.steps, args.threads)


if __name__ == "__main__":
    main()
