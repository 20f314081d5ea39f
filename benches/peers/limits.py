"""Physical limits of this machine, measured with the same tools the
workloads use, so each lazyvault result can be given as a fraction of the
limit that binds it.

- ``memcpy``: ``np.copyto`` between two resident 256 MiB buffers (bytes/s);
- ``read``: ``readinto`` of a file already in the page cache into a reused
  buffer of 64 KiB to 1 MiB, the fastest (bytes/s): what ``read(2)`` can deliver;
- ``fault``: seconds per page fault on a fresh read-only map of a cached
  file, from ``ru_minflt`` (the kernel maps up to 16 pages per fault:
  ``fault_around_bytes``), and ``map_touch``: bytes/s of ``.sum()`` over a
  fresh map of that file (faults plus reading), the bound of a first touch;
- ``sum``: bytes/s of ``.sum()`` over a resident float32 array (the CPU
  bound of touching every byte);
- ``write``: bytes/s of writing a new file into the page cache and then
  ``fsync`` of it (the bound of a durable write).
"""

from __future__ import annotations

import mmap
import os
import resource
import statistics
import time
from pathlib import Path

import numpy as np

MIB = 2**20


def _best(fn, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def measure(scratch: Path, file_mib: int = 512) -> dict[str, float]:
    """The limits, using a ``file_mib`` MiB file in ``scratch``."""
    out = _memory()
    path = scratch / "limits.bin"
    out["write"] = _write_file(path, file_mib)

    def read(size: int) -> None:
        buf = bytearray(size)
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass

    # the fastest buffer size: one that stays in the CPU cache
    out["read"] = max(
        path.stat().st_size / _best(lambda size=size: read(size))
        for size in (64 * 1024, 128 * 1024, MIB)
    )

    faults, seconds = [], []
    for _ in range(5):
        with open(path, "rb") as f:
            m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        a = np.frombuffer(m, dtype=np.uint8)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = time.perf_counter()
        a[:: mmap.PAGESIZE].sum()  # one byte per page: faults only
        seconds.append(time.perf_counter() - t0)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        del a
        m.close()
    best = min(range(5), key=lambda i: seconds[i])
    out["fault"] = seconds[best] / max(faults[best], 1)
    out["pages_per_fault"] = (path.stat().st_size / mmap.PAGESIZE) / max(faults[best], 1)

    def map_touch() -> None:
        with open(path, "rb") as f:
            m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        a = np.frombuffer(m, dtype=np.float32)
        a.sum()
        del a
        m.close()

    out["map_touch"] = path.stat().st_size / _best(map_touch)
    path.unlink()
    return out


def _memory() -> dict[str, float]:
    src = np.ones(256 * MIB // 4, dtype=np.float32)
    dst = np.empty_like(src)
    return {
        "memcpy": src.nbytes / _best(lambda: np.copyto(dst, src)),
        "sum": src.nbytes / _best(src.sum),
    }


def _write_file(path: Path, mib: int) -> float:
    """bytes/s of writing ``mib`` MiB to a new file and fsyncing it."""
    data = np.ones(mib * MIB // 4, dtype=np.float32)

    def write() -> None:
        with open(path, "wb") as f:
            f.write(memoryview(data).cast("B"))
            f.flush()
            os.fsync(f.fileno())

    return data.nbytes / statistics.median(_timed(write) for _ in range(3))


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def describe(limits: dict[str, float]) -> list[str]:
    gb = 1e9
    return [
        f"- memcpy (`np.copyto`, 256 MiB): {limits['memcpy'] / gb:.2f} GB/s",
        f"- `.sum()` of a resident float32 array: {limits['sum'] / gb:.2f} GB/s",
        f"- page-cache read (`readinto`, best of 64 KiB-1 MiB buffers): "
        f"{limits['read'] / gb:.2f} GB/s",
        f"- page fault on a fresh map of a cached file: {limits['fault'] * 1e6:.2f} µs "
        f"({limits['pages_per_fault']:.1f} pages mapped per fault)",
        f"- first touch of a fresh map (`.sum()`, faults included): "
        f"{limits['map_touch'] / gb:.2f} GB/s",
        f"- write to the page cache + fsync: {limits['write'] / gb:.2f} GB/s",
    ]
