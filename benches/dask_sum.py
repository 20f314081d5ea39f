"""Dask: the sum of one array over N records, lazyvault ``store.to_dask_array("x")`` against
the same data in zarr (``da.from_zarr``) and in HDF5 (``da.from_array`` over h5py).

Every record holds one array ``x`` (``--cases N:KiB``: N records of KiB each; integer values
stored as float64, so every sum is exact, and the answers are checked equal, exactly, before
timing, as are the first and last records). The same records are written once into a
temporary directory (removed at the end) as:

- a lazyvault store, one record per array (``store.to_dask_array("x")``);
- zarr (v3), one record per zarr chunk along axis 0, uncompressed (``compressors=None``)
  and with zarr's default compressor (zstd; opt-in: ``--systems ... "zarr zstd"``, the
  slowest to write and read);
- an HDF5 file (h5py), one ``(N, ...)`` dataset, contiguous and chunked one record per
  chunk, read through a small picklable wrapper (path + dataset name) that opens the file
  in each process at its first read (the pattern xarray uses: h5py objects do not pickle).

Every system gets the same dask chunks: the records per chunk lazyvault chose for
``--chunk-mib`` 128 (dask's ``array.chunk-size``, lazyvault's default), else
``max(1, chunk // record size)``. ``arr.sum().compute()`` runs on a
``distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1)`` and on
dask's local threaded scheduler (one thread per CPU). Also measured: building the collection
from the path (open, read the metadata, make the graph), and the pickled size of the array's
graph (what a client ships to the scheduler).

Timings are medians of ``--repeat`` alternating runs with a warm page cache (every system
is read once first); ratios are lazyvault / peer: lower is better.

Rerun (defaults: about 5 minutes on 2 idle cores):

    .venv/bin/python benches/dask_sum.py --cases 1000:1024 10000:64 --chunk-mib 128 --repeat 3

Every system and a second chunking (as in benches/RESULTS.md):

    .venv/bin/python benches/dask_sum.py --repeat 5 --chunk-mib 128 16 \\
        --systems lazyvault zarr "zarr zstd" "h5py contiguous" "h5py chunked"
"""

from __future__ import annotations

import argparse
import os
import pickle
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import lazyvault as lv

SYSTEMS = ["lazyvault", "zarr", "zarr zstd", "h5py contiguous", "h5py chunked"]
# zarr zstd is the slowest to write and to read (decompression): opt-in, to keep a run short
DEFAULT_SYSTEMS = ["lazyvault", "zarr", "h5py contiguous", "h5py chunked"]
SCHEDULERS = ["distributed", "threads"]


class H5Source:
    """An HDF5 dataset by file path and name, for ``da.from_array``: pickles as those two
    (plus shape and dtype), opens the file read-only in each process at its first read."""

    def __init__(self, path: str, name: str, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.path, self.name, self.shape, self.dtype = path, name, shape, np.dtype(dtype)
        self.ndim = len(shape)
        self._pid: int | None = None
        self._ds: Any = None

    def _dataset(self) -> Any:
        if self._pid != os.getpid():
            import h5py

            # two threads may both open it at first: harmless, the last one is kept
            self._ds = h5py.File(self.path, "r")[self.name]
            self._pid = os.getpid()
        return self._ds

    def __getitem__(self, index: Any) -> np.ndarray:
        return self._dataset()[index]

    def __reduce__(self) -> tuple[Any, ...]:
        return (H5Source, (self.path, self.name, self.shape, self.dtype))


def parse_case(text: str) -> tuple[int, int]:
    try:
        n, kib = (int(v) for v in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"a case is N:KiB (e.g. 1000:1024), not {text!r}"
        ) from None
    if n < 1 or kib < 1 or kib * 1024 % 8:
        raise argparse.ArgumentTypeError("N and KiB must be positive, KiB*1024 a multiple of 8")
    return n, kib


def write_data(root: Path, n: int, m: int, dtype: np.dtype, systems: list[str]) -> int:
    """The N records of ``m`` values each, in every system; returns the exact sum."""
    import h5py
    import zarr

    rng = np.random.default_rng(42)
    block = max(1, (64 << 20) // (m * dtype.itemsize))  # records generated at once
    store = lv.Store.open(root / "store.lv", mode="w") if "lazyvault" in systems else None
    zs = {}
    compressed: list[tuple[str, Any]] = [("zarr", None), ("zarr zstd", "auto")]
    for name, compressors in compressed:
        if name in systems:
            zs[name] = zarr.create_array(
                store=str(root / name.replace(" ", "-")),
                shape=(n, m),
                chunks=(1, m),
                dtype=dtype,
                compressors=compressors,
            )
    h5 = h5py.File(root / "data.h5", "w")
    hs = {}
    if "h5py contiguous" in systems:
        hs["h5py contiguous"] = h5.create_dataset("contiguous", (n, m), dtype=dtype)
    if "h5py chunked" in systems:
        hs["h5py chunked"] = h5.create_dataset("chunked", (n, m), dtype=dtype, chunks=(1, m))
    total = 0
    for i in range(0, n, block):
        data = rng.integers(0, 256, size=(min(block, n - i), m)).astype(dtype)
        total += int(data.sum(dtype=np.int64))
        if store is not None:
            store.update(
                ((f"r{i + j:07d}", {"x": row}) for j, row in enumerate(data)), progress=False
            )
        for z in zs.values():
            z[i : i + len(data)] = data
        for d in hs.values():
            d[i : i + len(data)] = data
    if store is not None:
        store.close()
    h5.close()
    return total


def builders(root: Path, rpc: int | None) -> dict[str, Callable[[], Any]]:
    """Per system: a function from the path to the dask array (``rpc`` records per chunk;
    None: lazyvault's default)."""
    import dask.array as da
    import h5py

    def lazyvault_array() -> Any:
        store = lv.Store.open(root / "store.lv", mode="r")
        arr = store.to_dask_array("x") if rpc is None else store.to_dask_array("x", chunks=rpc)
        store.close()
        return arr

    def zarr_with_chunks(dirname: str) -> Callable[[], Any]:
        def build() -> Any:
            import zarr

            z = zarr.open_array(str(root / dirname), mode="r")
            return da.from_zarr(z, chunks=(rpc, z.shape[1]))

        return build

    def h5_array(name: str) -> Callable[[], Any]:
        def build() -> Any:
            with h5py.File(root / "data.h5", "r") as f:
                shape, dtype = f[name].shape, f[name].dtype
            src = H5Source(str(root / "data.h5"), name, shape, dtype)
            meta = np.empty((0,) * len(shape), dtype)
            return da.from_array(src, chunks=(rpc, shape[1]), meta=meta)

        return build

    return {
        "lazyvault": lazyvault_array,
        "zarr": zarr_with_chunks("zarr"),
        "zarr zstd": zarr_with_chunks("zarr-zstd"),
        "h5py contiguous": h5_array("contiguous"),
        "h5py chunked": h5_array("chunked"),
    }


def graph_bytes(arr: Any) -> int:
    """The size of the array's graph pickled as distributed would (pickle, else cloudpickle)."""
    graph = dict(arr.__dask_graph__())
    try:
        return len(pickle.dumps(graph, protocol=5))
    except Exception:
        import cloudpickle

        return len(cloudpickle.dumps(graph, protocol=5))


def progress(text: str) -> None:
    """A line on stderr (the tables go to stdout)."""
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def check(got: Any, expected: int, what: str) -> None:
    """float64 sums of these integer values are exact; float32 ones are rounded."""
    if got.dtype == np.float64:
        assert got == expected, f"{what}: sum {got!r}, expected {expected}"
    else:
        np.testing.assert_allclose(got, expected, rtol=1e-5, err_msg=what)


def median_ms(times: list[float]) -> float:
    return statistics.median(times) * 1e3


def fmt_ms(ms: float) -> str:
    return f"{ms:,.0f} ms" if ms >= 100 else f"{ms:.1f} ms" if ms >= 1 else f"{ms:.2f} ms"


def fmt_bytes(b: float) -> str:
    return f"{b / 1024:,.1f} KiB" if b < 1 << 20 else f"{b / (1 << 20):,.1f} MiB"


def run_case(
    root: Path, n: int, kib: int, dtype: np.dtype, chunk_mibs: list[int], args: Any, client: Any
) -> None:
    import dask

    m = kib * 1024 // dtype.itemsize
    t0 = time.perf_counter()
    expected = write_data(root, n, m, dtype, args.systems)
    print(
        f"\nwrote {n:,} records of {kib:,} KiB ({dtype}) into {len(args.systems)} systems "
        f"in {time.perf_counter() - t0:.1f} s",
        flush=True,
    )
    default_chunk = dask.utils.parse_bytes(dask.config.get("array.chunk-size"))
    for chunk_mib in chunk_mibs:
        if "lazyvault" in args.systems and chunk_mib << 20 == default_chunk:
            rpc = builders(root, None)["lazyvault"]().chunks[0][0]
            how = f"lazyvault's default for {chunk_mib} MiB"
        else:
            rpc = max(1, (chunk_mib << 20) // (kib * 1024))
            how = f"{chunk_mib} MiB chunks"
        make = {s: f for s, f in builders(root, rpc).items() if s in args.systems}
        arrays = {s: f() for s, f in make.items()}
        for s, a in arrays.items():
            assert a.shape == (n, m) and a.dtype == dtype, (s, a.shape, a.dtype)
            assert a.chunks[0] == arrays[args.systems[0]].chunks[0], (s, a.chunks[0][:3])
        sums = {s: a.sum() for s, a in arrays.items()}
        n_chunks = len(arrays[args.systems[0]].chunks[0])
        tasks = {s: len(x.__dask_graph__()) for s, x in sums.items()}

        # build: from the path to the collection, alternating
        build_t: dict[str, list[float]] = {s: [] for s in make}
        for _ in range(args.repeat):
            for s, f in make.items():
                t = time.perf_counter()
                f()
                build_t[s].append(time.perf_counter() - t)
        sizes = {s: graph_bytes(a) for s, a in arrays.items()}

        # checked equal (and the caches warmed) before timing
        edge = {s: a[[0, -1], :].compute(scheduler="threads") for s, a in arrays.items()}
        for s in arrays:
            np.testing.assert_array_equal(edge[s], edge[args.systems[0]], err_msg=s)
        times: dict[str, dict[str, list[float]]] = {}
        for sched in args.schedulers:
            kw = {"scheduler": client} if sched == "distributed" else {"scheduler": "threads"}
            for s, x in sums.items():
                t = time.perf_counter()
                got = x.compute(**kw)
                check(got, expected, f"{s} ({sched})")
                progress(
                    f"{n}x{kib} KiB, {rpc} per chunk, {sched}, {s}: {time.perf_counter() - t:.2f} s"
                )
            times[sched] = {s: [] for s in sums}
            for _ in range(args.repeat):
                for s, x in sums.items():
                    t = time.perf_counter()
                    got = x.compute(**kw)
                    times[sched][s].append(time.perf_counter() - t)
                    check(got, expected, f"{s} ({sched})")

        total = n * kib * 1024
        print(
            f"\n### {n:,} records x {kib:,} KiB {dtype} ({fmt_bytes(total)}), {rpc:,} records "
            f"per chunk ({how}): {n_chunks:,} chunks, sum {expected:,}\n"
        )
        head = "| system | build | graph pickle | tasks (sum) |"
        rule = "|---|---|---|---|"
        for sched in args.schedulers:
            head += f" {sched} | GB/s | lazyvault / it |"
            rule += "---|---|---|"
        print(head)
        print(rule)
        lv_ms = {sched: median_ms(times[sched].get("lazyvault", [float("nan")])) for sched in times}
        for s in arrays:
            row = (
                f"| {s} | {fmt_ms(median_ms(build_t[s]))} | {fmt_bytes(sizes[s])} | {tasks[s]:,} |"
            )
            for sched in args.schedulers:
                ms = median_ms(times[sched][s])
                row += f" {fmt_ms(ms)} | {total / ms / 1e6:.2f} | {lv_ms[sched] / ms:.2f} |"
            print(row, flush=True)
    for p in root.iterdir():
        shutil.rmtree(p) if p.is_dir() else p.unlink()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--cases",
        type=parse_case,
        nargs="+",
        default=[(1000, 1024), (10_000, 64)],
        help="N:KiB, records and the size of each record's array (default 1000:1024 10000:64)",
    )
    ap.add_argument(
        "--chunk-mib",
        type=int,
        nargs="+",
        default=[128],
        help="dask chunk size in MiB, one table each (128: lazyvault's default chunking)",
    )
    ap.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--systems",
        nargs="+",
        default=DEFAULT_SYSTEMS,
        help=f"among {SYSTEMS} (default: all but zarr zstd)",
    )
    ap.add_argument("--schedulers", nargs="+", default=SCHEDULERS, choices=SCHEDULERS)
    ap.add_argument("--dir", default=None, help="where to write the data (default: a temp dir)")
    args = ap.parse_args()
    unknown = [s for s in args.systems if s not in SYSTEMS]
    if unknown:
        ap.error(f"unknown systems: {', '.join(map(repr, unknown))}")
    if args.repeat < 1 or any(c < 1 for c in args.chunk_mib):
        ap.error("--repeat and --chunk-mib must be at least 1")
    dtype = np.dtype(args.dtype)

    import dask

    client: Any = None
    cluster: Any = None
    if "distributed" in args.schedulers:
        from distributed import Client, LocalCluster

        cluster = LocalCluster(
            n_workers=2, processes=True, threads_per_worker=1, dashboard_address=":0"
        )
        client = Client(cluster)
    print(
        f"dask {dask.__version__}, numpy {np.__version__}, Python {sys.version.split()[0]}, "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; medians of {args.repeat}"
    )
    t0 = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="lv-dask-sum-", dir=args.dir) as tmp:
            for n, kib in args.cases:
                run_case(Path(tmp), n, kib, dtype, args.chunk_mib, args, client)
    finally:
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.close()
    print(f"\ntotal {time.perf_counter() - t0:.0f} s, load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
