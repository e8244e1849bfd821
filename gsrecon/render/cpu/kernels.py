"""Building and loading the CPU renderer's C++ kernels: compiled with ``torch.utils.cpp_extension`` (OpenMP, -O3,
the CPU's vector instructions) on first use into gsrecon's cache folder, under a name that hashes the sources, the
toolchain and the flags, then loaded from
there. A cached library that is not the one its build recorded (truncated, overwritten, a build killed half-way) is
built again."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch

from gsrecon.cache import cache_dir
from gsrecon.errors import InputError

SOURCES = ("bindings.cpp", "project.cpp", "rasterize.cpp")
HEADERS = ("kernels.h",)  # included by the sources: part of the digest, not compiled alone
_STALE_LOCK_S = 600.0  # a build lock older than this was left by a killed build
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
    """The extension's name: ``gsrecon_cpu_`` and a digest of the sources, torch's and Python's versions, the
    compiler (``$CXX``) and its flags (a library built for one CPU's vector instructions is never loaded on a CPU
    without them)."""
    digest = hashlib.sha256()
    for name in (*SOURCES, *HEADERS):
        digest.update((_source_dir() / name).read_bytes())
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
    """The compiled kernels, built first if they are not cached or the cached library is damaged (saying so
    through ``log``).

    Raises KernelsUnavailableError with the reason when they cannot be built or loaded.
    """
    name = kernel_name()
    if name in _loaded:
        return _loaded[name]
    folder = build_dir()
    libraries = sorted(folder.glob(f"{name}*.so")) + sorted(folder.glob(f"{name}*.pyd"))
    if libraries and not _intact(libraries[0]):
        if log is not None:
            log(f"cpu renderer: the cached kernels in {folder} are damaged; building them again")
        shutil.rmtree(folder, ignore_errors=True)
        libraries = []
    if not libraries:
        reason = missing_toolchain()
        if reason is not None:
            raise KernelsUnavailableError(reason)
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise KernelsUnavailableError(f"the cache folder {folder} cannot be created: {exc.strerror}") from None
        if log is not None:
            log(f"cpu renderer: compiling its C++ kernels on first use (half a minute on one core; cached in {folder})")
    try:
        module = _build(name, folder)
    except Exception as exc:  # a compiler's or loader's failure, of any type
        raise KernelsUnavailableError(f"the build failed: {_last_line(exc)}") from None
    library = Path(module.__file__)
    library.with_suffix(".sha256").write_text(_digest(library))
    _loaded[name] = module
    return module


def _digest(path: Path) -> str:
    """The SHA-256 of a file's bytes, in hex."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _intact(library: Path) -> bool:
    """Whether ``library`` is the one its build recorded (a truncated or overwritten library would crash on load)."""
    checksum = library.with_suffix(".sha256")
    return checksum.is_file() and checksum.read_text() == _digest(library)


def kernels_unavailable(log: Callable[[str], None] | None = None) -> str | None:
    """Why the kernels cannot be built or loaded here, or None once they are loaded (built first if need be,
    saying so through ``log``)."""
    try:
        load_kernels(log)
    except KernelsUnavailableError as exc:
        return exc.reason
    return None


def _build(name: str, folder: Path) -> ModuleType:
    load = _cpp_extension().load
    folder.mkdir(parents=True, exist_ok=True)
    lock = folder / "lock"
    if lock.exists() and time.time() - lock.stat().st_mtime > _STALE_LOCK_S:
        lock.unlink(missing_ok=True)
    return load(
        name,
        [str(_source_dir() / source) for source in SOURCES],
        extra_cflags=compile_flags(),
        extra_ldflags=["-fopenmp"],
        build_directory=str(folder),
        verbose=False,
    )


def _last_line(error: BaseException) -> str:
    """The last non-empty line of an error's message (a compiler's output ends with what failed)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__
