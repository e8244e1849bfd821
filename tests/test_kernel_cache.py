"""The cpu renderer's kernel cache shared by many runs at once: builds publish a new folder atomically under a lock,
readers only read. These tests drive the cache's own functions with a small stand-in library (a few bytes a "compiler"
writes), so no C++ build is needed; tests/test_cpu_renderer.py loads a real one."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gsrecon.kernels.build import build_lock, publish_build, published_library

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


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def test_a_published_build_is_readable_by_every_user_whatever_the_umask(tmp_path):
    """Issue 60: build folders were 0700 (tempfile's), so another user could not use a cache this user built."""
    with umask(0o077), build_lock(tmp_path):
        library = publish_build(tmp_path, NAME, fake_compiler("first"))
    for path, wanted in [
        (library.parent, 0o755),
        (library, 0o644),
        (library.with_suffix(".sha256"), 0o644),
        (tmp_path / "current", 0o644),
        (tmp_path / "build.lock", 0o644),
    ]:
        assert stat.S_IMODE(path.stat().st_mode) & 0o777 == wanted, path.name  # readable, and no more


OTHER_USER = 65534  # nobody


def _as_other_user(folder: Path, expected: str, lock: bool) -> None:
    """In a forked child: become another user, then exit 0 where ``folder``'s published library is ``expected``
    (its path, or "" for none), taken under the build lock where ``lock``."""
    os.setgid(OTHER_USER)
    os.setuid(OTHER_USER)
    with build_lock(folder) if lock else contextlib.nullcontext():
        library = published_library(folder, NAME)
    os._exit(0 if str(library or "") == expected else 1)


@pytest.fixture
def shared_folder() -> Iterator[Path]:
    """A cache folder in /tmp another user can reach (pytest's tmp_path lies in a folder only its user can)."""
    if os.geteuid() != 0:
        pytest.skip("becoming another user needs root")
    folder = Path(tempfile.mkdtemp(prefix="gsrecon-shared-cache-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder)


@pytest.mark.parametrize("writable", [False, True])
def test_another_user_uses_the_published_build_of_a_cache_read_only_or_writable(shared_folder: Path, writable: bool):
    with umask(0o077), build_lock(shared_folder):
        library = publish_build(shared_folder, NAME, fake_compiler("first"))
    shared_folder.chmod(0o777 if writable else 0o755)
    other = multiprocessing.get_context("fork").Process(
        target=_as_other_user, args=(shared_folder, str(library), writable)
    )
    other.start()
    other.join()
    assert other.exitcode == 0  # it found the build (the lock, a writable cache's, too) instead of judging it damaged


def test_a_current_another_user_cannot_read_is_no_published_build(shared_folder: Path):
    with build_lock(shared_folder):
        publish_build(shared_folder, NAME, fake_compiler("first"))
    (shared_folder / "current").chmod(0o600)
    other = multiprocessing.get_context("fork").Process(target=_as_other_user, args=(shared_folder, "", False))
    other.start()
    other.join()
    assert other.exitcode == 0


def _outside_build(tmp_path: Path) -> Path:
    """A complete build folder (a library and its checksum) outside the cache folder ``tmp_path / "cache"``."""
    outside = tmp_path / "outside"
    outside.mkdir()
    with build_lock(outside):
        return publish_build(outside, NAME, fake_compiler("outside")).parent


def _symlinked_build(tmp_path: Path) -> bytes:
    """The name of a build folder in the cache that is a symlink to one outside it."""
    (tmp_path / "cache" / "build-link").symlink_to(_outside_build(tmp_path))
    return b"build-link"


@pytest.mark.parametrize(
    "current",
    [
        lambda tmp_path: b"\xff\xfebuild-abc",  # not UTF-8
        lambda tmp_path: b"build-abc\x00def",  # a NUL byte
        lambda tmp_path: str(_outside_build(tmp_path)).encode(),  # absolute
        lambda tmp_path: f"../outside/{_outside_build(tmp_path).name}".encode(),
        lambda tmp_path: _symlinked_build(tmp_path),
    ],
    ids=["not-utf8", "nul", "absolute", "dotdot", "symlink"],
)
def test_a_damaged_current_or_one_naming_a_folder_outside_the_cache_is_no_published_build(tmp_path, current):
    """Issue 60: a `current` of invalid UTF-8 or with a NUL byte made every cpu run exit 1; one naming a folder
    outside the cache was followed. Neither is a published build: a build goes beside it and replaces it."""
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "current").write_bytes(current(tmp_path))
    assert published_library(cache, NAME) is None
    with build_lock(cache):
        library = publish_build(cache, NAME, fake_compiler("fresh"))
    assert published_library(cache, NAME) == library and library.parent.parent == cache


def test_a_current_that_is_a_folder_is_no_published_build(tmp_path):
    (tmp_path / "current").mkdir()
    assert published_library(tmp_path, NAME) is None
