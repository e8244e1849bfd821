"""Building and loading gsrecon's C++ kernels (the ``cpu`` renderer's and the compiled loss terms'): compiled with
``torch.utils.cpp_extension`` (OpenMP, -O3, the CPU's vector instructions) on first use into gsrecon's cache folder,
under a name that hashes the sources, the toolchain and the flags, then loaded from there. A cached library that is
not the one its build recorded (truncated, overwritten, a build killed half-way) is built again."""

from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib.util
import logging
import os
import re
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import torch

from gsrecon.atomic import atomic_path
from gsrecon.cache import cache_dir
from gsrecon.errors import InputError, last_line

SOURCES = ("bindings.cpp", "project.cpp", "rasterize.cpp", "image_loss.cpp", "train_step.cpp")
_CURRENT = "current"  # the file naming the published build's folder
_BUILD_PREFIX = "build-"
_BUILD_NAME = re.compile(re.escape(_BUILD_PREFIX) + "[A-Za-z0-9_]+")  # the names tempfile.mkdtemp gives builds
_LOCK = "build.lock"  # not torch's "lock", which a build of an older gsrecon in the same folder would wait on
_loaded: dict[str, ModuleType] = {}


class KernelsUnavailableError(InputError):
    """The CPU kernels cannot be built or loaded here (no C++ compiler, no ninja, a failing build)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"renderer 'cpu': its C++ kernels cannot be built here ({reason}); use renderer.name=torch")
        self.reason = reason


def _source_dir() -> Path:
    """The folder of the C++ sources (this package)."""
    return Path(__file__).resolve().parent


def compile_flags() -> list[str]:
    """The compiler's flags: -O3, OpenMP, no errno from the maths functions, and the vector instructions torch
    found on this CPU (AVX-512, or AVX2 with FMA); without AVX-512 also no floating-point traps (no result changes;
    without it GCC 12 leaves the compositing loops scalar there, while with AVX-512 it makes them slower)."""
    capability = torch.backends.cpu.get_cpu_capability()
    if capability == "AVX512":
        vector = ["-mavx2", "-mfma", "-mavx512f", "-mavx512vl", "-mavx512bw", "-mavx512dq"]
    else:
        vector = ["-fno-trapping-math", *(["-mavx2", "-mfma"] if capability == "AVX2" else [])]
    return ["-O3", "-fopenmp", "-fno-math-errno", *vector]


def kernel_name() -> str:
    """The extension's name: ``gsrecon_cpu_`` and a digest of the sources and headers (their bytes, not their
    times), torch's and Python's versions, the compiler (``$CXX``) and its flags (a library built for one CPU's
    vector instructions is never loaded on a CPU without them)."""
    digest = hashlib.sha256()
    for path in [*(_source_dir() / name for name in SOURCES), *sorted(_source_dir().glob("*.h"))]:
        digest.update(path.read_bytes())
    toolchain = f"{torch.__version__} {sys.version_info[:2]} {os.environ.get('CXX', 'c++')} {compile_flags()}"
    digest.update(toolchain.encode())
    return f"gsrecon_cpu_{digest.hexdigest()[:16]}"


def build_dir() -> Path:
    """Where the kernels are built and cached."""
    return cache_dir("cpu_kernels", kernel_name())


def _cpp_extension() -> ModuleType:
    """``torch.utils.cpp_extension``, imported without its warning that there is no CUDA (none is needed here)."""
    logger = logging.getLogger("torch.utils.cpp_extension")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        import torch.utils.cpp_extension as cpp_extension
    finally:
        logger.setLevel(level)
    return cpp_extension


def missing_toolchain() -> str | None:
    """Why the kernels cannot be built here (no compiler, no ninja), or None."""
    is_ninja_available = _cpp_extension().is_ninja_available

    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return f"no C++ compiler '{compiler}' on the PATH (install g++ or clang, or set CXX)"
    if not is_ninja_available():
        return "ninja is not installed (pip install ninja)"
    return None


def load_kernels(log: Callable[[str], None] | None = None) -> ModuleType:
    """The compiled kernels: the cache's published build as it is (a read-only cache, one copied without its files'
    times), else built first and published (saying so through ``log``).

    Raises KernelsUnavailableError with the reason when they cannot be built or loaded.
    """
    name = kernel_name()
    if name in _loaded:
        return _loaded[name]
    folder = build_dir()
    library = published_library(folder, name)
    if library is None:
        library = _build_and_publish(folder, name, log)
    try:
        _loaded[name] = _import_library(name, library)
    except Exception as exc:  # a loader's failure, of any type
        raise KernelsUnavailableError(f"{library} cannot be loaded: {last_line(exc)}") from None
    return _loaded[name]


def published_library(folder: Path, name: str) -> Path | None:
    """The library of the build that ``folder``'s ``current`` names, or None where there is none or it is not the one
    its build recorded (truncated, overwritten). Reads only: nothing in ``folder`` changes."""
    build = _published_build(folder)
    if build is None:
        return None
    try:
        library = next(path for path in sorted(build.iterdir()) if path.name.startswith(name) and _is_library(path))
        recorded = library.with_suffix(".sha256").read_text()
    except (OSError, UnicodeDecodeError, StopIteration):
        return None
    return library if recorded == _digest(library) else None


def _published_build(folder: Path) -> Path | None:
    """The build folder ``folder``'s ``current`` names; None where it names none: ``current`` missing, unreadable or
    not a build folder's name (a path outside ``folder``, absolute or with ``..``, is not followed)."""
    try:
        name = (folder / _CURRENT).read_bytes().decode("utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    build = folder / name
    if not _BUILD_NAME.fullmatch(name) or build.is_symlink() or not build.is_dir():
        return None
    return build


@contextmanager
def build_lock(folder: Path) -> Iterator[None]:
    """Hold ``folder``'s build lock (one build at a time across processes; the system frees it when its holder dies,
    so a killed build leaves no stale lock). The lock file is opened for reading (created if missing): another user
    may build in a shared cache whose lock this user created."""
    handle = os.open(folder / _LOCK, os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
    finally:
        os.close(handle)


def publish_build(folder: Path, name: str, compile_into: Callable[[Path], Path]) -> Path:
    """Build into a new folder inside ``folder`` with ``compile_into`` (which returns the library it wrote there),
    write the library's checksum beside it, then name that folder in ``current`` atomically; returns the library.
    The caller holds :func:`build_lock`. Earlier builds stay as they are (a run may still be loading one); folders of
    builds killed half-way (never published, no checksum) go.

    What is published is readable by every user (the build folder, whatever the compiler wrote in it, its checksum,
    ``current`` and the lock): a cache built by one user (a lab's home, an image built as root) serves the others,
    read-only or not. The permissions of ``folder`` itself are its owner's choice."""
    for stale in folder.glob(f"{_BUILD_PREFIX}*"):
        if not any(stale.glob("*.sha256")):
            shutil.rmtree(stale, ignore_errors=True)
    build = Path(tempfile.mkdtemp(prefix=_BUILD_PREFIX, dir=folder))
    library = compile_into(build)
    with atomic_path(library.with_suffix(".sha256")) as tmp:
        tmp.write_text(_digest(library))
    _share(build, folder / _LOCK)
    with atomic_path(folder / _CURRENT) as tmp:
        tmp.write_text(build.name)
        _share(tmp)
    return library


def _share(*paths: Path) -> None:
    """Make ``paths`` (folders with all they hold; symlinks and missing paths are left) readable by every user,
    folders and programs also searchable or runnable by all: the owner's other permissions stay."""
    for top in paths:
        for path in [top, *(top.rglob("*") if top.is_dir() and not top.is_symlink() else ())]:
            if path.is_symlink() or not path.exists():
                continue
            mode = path.stat().st_mode
            searchable = path.is_dir() or mode & stat.S_IXUSR
            os.chmod(path, mode | 0o444 | (0o111 if searchable else 0))


def _build_and_publish(folder: Path, name: str, log: Callable[[str], None] | None) -> Path:
    """Build the kernels into ``folder`` and publish them, unless another process published them while this one
    waited for the build lock; returns the library."""
    reason = missing_toolchain()
    if reason is not None:
        raise KernelsUnavailableError(reason)
    damaged = (folder / _CURRENT).is_file()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise KernelsUnavailableError(f"the cache folder {folder} cannot be created: {exc.strerror}") from None
    try:
        with build_lock(folder):
            library = published_library(folder, name)
            if library is not None:
                return library
            if log is not None:
                log(
                    f"cpu renderer: the cached kernels in {folder} are damaged; building them again"
                    if damaged
                    else f"cpu renderer: compiling its C++ kernels on first use (half a minute on one core; cached "
                    f"in {folder})"
                )
            return publish_build(folder, name, functools.partial(_compile, name))
    except KernelsUnavailableError:
        raise
    except OSError as exc:
        raise KernelsUnavailableError(f"the cache folder {folder} cannot be written: {exc.strerror}") from None
    except Exception as exc:  # a compiler's failure, of any type
        raise KernelsUnavailableError(f"the build failed: {last_line(exc)}") from None


def _compile(name: str, build: Path) -> Path:
    """Compile the kernels into the empty folder ``build``; returns the library."""
    library = _cpp_extension().load(
        name,
        [str(_source_dir() / source) for source in SOURCES],
        extra_cflags=compile_flags(),
        extra_ldflags=["-fopenmp"],
        build_directory=str(build),
        verbose=False,
        is_python_module=False,  # loaded (once) by _import_library
    )
    return Path(library)


def _import_library(name: str, library: Path) -> ModuleType:
    """The extension module ``name`` in ``library``, loaded as it is (no build tool, nothing written)."""
    spec = importlib.util.spec_from_file_location(name, library)
    if spec is None or spec.loader is None:
        raise ImportError(f"{library} is not a Python extension")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _is_library(path: Path) -> bool:
    return path.suffix in (".so", ".pyd")


def _digest(path: Path) -> str:
    """The SHA-256 of a file's bytes, in hex."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def kernels_unavailable(log: Callable[[str], None] | None = None) -> str | None:
    """Why the kernels cannot be built or loaded here, or None once they are loaded (built first if need be,
    saying so through ``log``)."""
    try:
        load_kernels(log)
    except KernelsUnavailableError as exc:
        return exc.reason
    return None
