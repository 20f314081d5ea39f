"""Metadata queries: lazyvault ``find`` with and without a secondary index,
against the ways people query a collection today, on the same records.

Peers (all on the same metadata, one object per record):

- a directory of one pickle per object: ``pickle.load`` each, test in Python;
- ``.npz`` files with the metadata as a JSON member: ``np.load`` each;
- SQLite, one row per object with the metadata as JSON, queried with
  ``json_extract`` (without and with an expression index);
- lazyvault ``store.find(expr)`` (a scan of the index in Rust), and the same
  with ``store.create_index("temperature")``.

Every system returns the matching keys, and the answers are checked equal.
Timings are medians of ``--repeat`` alternating runs with a warm page cache;
ratios are lazyvault (full scan) / peer: below 1, lazyvault is faster.

Rerun:  .venv/bin/python benches/find.py --n 100000 --npz-max 20000
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import random
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import lazyvault as lv

EXPR = "temperature > 399.0 and material == 'Si'"
MATERIALS = ["Si", "Ge", "GaAs", "InP"]


def make_meta(i: int, rng: random.Random, pad: int) -> dict[str, object]:
    return {
        "run": i,
        "temperature": round(rng.uniform(0.0, 400.0), 3),
        "material": rng.choice(MATERIALS),
        "params": {"lr": 10.0 ** -rng.randint(1, 5), "steps": rng.randint(10, 10_000)},
        "tags": rng.sample(["a", "b", "c", "d", "e"], 2),
        "note": "x" * pad,
    }


def matches(meta: dict[str, object]) -> bool:
    t = meta.get("temperature")
    return isinstance(t, float) and t > 399.0 and meta.get("material") == "Si"


def timed(fn: Callable[[], list[str]], repeat: int) -> tuple[float, list[str]]:
    times = []
    result: list[str] = []
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), sorted(result)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100_000, help="records (default 100000)")
    ap.add_argument(
        "--npz-max", type=int, default=20_000, help="at most this many .npz files (slow to make)"
    )
    ap.add_argument("--pad", type=int, default=100, help="bytes of filler text per record")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where to build the data (default: a temp dir)")
    args = ap.parse_args()

    rng = random.Random(42)
    metas = [make_meta(i, rng, args.pad) for i in range(args.n)]
    keys = [f"run-{i:07d}" for i in range(args.n)]
    meta_bytes = sum(len(json.dumps(m)) for m in metas) / args.n
    base = Path(args.dir or tempfile.mkdtemp(prefix="lv-find-"))
    print(f"{args.n:,} records, {meta_bytes:.0f} B of JSON metadata each, in {base}")

    built: dict[str, float] = {}
    t = time.perf_counter()
    store = lv.Store.open(base / "store.lv", mode="w")
    store.update(zip(keys, metas, strict=True), progress=False)
    store.flush()
    built["lazyvault"] = time.perf_counter() - t

    pdir = base / "pickles"
    pdir.mkdir()
    t = time.perf_counter()
    for k, m in zip(keys, metas, strict=True):
        with open(pdir / f"{k}.pkl", "wb") as f:
            pickle.dump(m, f, protocol=5)
    built["pickle dir"] = time.perf_counter() - t

    n_npz = min(args.n, args.npz_max)
    zdir = base / "npz"
    zdir.mkdir()
    t = time.perf_counter()
    for k, m in zip(keys[:n_npz], metas[:n_npz], strict=True):
        np.savez(zdir / f"{k}.npz", meta=np.array(json.dumps(m)))
    built["npz dir"] = time.perf_counter() - t

    t = time.perf_counter()
    db = sqlite3.connect(base / "meta.sqlite")
    db.execute("CREATE TABLE records (key TEXT PRIMARY KEY, meta TEXT NOT NULL)")
    db.executemany(
        "INSERT INTO records VALUES (?, ?)",
        ((k, json.dumps(m)) for k, m in zip(keys, metas, strict=True)),
    )
    db.commit()
    built["sqlite"] = time.perf_counter() - t

    sql = (
        "SELECT key FROM records WHERE json_extract(meta, '$.temperature') > 399.0 "
        "AND json_extract(meta, '$.material') = 'Si'"
    )

    def lv_scan() -> list[str]:
        return store.find(EXPR).keys()

    def pickle_scan() -> list[str]:
        out = []
        for entry in os.scandir(pdir):
            with open(entry.path, "rb") as f:
                if matches(pickle.load(f)):
                    out.append(entry.name[:-4])
        return out

    def npz_scan() -> list[str]:
        out = []
        for entry in os.scandir(zdir):
            with np.load(entry.path) as z:
                if matches(json.loads(str(z["meta"]))):
                    out.append(entry.name[:-4])
        return out

    def sqlite_scan() -> list[str]:
        return [r[0] for r in db.execute(sql)]

    results: dict[str, tuple[float, list[str]]] = {}
    # alternate systems, warm first
    for fn in (lv_scan, pickle_scan, npz_scan, sqlite_scan):
        fn()
    for name, fn in [
        ("lazyvault find (scan)", lv_scan),
        ("pickle dir", pickle_scan),
        ("sqlite json_extract", sqlite_scan),
        ("npz dir", npz_scan),
    ]:
        results[name] = timed(fn, args.repeat)
    store.create_index("temperature")
    db.execute("CREATE INDEX t ON records (json_extract(meta, '$.temperature'))")
    db.commit()
    assert "index temperature" in store.explain(EXPR)
    results["lazyvault find (index)"] = timed(lv_scan, args.repeat)
    results["sqlite json_extract (index)"] = timed(sqlite_scan, args.repeat)

    expected = sorted(k for k, m in zip(keys, metas, strict=True) if matches(m))
    expected_npz = sorted(k for k, m in zip(keys[:n_npz], metas[:n_npz], strict=True) if matches(m))
    for name, (_, got) in results.items():
        want = expected_npz if name == "npz dir" else expected
        assert got == want, f"{name}: {len(got)} hits, expected {len(want)}"

    scan = results["lazyvault find (scan)"][0]
    indexed = results["lazyvault find (index)"][0]
    print(f"\nquery: {EXPR!r}: {len(expected)} hits of {args.n:,}")
    print("build: " + ", ".join(f"{k} {v:.1f} s" for k, v in built.items()))
    print("\n| system | records | time | per record | lazyvault scan / it | lazyvault index / it |")
    print("|---|---|---|---|---|---|")
    for name, (secs, _) in results.items():
        n = n_npz if name == "npz dir" else args.n
        # per-record cost scales the npz figure to the full N for the ratios
        full = secs * args.n / n
        print(
            f"| {name} | {n:,} | {secs * 1e3:.1f} ms | {secs / n * 1e6:.2f} µs "
            f"| {scan / full:.3f} | {indexed / full:.4f} |"
        )
    store.close()
    db.close()


if __name__ == "__main__":
    main()
