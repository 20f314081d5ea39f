"""Archive export and open: lazyvault .lvz against np.savez / np.load (npz).

Same arrays on the same file system, warm page cache, alternating runs.
Export: ``store.export("x.lvz")`` vs ``np.savez("x.npz", **arrays)``.
Open + first element: ``lv.Store.open("x.lvz")[k].a0[0]`` vs
``np.load("x.npz")["k/a0"][0]`` (npz members cannot be mapped by numpy:
``mmap_mode`` is ignored for .npz, so numpy reads the whole member).
Run:

    .venv/bin/python benches/archive.py [--mib 256] [--arrays 8] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

import lazyvault as lv


def _median_s(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256, help="total array size")
    parser.add_argument("--arrays", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    n = args.mib * 2**20 // 8 // args.arrays
    arrays = {f"a{i}": np.full(n, float(i)) for i in range(args.arrays)}
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        root = Path(tmp)
        lvz, npz = root / "x.lvz", root / "x.npz"
        with lv.Store.open(root / "s.lv") as store:
            store["k"] = arrays
            store.flush()

            def export_lvz() -> None:
                lvz.unlink(missing_ok=True)
                store.export(lvz)

            def export_npz() -> None:
                np.savez(npz, **{f"k/{name}": a for name, a in arrays.items()})

            def open_lvz() -> float:
                with lv.Store.open(lvz) as archive:
                    return float(archive["k"].a1[0])

            def open_npz() -> float:
                with np.load(npz) as z:
                    return float(z["k/a1"][0])

            def sum_lvz() -> float:
                with lv.Store.open(lvz) as archive:
                    rec = archive["k"]
                    return sum(float(rec.array(name).sum()) for name in arrays)

            def sum_npz() -> float:
                with np.load(npz) as z:
                    return sum(float(z[f"k/{name}"].sum()) for name in arrays)

            export_lvz(), export_npz()
            assert open_lvz() == open_npz() == 1.0
            assert sum_lvz() == sum_npz()
            rows = []
            for label, ours, theirs in (
                ("export", export_lvz, export_npz),
                ("open + first element", open_lvz, open_npz),
                ("open + sum of every array", sum_lvz, sum_npz),
            ):
                a = statistics.median(_median_s(ours, 1) for _ in range(args.repeat))
                b = statistics.median(_median_s(theirs, 1) for _ in range(args.repeat))
                rows.append((label, a, b))
    print(f"{args.mib} MiB in {args.arrays} float64 arrays")
    print(f"{'workload':<28} {'lazyvault':>12} {'numpy npz':>12} {'ratio':>7}")
    for label, a, b in rows:
        print(f"{label:<28} {a * 1e3:>9.2f} ms {b * 1e3:>9.2f} ms {a / b:>7.3f}")


if __name__ == "__main__":
    main()
