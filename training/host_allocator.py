"""Keep freed host memory in the process between training steps, so a CPU step stops paying page faults.

A training step allocates and frees the same activations and gradients every step. glibc's malloc (Linux) serves
blocks above a moving threshold with fresh mmaps and hands freed memory at the top of its heap back to the kernel,
so each step faults the same pages in again, zero-filled by the kernel: about 700 faults per step in a bare loop at
the recipe's shape and twice that under Lightning, whose extra small objects change the order of the frees
(`python -m benchmarks.train_throughput` prints faults per step). That was most of Lightning's measured overhead.
Fixing the mmap threshold at glibc's maximum and raising the trim threshold makes the heap keep what it has, as
PyTorch's caching allocator does on a GPU; the cost is that resident memory stays at its peak.
"""

from __future__ import annotations

import ctypes
import os
import platform

_M_TRIM_THRESHOLD = -1  # mallopt parameter numbers from glibc's malloc.h
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 2**20  # glibc's ceiling on 64-bit; larger blocks are still mmapped and returned at once
TRIM_THRESHOLD = 256 * 2**20  # free memory kept at the top of the heap before any is given back
_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")


def retain_freed_memory() -> bool:
    """Apply the thresholds above; True if applied. A no-op off glibc or when the user tuned malloc already."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    if any(name in os.environ for name in _USER_SETTINGS):
        return False
    libc = ctypes.CDLL("libc.so.6")
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
