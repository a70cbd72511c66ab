"""How many CPU threads torch uses: an explicit count (`--threads N`, the `threads` config key), else
OMP_NUM_THREADS as torch would, else this process's CPUs minus the 1-minute load average (at least 1): torch's
one thread per core makes its threads wait for each other where other jobs share the cores. Standard library only.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from .errors import UserError

OMP_ENV = "OMP_NUM_THREADS"


def _machine(cpus: int | None, load: float | None) -> tuple[int, float | None]:
    """(CPUs this process may run on, the 1-minute load average or None where there is none), unless given."""
    if cpus is None:
        try:
            cpus = len(os.sched_getaffinity(0))  # a container or `taskset` may restrict it
        except (AttributeError, OSError):  # not Linux
            cpus = os.cpu_count() or 1
    if load is None:
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):  # Windows
            pass
    return cpus, load


def pick_thread_count(
    requested: int | None, cpus: int | None = None, load: float | None = None
) -> tuple[int, str]:
    """(the thread count of the policy above, which step chose it); `cpus` and `load` default to this machine's."""
    if requested is not None:
        if requested < 1:
            raise UserError(f"threads must be at least 1, got {requested} (--threads)")
        return requested, "--threads"
    omp = os.environ.get(OMP_ENV, "").strip()
    if omp.isdigit() and int(omp) > 0:
        return int(omp), OMP_ENV
    cpus, load = _machine(cpus, load)
    why = f"{cpus} CPUs, load {load:.1f}" if load is not None else f"{cpus} CPUs"
    return max(1, cpus - round(load or 0.0)), why


def busy_note(threads: int, cpus: int | None = None, load: float | None = None) -> str | None:
    """A short note when the machine runs more than it has CPUs for (our own threads included), else None."""
    cpus, load = _machine(cpus, load)
    if load is None or load < cpus + 0.5:  # half a process of slack: the average lags and rounds
        return None
    return f"busy machine: load {load:.1f} on {cpus} CPUs ({threads} threads here, see --threads)"


def apply_thread_count(requested: int | None, set_num_threads: Callable[[int], None]) -> tuple[int, str]:
    """Pick the count, hand it to `set_num_threads`, and return it with a line saying why, to print."""
    threads, why = pick_thread_count(requested)
    set_num_threads(threads)
    return threads, f"threads: {threads} ({why}; --threads N to change)"
