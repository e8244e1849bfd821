"""Frames whose pixels stay on disk (``data.cache: disk``): decoded ahead of use by a small thread pool, and the
choice of cache (``data.cache: auto``) from the decoded size the image headers announce.

Training order is a pure function of the seed and step (:meth:`DataPipeline.train_indices`), so the frames that
come next are known: :class:`Prefetcher` decodes exactly those, a bounded number of batches ahead. Decoding goes
through :meth:`Frame.decoded` (``ImageFile.load``), which reads resized / undistorted images from the on-disk
image cache once made (:func:`gsrecon.data.formats.images.load_transformed`) instead of redoing the work.
"""

from __future__ import annotations

import os
import resource
import threading
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch

from gsrecon.data.scene import Frame, PixelFile
from gsrecon.errors import last_line

CACHE_MODES = ("device", "cpu", "disk", "auto")
MAX_DECODE_THREADS = 4
MEMORY_SHARE = 0.5  # ``auto`` keeps decoded images in memory only where they take at most this share of what is free
BYTES_PER_PIXEL = 4  # ``auto``'s estimate: RGBA, the most a decoded frame holds per pixel
_GIB = 2**30
# controllers in /proc/self/cgroup -> (their mount, the limit's file, the usage's file): cgroup v2, v1's memory
_CGROUP_FILES = {
    "": (Path("/sys/fs/cgroup"), "memory.max", "memory.current"),
    "memory": (Path("/sys/fs/cgroup/memory"), "memory.limit_in_bytes", "memory.usage_in_bytes"),
}


def decode_threads(prefetch: int, batch_size: int) -> int:
    """Threads that decode ``prefetch`` batches of ``batch_size`` frames ahead: one per frame, at most
    :data:`MAX_DECODE_THREADS`."""
    return min(MAX_DECODE_THREADS, prefetch * batch_size)


class FrameDecoder:
    """Decodes frames (:meth:`Frame.decoded`) on a thread pool and counts the decoded frames alive.

    ``alive`` is the number of frames this decoder decoded that still exist (held by a pending result, a caller,
    or a batch being built); ``peak_alive`` its high-water mark; ``decoded`` how many it decoded in all.
    """

    def __init__(self, workers: int) -> None:
        if workers < 1:
            raise ValueError(f"FrameDecoder needs at least 1 worker, got {workers}")
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="gsrecon-decode")
        self._lock = threading.Lock()
        self.alive = 0
        self.peak_alive = 0
        self.decoded = 0

    def submit(self, frame: Frame) -> Future[list[Frame]]:
        """``[frame decoded]``, soon. Pop the frame from the list: the pool's finished task holds the list a while."""
        return self._pool.submit(self._decode, frame)

    def _decode(self, frame: Frame) -> list[Frame]:
        result = frame.decoded()
        with self._lock:
            self.alive += 1
            self.decoded += 1
            self.peak_alive = max(self.peak_alive, self.alive)
        weakref.finalize(result, self._release)
        return [result]

    def _release(self) -> None:
        with self._lock:
            self.alive -= 1


class Prefetcher:
    """Groups of frames asked for by key in increasing order (a training step, a validation view), each decoded
    while the ``ahead - 1`` groups before it are used: at most ``ahead`` groups are decoded or being decoded.

    A group skipped by a jump (a resume, a restarted validation) is dropped; one still being decoded then lives
    until its thread is done with it.
    """

    def __init__(
        self, decoder: FrameDecoder, frames: Sequence[Frame], indices: Callable[[int], list[int]], ahead: int
    ) -> None:
        if ahead < 1:
            raise ValueError(f"Prefetcher needs ahead >= 1, got {ahead}")
        self._decoder = decoder
        self._frames = frames
        self._indices = indices  # key -> indices into ``frames``
        self._ahead = ahead
        self._pending: dict[int, list[Future[list[Frame]]]] = {}

    def get(self, key: int) -> list[Frame]:
        """The decoded frames of group ``key``; schedules the groups up to ``key + ahead - 1``."""
        window = range(key, key + self._ahead)
        for stale in [k for k in self._pending if k not in window]:
            for future in self._pending.pop(stale):
                if not future.cancel() and future.done() and future.exception() is None:
                    future.result().clear()
        for k in window:
            if k not in self._pending:
                self._pending[k] = [self._decoder.submit(self._frames[i]) for i in self._indices(k)]
        return [future.result().pop() for future in self._pending.pop(key)]


def decoded_bytes(frames: Sequence[Frame]) -> int:
    """Bytes the frames' images and depth maps take decoded: held tensors as they are, image files at
    :data:`BYTES_PER_PIXEL`, depth map files at 4 bytes per pixel (float32)."""
    total = 0
    for frame in frames:
        if isinstance(frame.pixels, PixelFile):
            total += frame.width * frame.height * BYTES_PER_PIXEL
        else:
            total += frame.pixels.numel() * frame.pixels.element_size()
        if isinstance(frame.depth, PixelFile):
            total += frame.width * frame.height * 4
        elif frame.depth is not None:
            total += frame.depth.numel() * frame.depth.element_size()
    return total


def available_host_bytes() -> int:
    """Memory this process may still take (see :func:`host_memory_room`)."""
    return host_memory_room()[0]


def out_of_memory_line(exc: BaseException) -> str:
    """One line for an allocation that failed past gsrecon's checks: what failed and the room this process had
    (:func:`host_memory_room`)."""
    free, bound = host_memory_room()
    what = str(exc) if str(exc).startswith("out of memory") else f"out of memory ({last_line(exc)})"
    return f"{what}; this process may take {free / 2**30:.1f} GiB more ({bound})"


def host_memory_room() -> tuple[int, str]:
    """(bytes this process may still take, what sets that bound): ``MemAvailable``, capped by its cgroups' limits
    (v2's ``memory.max``, v1's ``memory.limit_in_bytes``, less what they use) and by its own limits on address space
    and data (``ulimit -v``, ``RLIMIT_DATA``, less what it has mapped)."""
    rooms = [(_meminfo_available(), "available RAM")]
    rooms += [(room, "the cgroup's memory limit") for room in _cgroup_rooms()]
    status = _proc_status_bytes()
    for limit, used, what in (
        (resource.RLIMIT_AS, "VmSize", "the process's address-space limit (ulimit -v)"),
        (resource.RLIMIT_DATA, "VmData", "the process's data limit (ulimit -d)"),
    ):
        soft = resource.getrlimit(limit)[0]
        if soft != resource.RLIM_INFINITY and used in status:
            rooms.append((max(0, soft - status[used]), what))
    return min(rooms, key=lambda room: room[0])


def _cgroup_rooms() -> list[int]:
    """What this process's cgroup and those above it leave below their memory limits (cgroup v2, or v1's memory
    controller); a container sees its own cgroup as the root of the mount, so the path is walked up to it."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    rooms = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers not in _CGROUP_FILES:
            continue
        mount, limit_name, usage_name = _CGROUP_FILES[controllers]
        folder = mount / path.lstrip("/")
        for cgroup in [folder, *folder.parents]:
            if not cgroup.is_relative_to(mount):
                break
            limit, used = _read_int(cgroup / limit_name), _read_int(cgroup / usage_name)
            if limit is not None and used is not None:
                rooms.append(max(0, limit - used))
    return rooms


def _proc_status_bytes() -> dict[str, int]:
    """This process's ``/proc/self/status`` sizes (``VmSize``, ``VmData``, ...) in bytes; empty where unreadable."""
    sizes = {}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if value.strip().endswith(" kB"):
                sizes[key] = int(value.split()[0]) * 1024
    except (OSError, ValueError):
        return {}
    return sizes


def _meminfo_available() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _read_int(path: Path) -> int | None:
    """The integer a one-line file holds (a cgroup value), or None where it is absent or says ``max``."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def available_device_bytes(device: torch.device) -> int:
    """Free memory of a CUDA ``device``; that of the host for the CPU."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return available_host_bytes()


def choose_cache(needed: int, device: torch.device, device_free: int, host_free: int) -> tuple[str, str]:
    """``data.cache: auto``'s choice for decoded images of ``needed`` bytes: (mode, a sentence saying why).

    ``device`` where they take at most :data:`MEMORY_SHARE` of the training device's free memory, else ``cpu``
    where that holds for the host's (CUDA training only), else ``disk``.
    """
    share = f"{MEMORY_SHARE:.0%} of the"
    size = f"the decoded images need about {needed / _GIB:.2f} GiB"
    ram = f"{host_free / _GIB:.1f} GiB available RAM"
    gpu = f"{device_free / _GIB:.1f} GiB free GPU memory"
    on_device = gpu if device.type == "cuda" else ram
    if needed <= device_free * MEMORY_SHARE:
        return "device", f"{size}, within {share} {on_device}"
    if device.type == "cuda" and needed <= host_free * MEMORY_SHARE:
        return "cpu", f"{size}, more than {share} {gpu} but within {share} {ram}"
    return "disk", f"{size}, more than {share} {gpu + ' and the ' + ram if device.type == 'cuda' else ram}"
