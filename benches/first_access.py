"""Open + first element of one array: lazyvault against np.load(mmap_mode="r").

Both read the same bytes from the page cache (warm runs): lazyvault opens the
record from the index, maps the payload and reads element 0; numpy parses the
.npy header, maps the file and reads element 0. Sizes vary to show the cost
does not depend on the array size. Run:

    .venv/bin/python benches/first_access.py [--sizes-mib 1 64 1024] [--repeat 200]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

import lazyvault as lv


def _median_us(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mib", type=int, nargs="+", default=[1, 64, 1024])
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    print(f"{'size':>9} {'lazyvault':>12} {'np.load mmap':>14} {'ratio':>7}")
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        root = Path(tmp)
        with lv.Store.open(root / "s.lv") as store:
            for mib in args.sizes_mib:
                arr = np.ones((mib * 2**20 // 8 // 1024, 1024))
                store[f"a{mib}"] = {"data": arr}
                np.save(root / f"a{mib}.npy", arr)
                del arr
            store.flush()

            for mib in args.sizes_mib:
                key, path = f"a{mib}", root / f"a{mib}.npy"

                def ours(key: str = key) -> float:
                    return float(store[key].data[0, 0])

                def theirs(path: Path = path) -> float:
                    return float(np.load(path, mmap_mode="r")[0, 0])

                assert ours() == theirs() == 1.0
                # alternate the two so drift affects both equally
                a = statistics.median(_median_us(ours, args.repeat // 10) for _ in range(10))
                b = statistics.median(_median_us(theirs, args.repeat // 10) for _ in range(10))
                print(f"{mib:>6} MiB {a:>9.1f} µs {b:>11.1f} µs {a / b:>7.2f}")


if __name__ == "__main__":
    main()
