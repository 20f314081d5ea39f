"""Pickle protocol 5 (PEP 574) of a lazyvault record against a plain ndarray.

Four ways to pickle the same 1 GiB of float64, then unpickle it:

- ``record p5``: ``pickle.dumps(record, protocol=5, buffer_callback=...)``
  of a record read from a store (a fresh, never-touched proxy each run):
  the array leaves out-of-band as a ``PickleBuffer`` viewing the mapping;
- ``ndarray p5``: the same with an ndarray resident in memory (numpy's own
  protocol-5 path, the reference for zero copy);
- ``record p4`` / ``ndarray p4``: protocol 4, the bytes copied in-band.

``loads`` is ``pickle.loads(data, buffers=...)`` of what ``dumps`` gave.
Time runs and memory runs are separate (tracemalloc slows allocation) and
alternate the variants so drift hits all equally; medians are reported.
Memory: ``tracemalloc`` peak (Python and numpy allocations) and peak RSS
delta (``VmHWM`` after resetting it through ``/proc/self/clear_refs``; it
counts the file pages of the mapping a copy faults in, too). Run:

    .venv/bin/python benches/pickle_protocol5.py [--gib 1] [--repeat 5]
"""

from __future__ import annotations

import argparse
import gc
import pickle
import statistics
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import lazyvault as lv

MIB = 2**20


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _reset_peak_rss() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to VmRSS


def _dumps(obj: Any, protocol: int) -> tuple[bytes, list[pickle.PickleBuffer] | None]:
    if protocol == 5:
        buffers: list[pickle.PickleBuffer] = []
        return pickle.dumps(obj, protocol=5, buffer_callback=buffers.append), buffers
    return pickle.dumps(obj, protocol=protocol), None


def _timed(make: Callable[[], Any], protocol: int) -> tuple[float, float, int]:
    """(dumps seconds, loads seconds, pickle size) of one run."""
    obj = make()
    t0 = time.perf_counter()
    data, buffers = _dumps(obj, protocol)
    t1 = time.perf_counter()
    back = pickle.loads(data, buffers=buffers)
    t2 = time.perf_counter()
    size = len(data)
    del obj, data, buffers, back
    gc.collect()
    return t1 - t0, t2 - t1, size


def _memory(make: Callable[[], Any], protocol: int) -> tuple[int, int]:
    """(tracemalloc peak bytes, peak RSS delta bytes) of dumps + loads."""
    obj = make()
    gc.collect()
    base_rss = _status_kib("VmRSS")
    _reset_peak_rss()
    tracemalloc.start()
    data, buffers = _dumps(obj, protocol)
    back = pickle.loads(data, buffers=buffers)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss = (_status_kib("VmHWM") - base_rss) * 1024
    del obj, data, buffers, back
    gc.collect()
    return peak, rss


def _fmt_s(s: float) -> str:
    return f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.2f} s"


def _fmt_b(n: float) -> str:
    if n < MIB:
        return f"{n / 1024:.1f} KiB"
    return f"{n / MIB:.0f} MiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    n = int(args.gib * 2**30) // 8

    with tempfile.TemporaryDirectory(dir=".") as tmp:
        store_path = Path(tmp) / "s.lv"
        with lv.Store.open(store_path) as store:
            array = np.arange(n, dtype=np.float64)
            store["k"] = {"step": 1, "label": "bench", "data": array}
            store.flush()
        store = lv.Store.open(store_path, "r")
        variants: dict[str, tuple[Callable[[], Any], int]] = {
            "record p5": (lambda: store["k"], 5),
            "ndarray p5": (lambda: array, 5),
            "record p4": (lambda: store["k"], 4),
            "ndarray p4": (lambda: array, 4),
        }
        for make, protocol in variants.values():  # warm-up (page cache, imports)
            _timed(make, protocol)
        times: dict[str, list[tuple[float, float, int]]] = {v: [] for v in variants}
        mems: dict[str, list[tuple[int, int]]] = {v: [] for v in variants}
        for _ in range(args.repeat):
            for name, (make, protocol) in variants.items():
                times[name].append(_timed(make, protocol))
            for name, (make, protocol) in variants.items():
                mems[name].append(_memory(make, protocol))
        store.close()

    rows = {}
    for name in variants:
        rows[name] = (
            statistics.median(t[0] for t in times[name]),
            statistics.median(t[1] for t in times[name]),
            times[name][0][2],
            statistics.median(m[0] for m in mems[name]),
            statistics.median(m[1] for m in mems[name]),
        )
    print(f"{n * 8 / 2**30:g} GiB float64, medians of {args.repeat} alternating runs\n")
    print("| variant | dumps | loads | pickle size | tracemalloc peak | peak RSS delta |")
    print("|---|---|---|---|---|---|")
    for name, (d, lo, size, peak, rss) in rows.items():
        print(
            f"| {name} | {_fmt_s(d)} | {_fmt_s(lo)} | {_fmt_b(size)} | {_fmt_b(peak)} "
            f"| {_fmt_b(rss)} |"
        )
    print("\nratios (dumps time, loads time):")
    for a, b in [
        ("record p5", "ndarray p5"),
        ("record p4", "ndarray p4"),
        ("record p5", "record p4"),
    ]:
        print(
            f"  {a} / {b}: dumps {rows[a][0] / rows[b][0]:.3g}, loads {rows[a][1] / rows[b][1]:.3g}"
        )


if __name__ == "__main__":
    main()
