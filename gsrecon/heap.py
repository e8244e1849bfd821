"""The C heap of a gsrecon process: make glibc give large freed blocks back to the system.

glibc serves a request of at least ``M_MMAP_THRESHOLD`` bytes with its own ``mmap`` and unmaps it
when freed, but raises that threshold to the size of each such block freed (up to 32 MiB). From
then on the multi-megabyte temporaries of a large scene come from the heap, whose freed space
fragments and stays resident: a 3-million-Gaussian SOG export peaked at 3.3-5.0 GB RSS instead of
2.1 GB (BENCHMARKS.md, "Millions of Gaussians"). A fixed threshold turns that adjustment off.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

M_MMAP_THRESHOLD = -3  # mallopt's parameter number, from glibc's malloc.h
MMAP_THRESHOLD_BYTES = 1 << 20


def unmap_large_blocks() -> bool:
    """Have glibc serve every allocation of 1 MiB or more by its own mapping, unmapped when freed.

    Returns whether the setting was applied: not where the C library is not glibc, nor where the user
    chose a threshold with ``MALLOC_MMAP_THRESHOLD_`` (glibc then follows that).
    """
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    libc = ctypes.CDLL(name)
    if not hasattr(libc, "mallopt") or not hasattr(libc, "gnu_get_libc_version"):
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))


def describe_heap_setting(applied: bool) -> str:
    """One line saying what :func:`unmap_large_blocks` did (it returned ``applied``), or why it left the heap alone."""
    if applied:
        return (
            f"heap: allocations of 1 MiB or more are mapped on their own and returned to the system when freed "
            f"(glibc M_MMAP_THRESHOLD={MMAP_THRESHOLD_BYTES})"
        )
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return f"heap: left as MALLOC_MMAP_THRESHOLD_ sets it ({os.environ['MALLOC_MMAP_THRESHOLD_']})"
    return "heap: left as it is (the C library is not glibc)"
