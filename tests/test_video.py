"""Video writing and depth colouring."""

from __future__ import annotations

import imageio.v2 as imageio
import numpy as np
import pytest
import torch

from gsrecon.render.colormap import depth_to_rgb
from gsrecon.render.video import write_video


def _read_frames(path) -> list[np.ndarray]:
    reader = imageio.get_reader(path, format="FFMPEG")
    try:
        return list(reader.iter_data())
    finally:
        reader.close()


def test_write_video_round_trip(tmp_path):
    ramp = np.linspace(0, 255, 63, dtype=np.float64)[None, :, None]  # odd width and height on purpose
    frames = [np.broadcast_to(np.clip(ramp + 20 * i, 0, 255), (47, 63, 3)).astype(np.uint8) for i in range(7)]
    path = tmp_path / "out" / "path.mp4"
    assert write_video(path, iter(frames), fps=10) == 7
    decoded = _read_frames(path)
    assert len(decoded) == 7
    assert decoded[0].shape == (48, 64, 3)  # padded to even sizes for yuv420p
    for original, frame in zip(frames, decoded):
        assert np.abs(frame[:47, :63].astype(int) - original).mean() < 3  # lossy, but the same picture
    assert sorted(p.name for p in path.parent.iterdir()) == ["path.mp4"]  # no temporary file left behind


def test_write_video_rejects_bad_frames(tmp_path):
    path = tmp_path / "bad.mp4"
    good = np.zeros((16, 16, 3), np.uint8)
    with pytest.raises(ValueError, match="frame 1: size"):
        write_video(path, [good, np.zeros((8, 8, 3), np.uint8)], fps=5)
    with pytest.raises(ValueError, match="frame 0: expected uint8"):
        write_video(path, [good.astype(np.float32)], fps=5)
    with pytest.raises(ValueError, match="no frames"):
        write_video(path, [], fps=5)
    assert list(tmp_path.iterdir()) == []


def test_depth_to_rgb():
    depth = torch.linspace(1.0, 5.0, 48 * 64).reshape(48, 64)
    alpha = torch.ones(48, 64)
    alpha[:8] = 0.0
    rgb = depth_to_rgb(depth, alpha)
    assert rgb.shape == (48, 64, 3) and rgb.dtype == np.uint8
    assert (rgb[:8] == 0).all()  # transparent pixels are black
    near, far = rgb[8, 0].astype(int), rgb[-1, -1].astype(int)
    assert near[2] > near[0] and far[0] > far[2]  # near is blue, far is red
    assert np.array_equal(depth_to_rgb(depth[..., None].numpy(), alpha[..., None]), rgb)  # [H, W, 1] inputs too
    assert (depth_to_rgb(depth, torch.zeros(48, 64)) == 0).all()
