"""Image files: oversized (decompression-bomb) images are refused from their header, before any pixel is decoded."""

from __future__ import annotations

import struct
import warnings
import zlib
from pathlib import Path

import pytest
from PIL import Image, ImageFile

from gsrecon.data.errors import DatasetError
from gsrecon.data.formats import images
from gsrecon.data.formats.images import read_image, read_image_size


def png_header_only(path: Path, width: int, height: int) -> Path:
    """A PNG file that declares ``width`` x ``height`` RGB pixels but holds a few bytes of pixel data."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    idat = zlib.compress(b"\0" * 64)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b""))
    return path


@pytest.fixture
def no_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    """Decoding pixels fails the test: a refusal must come from the header alone."""

    def load(self: ImageFile.ImageFile) -> None:
        raise AssertionError(f"decoded {self.size} pixels")

    monkeypatch.setattr(ImageFile.ImageFile, "load", load)


@pytest.mark.parametrize("read", [read_image, read_image_size])
def test_decompression_bomb_is_one_error_naming_the_file(tmp_path: Path, no_decoding: None, read) -> None:
    bomb = png_header_only(tmp_path / "bomb.png", 100_000, 100_000)
    with pytest.raises(
        DatasetError,
        match=r"bomb\.png: the image has more pixels than PIL opens safely \(a possible decompression bomb\); "
        r"gsrecon reads images of at most 134,217,728 pixels \(e\.g\. 16384x8192\); downscale it first$",
    ):
        read(bomb)


@pytest.mark.parametrize("pil_limit", ["default", None])
def test_images_over_gsrecons_bound_are_refused_before_decoding(
    tmp_path: Path, no_decoding: None, monkeypatch: pytest.MonkeyPatch, pil_limit
) -> None:
    """12000x12000 is over gsrecon's bound but under PIL's error threshold; 100000x100000 is refused by gsrecon's
    bound also where PIL's own check is switched off."""
    if pil_limit is None:
        monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    sizes = [(12_000, 12_000)] + ([(100_000, 100_000)] if pil_limit is None else [])
    for width, height in sizes:
        path = png_header_only(tmp_path / f"{width}.png", width, height)
        with pytest.raises(
            DatasetError,
            match=rf"{width}\.png: the image has {width}x{height} pixels; gsrecon reads images of at most "
            r"134,217,728 pixels \(e\.g\. 16384x8192\); downscale it first$",
        ):
            read_image(path)


def test_images_under_the_bound_but_over_pils_warning_threshold_open_quietly(tmp_path: Path) -> None:
    width, height = 10_000, 9_500  # 95 megapixels: PIL warns of a possible bomb above 89.5
    assert Image.MAX_IMAGE_PIXELS < width * height <= images.MAX_IMAGE_PIXELS
    path = png_header_only(tmp_path / "large.png", width, height)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_image_size(path) == (width, height)
