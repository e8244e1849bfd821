"""The cpu renderer's kernel cache shared by many runs at once: builds publish a new folder atomically under a lock,
readers only read. These tests drive the cache's own functions with a small stand-in library (a few bytes a "compiler"
writes), so no C++ build is needed; tests/test_cpu_renderer.py loads a real one."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

from gsrecon.render.cpu.kernels import build_lock, publish_build, published_library

NAME = "gsrecon_cpu_test"


def fake_compiler(label: str):
    """A stand-in for the C++ build: writes a library of ``label``'s bytes into the build folder, failing if another
    build is running at the same time (the lock must exclude it)."""

    def compile_into(build: Path) -> Path:
        running = build.parent / "a_build_is_running"
        fd = os.open(running, os.O_CREAT | os.O_EXCL | os.O_WRONLY)  # FileExistsError: two builds at once
        library = build / f"{NAME}.so"
        library.write_bytes(label.encode() * 4096)
        os.close(fd)
        running.unlink()
        return library

    return compile_into


def build_again_and_again(folder: Path, label: str, times: int) -> None:
    for i in range(times):
        with build_lock(folder):
            publish_build(folder, NAME, fake_compiler(f"{label}{i}"))


def build_and_die(folder: Path) -> None:
    """A build killed half-way, holding the lock, its library half-written."""

    def dies(build: Path) -> Path:
        (build / f"{NAME}.so").write_bytes(b"half")
        os._exit(9)

    with build_lock(folder):
        publish_build(folder, NAME, dies)


def test_readers_always_find_an_intact_library_while_two_processes_rebuild_it(tmp_path):
    """Issue 51: every run rewrote the checksum in place while others checked it (most checks then saw "damaged"
    and deleted the folder others loaded from). Now two builders publish 40 builds each, one at a time, while this
    process reads: every read finds an intact library whose folder exists, and no build is deleted."""
    with build_lock(tmp_path):
        publish_build(tmp_path, NAME, fake_compiler("first"))
    context = multiprocessing.get_context("fork")
    builders = [context.Process(target=build_again_and_again, args=(tmp_path, label, 40)) for label in "ab"]
    for builder in builders:
        builder.start()
    reads = 0
    while any(builder.is_alive() for builder in builders) or reads == 0:
        library = published_library(tmp_path, NAME)
        assert library is not None and library.is_file(), f"read {reads} found no intact library"
        reads += 1
    for builder in builders:
        builder.join()
        assert builder.exitcode == 0  # a build running beside another fails (see fake_compiler)
    assert len(list(tmp_path.glob("build-*/*.sha256"))) == 81
    assert published_library(tmp_path, NAME).read_bytes()[:3] in (b"a39", b"b39")  # the last build published


def test_a_damaged_library_is_built_again_into_a_new_folder_and_the_old_one_stays(tmp_path):
    with build_lock(tmp_path):
        first = publish_build(tmp_path, NAME, fake_compiler("first"))
    assert published_library(tmp_path, NAME) == first
    first.write_bytes(first.read_bytes()[:100])  # truncated
    assert published_library(tmp_path, NAME) is None
    with build_lock(tmp_path):
        second = publish_build(tmp_path, NAME, fake_compiler("second"))
    assert published_library(tmp_path, NAME) == second and second.parent != first.parent
    assert first.is_file()  # a run may still be loading it


def test_a_build_killed_half_way_leaves_no_lock_and_its_folder_goes(tmp_path):
    with build_lock(tmp_path):
        first = publish_build(tmp_path, NAME, fake_compiler("first"))
    killed = multiprocessing.get_context("fork").Process(target=build_and_die, args=(tmp_path,))
    killed.start()
    killed.join()
    assert killed.exitcode == 9
    (half,) = (build for build in tmp_path.glob("build-*") if build != first.parent)
    assert published_library(tmp_path, NAME) == first  # readers still find the last published build
    with build_lock(tmp_path):  # not held by the dead build
        second = publish_build(tmp_path, NAME, fake_compiler("second"))
    assert not half.exists() and first.is_file() and published_library(tmp_path, NAME) == second
