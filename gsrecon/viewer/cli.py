"""``gsrecon view``: a trained scene in the browser, until Ctrl-C (its options here; gsrecon/cli.py dispatches)."""

from __future__ import annotations

import argparse

from gsrecon.viewer import DISPLAYS, INSTALL_HINT

SUMMARY = "open a trained scene in the browser viewer"
DESCRIPTION = (
    "Serve a trained scene to a web browser (viser): Gaussians drawn by the browser or rendered exactly by "
    "gsrecon on this machine, training cameras as frustums. Prints the URL; runs until Ctrl-C. Needs the "
    f"viewer extra: {INSTALL_HINT}"
)


def add_view_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: all interfaces)")
    p.add_argument("--port", type=int, default=8080, help="port to listen on (the next free one if busy; 0: any)")
    p.add_argument(
        "--display",
        default=next(iter(DISPLAYS)),
        choices=list(DISPLAYS),
        help="what the page shows first: splats drawn by the browser, or gsrecon's exact render from this machine",
    )
    p.add_argument("--resolution", type=int, default=512, help="longer side in pixels of gsrecon's renders")


def view(args: argparse.Namespace) -> int:
    """Load the scene named by ``args``, serve it and print its URL; return 0 after Ctrl-C."""
    from gsrecon.viewer import require_viser

    require_viser()
    from gsrecon.engine.inference import load_trained_scene, scene_run, training_cameras
    from gsrecon.logging.console import Logger
    from gsrecon.model.views.environment import trained_sky
    from gsrecon.viewer.server import SceneViewer

    scene = load_trained_scene(
        checkpoint=args.checkpoint,
        exp_dir=args.exp_dir,
        ply=args.ply,
        config=args.config,
        overrides=args.overrides,
        imports=args.imports,
    )
    logger = Logger()
    run = scene_run(scene, args.device, logger, median_depth=True)
    pipeline, device = run.datapipeline, run.device
    viewer = SceneViewer(
        run.renderer,
        pipeline.scene,
        pipeline.fixed_background(),
        host=args.host,
        port=args.port,
        display=args.display,
        resolution=args.resolution,
        median_depth=True,
    )
    try:
        viewer.set_camera_poses(training_cameras(run))
        params = {k: v.to(device) for k, v in scene.params.items()}
        sky = trained_sky(run.views, pipeline.fixed_background())
        viewer.set_scene(params, scene.sh_degree, scene.step, sky=sky)
        print(f"viewer of {scene.source}: {viewer.url} (Ctrl-C to stop)", flush=True)
        viewer.serve_forever()
    except KeyboardInterrupt:
        pass  # how a user ends `gsrecon view`
    finally:
        viewer.close()
    return 0
