"""Workloads (k) and (l) of issue 15: metadata scans over many records and
small records, against the columnar tools a user keeps beside ``.npy`` files.

(k) metadata scan: ``scan_n`` records (default 1,000,000) of five metadata
fields (``temperature`` float, ``material`` str of four values, ``step``
int, ``ok`` bool, ``started`` datetime) and, for lazyvault, one tiny array
each. The two-field predicate ``temperature > 250 and material == 'Si'`` is
timed as ``count`` and as ``find`` (a Python list of the matching keys: the
same product from every system), warm, medians; for lazyvault also as
``find`` giving its ``Results`` (the keys kept packed in Rust, no ``str``
made: what ``store.find(QUERY)`` returns); then the first count of a
freshly opened handle; then all records as an Arrow table.

(l) small records: ``small_n`` records (default 100,000) of the same five
fields plus one 64-float (float64, 512 B) array each: a durable write, the
blocks used on disk, and reading that one array of every record.

Every system's answers are checked against the expected ones (computed with
numpy from the generated columns) before anything is timed. The data is
generated once per run (:func:`columns`) and each system's copy is built
once per run and shared by all the cases; lazyvault's 1M-record scan store
(the slow build) can be kept between runs with ``--scan-cache``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import sqlite3
import time
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from systems import System, syncfs
from workloads import Context, Row, timed

import lazyvault as lv

MATERIALS = ("Si", "Ge", "GaAs", "InP")
QUERY = "temperature > 250 and material == 'Si'"
SQL_WHERE = "temperature > 250 and material = 'Si'"
JSON_WHERE = "json_extract(meta, '$.temperature') > 250 and json_extract(meta, '$.material') = 'Si'"
ARRAY_LEN = 64  # (l): 64 float64 = 512 B per record
EPOCH = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def key_of(i: int) -> str:
    return f"rec-{i:07d}"


@cache
def columns(n: int) -> dict[str, np.ndarray]:
    """The five metadata fields of ``n`` records as numpy columns, plus
    ``key`` (object array of str); deterministic."""
    rng = np.random.default_rng(15)
    return {
        "key": np.array([key_of(i) for i in range(n)], dtype=object),
        "temperature": rng.uniform(0.0, 400.0, n).round(3),
        "material": np.array(MATERIALS, dtype=object)[rng.integers(0, len(MATERIALS), n)],
        "step": rng.integers(0, 1_000_000, n),
        "ok": rng.random(n) < 0.9,
        # seconds since EPOCH: every record a distinct, whole-second time
        "started": np.arange(n, dtype=np.int64) * 37,
    }


@cache
def expected_keys(n: int) -> tuple[str, ...]:
    c = columns(n)
    hits = (c["temperature"] > 250) & (c["material"] == "Si")
    return tuple(c["key"][hits])


def small_array(i: int) -> np.ndarray:
    """Record ``i``'s 64-float array of (l): ``i + [0, 1/64, ..., 63/64]``."""
    return i + np.arange(ARRAY_LEN, dtype=np.float64) / ARRAY_LEN


def small_arrays(n: int) -> np.ndarray:
    """All of (l)'s arrays as one ``(n, 64)`` float64 matrix (row i is record i's)."""
    return np.arange(n, dtype=np.float64)[:, None] + np.arange(ARRAY_LEN) / ARRAY_LEN


def metas(n: int) -> Iterator[tuple[str, dict]]:
    """``(key, meta)`` of every record, ``started`` a UTC ``datetime``."""
    c = columns(n)
    temperature, material = c["temperature"].tolist(), c["material"].tolist()
    step, ok, started = c["step"].tolist(), c["ok"].tolist(), c["started"].tolist()
    for i in range(n):
        yield (
            key_of(i),
            {
                "temperature": temperature[i],
                "material": material[i],
                "step": step[i],
                "ok": ok[i],
                "started": EPOCH + dt.timedelta(seconds=started[i]),
            },
        )


def json_text(meta: dict) -> str:
    return json.dumps({**meta, "started": meta["started"].isoformat()})


def arrow_table(n: int, with_arrays: bool = False) -> Any:
    """The records as a ``pyarrow.Table``: ``key`` string, the five fields
    (``started`` ``timestamp[us, UTC]``), and for (l) ``x`` a
    ``fixed_size_list<float64, 64>``."""
    import pyarrow as pa

    c = columns(n)
    started = (c["started"] * 1_000_000 + int(EPOCH.timestamp()) * 1_000_000).astype(
        "datetime64[us]"
    )
    cols = {
        "key": pa.array(c["key"], type=pa.string()),
        "temperature": pa.array(c["temperature"]),
        "material": pa.array(c["material"], type=pa.string()),
        "step": pa.array(c["step"]),
        "ok": pa.array(c["ok"]),
        "started": pa.array(started, type=pa.timestamp("us", tz="UTC")),
    }
    if with_arrays:
        flat = pa.array(small_arrays(n).ravel())
        cols["x"] = pa.FixedSizeListArray.from_arrays(flat, ARRAY_LEN)
    return pa.table(cols)


def disk_bytes(root: Path) -> int:
    """Blocks used under ``root`` (``st_blocks * 512`` of every file): what
    the data costs on disk, small files rounded up to whole blocks."""
    if root.is_file():
        return root.stat().st_blocks * 512
    total = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


def _fingerprint() -> str:
    """Which lazyvault build wrote a cached store: version and the compiled
    core's size and modification time."""
    core = Path(lv._lazyvault.__file__)  # type: ignore[attr-defined]
    st = core.stat()
    return f"{getattr(lv, '__version__', '?')} {core} {st.st_size} {st.st_mtime_ns}"


# -- the systems of (k) and (l) ------------------------------------------------


class Columnar:
    """One system of (k)/(l). ``build`` writes the records (durably), the
    query methods answer ``QUERY``; ``open``/``close`` frame the reads."""

    name = ""
    requires: tuple[str, ...] = ()
    workloads = "kl"  # which of the two it takes part in

    @classmethod
    def missing(cls) -> str | None:
        """Why this system cannot run here, or None."""
        return System.missing.__func__(cls)  # the same rule and message

    def __init__(self, root: Path, n: int, small: bool) -> None:
        self.root, self.n, self.small = root, n, small

    def build(self) -> None:
        raise NotImplementedError

    def open(self) -> None:
        pass

    def close(self) -> None:
        pass

    def count(self) -> int:
        raise NotImplementedError

    def find(self) -> list[str]:
        raise NotImplementedError

    def first_count(self) -> tuple[float, float, int]:
        """Opens a fresh handle and counts once: (open seconds, count
        seconds, count); None where the system has nothing to open."""
        t0 = time.perf_counter()
        self.open()
        t1 = time.perf_counter()
        try:
            c = self.count()
            t2 = time.perf_counter()
        finally:
            self.close()
        return t1 - t0, t2 - t1, c

    def to_arrow(self) -> Any:
        raise NotImplementedError("no Arrow table of its own")

    def arrays(self) -> list[np.ndarray]:
        """(l): the ``x`` array of every record, in key order."""
        raise NotImplementedError

    def disk(self) -> int:
        return disk_bytes(self.root)


class LazyVaultColumnar(Columnar):
    """lazyvault: ``store.update(...)`` then ``close()``; queries on a
    reader (``mode="r"``); ``store[k].x`` per key."""

    name = "lazyvault"

    def build(self):
        def objects():
            for i, (key, meta) in enumerate(metas(self.n)):
                if self.small:
                    meta["x"] = small_array(i)
                else:  # one tiny array each, as the store had
                    meta["x"] = np.array([i], dtype=np.int32)
                yield key, meta

        store = lv.Store.open(self.root, "w")
        try:
            store.update(objects(), progress=False)
        finally:
            store.close()

    def open(self):
        self.store = lv.Store.open(self.root, mode="r")

    def close(self):
        self.store.close()

    def count(self):
        return self.store.count(QUERY)

    def find(self):
        return self.store.find(QUERY).keys()

    def find_results(self):
        """``store.find(QUERY)`` itself: the ``Results``, keys packed in Rust."""
        return self.store.find(QUERY)

    def to_arrow(self):
        if not hasattr(self.store, "to_arrow"):
            raise NotImplementedError("Store.to_arrow is not in this build")
        try:
            return self.store.to_arrow()
        except ImportError as e:  # the arrow extra is optional
            raise NotImplementedError(f"to_arrow needs pyarrow: {e}") from e

    def arrays(self):
        store = self.store
        return [store[k].x for k in store.keys()]


class ParquetDuckDB(Columnar):
    """DuckDB over one Parquet file of the fields, written with pyarrow
    (its defaults); a connection per reader. ``to_arrow`` is
    ``pyarrow.parquet.read_table``."""

    name = "DuckDB+Parquet"
    requires = ("duckdb", "pyarrow")
    workloads = "k"

    @property
    def path(self) -> Path:
        return self.root / "records.parquet"

    def build(self):
        import pyarrow.parquet as pq

        self.root.mkdir(parents=True)
        pq.write_table(arrow_table(self.n), self.path)
        syncfs(self.root)

    def open(self):
        import duckdb

        self.db = duckdb.connect()

    def close(self):
        self.db.close()

    def _sql(self, what: str) -> str:
        return f"select {what} from read_parquet('{self.path}') where {SQL_WHERE}"

    def count(self):
        return self.db.execute(self._sql("count(*)")).fetchone()[0]

    def find(self):
        return [k for (k,) in self.db.execute(self._sql("key")).fetchall()]

    def to_arrow(self):
        import pyarrow.parquet as pq

        return pq.read_table(self.path)


class Polars(Columnar):
    """polars, the records as a DataFrame in memory (built from the Arrow
    table): ``filter`` then ``height`` / the ``key`` column."""

    name = "polars"
    requires = ("polars", "pyarrow")
    workloads = "k"

    def build(self):
        import polars as pl

        self.df = pl.from_arrow(arrow_table(self.n))

    def _hits(self) -> Any:
        import polars as pl

        return self.df.filter((pl.col("temperature") > 250) & (pl.col("material") == "Si"))

    def count(self):
        return self._hits().height

    def find(self):
        return self._hits().get_column("key").to_list()

    def first_count(self):
        raise NotImplementedError("in memory: nothing to open")

    def to_arrow(self):
        raise NotImplementedError("in memory already")

    def disk(self):
        raise NotImplementedError("in memory")


class Sqlite(Columnar):
    """SQLite, one table: the metadata as JSON text (``json_extract``) and,
    for (l), the array as a BLOB; one transaction, ``synchronous=FULL``,
    the default rollback journal (``journal_mode=DELETE``)."""

    name = "SQLite"

    @property
    def path(self) -> Path:
        return self.root / "records.sqlite"

    def build(self):
        self.root.mkdir(parents=True)
        db = sqlite3.connect(self.path)
        db.execute("pragma synchronous=FULL")
        if self.small:
            db.execute("create table records (key text primary key, meta text, x blob)")
            rows: Any = (
                (k, json_text(m), small_array(i).tobytes())
                for i, (k, m) in enumerate(metas(self.n))
            )
            sql = "insert into records values (?, ?, ?)"
        else:
            db.execute("create table records (key text primary key, meta text)")
            rows = ((k, json_text(m)) for k, m in metas(self.n))
            sql = "insert into records values (?, ?)"
        with db:
            db.executemany(sql, rows)
        db.close()

    def open(self):
        self.db = sqlite3.connect(self.path)

    def close(self):
        self.db.close()

    def count(self):
        return self.db.execute(f"select count(*) from records where {JSON_WHERE}").fetchone()[0]

    def find(self):
        return [k for (k,) in self.db.execute(f"select key from records where {JSON_WHERE}")]

    def arrays(self):
        # every row in one query: the fastest way SQLite hands out all blobs
        return [
            np.frombuffer(b, dtype=np.float64)
            for (b,) in self.db.execute("select x from records order by key")
        ]


class Lance(Columnar):
    """Lance (pylance): ``lance.write_dataset`` of the Arrow table (for (l)
    with ``x`` a ``fixed_size_list<float64, 64>`` column), made durable with
    ``syncfs``; ``count_rows(filter=...)``, ``to_table(filter=...,
    columns=["key"])``."""

    name = "Lance"
    requires = ("lance", "pyarrow")

    def build(self):
        import lance

        lance.write_dataset(arrow_table(self.n, self.small), self.root, mode="create")
        syncfs(self.root)

    def open(self):
        import lance

        self.ds = lance.dataset(self.root)

    def close(self):
        del self.ds

    def count(self):
        return self.ds.count_rows(filter=SQL_WHERE)

    def find(self):
        return self.ds.to_table(filter=SQL_WHERE, columns=["key"]).column("key").to_pylist()

    def to_arrow(self):
        return self.ds.to_table()

    def arrays(self):
        x = self.ds.to_table(columns=["x"]).column("x").combine_chunks()
        return list(x.values.to_numpy().reshape(-1, ARRAY_LEN))


ALL: tuple[type[Columnar], ...] = (LazyVaultColumnar, ParquetDuckDB, Polars, Sqlite, Lance)


# -- (k) metadata scan -----------------------------------------------------------------


def _order(names: list[str], turn: int) -> list[str]:
    k = turn % len(names)
    return names[k:] + names[:k]


def _build(ctx: Context, cls: type[Columnar], n: int, small: bool) -> tuple[Columnar, Row]:
    """Builds ``cls``'s copy of the data (or reuses lazyvault's cached scan
    store) and the row of its build time."""
    dataset = f"{'small' if small else 'scan'}-{n}"
    case = f"write {n:,} records" + (" (5 fields + 64 float64)" if small else " (5 fields)")
    root = ctx.root(cls.name, dataset)
    cached = ctx.scan_cache is not None and cls is LazyVaultColumnar and not small
    if cached:
        ctx.scan_cache.mkdir(parents=True, exist_ok=True)
        root = ctx.scan_cache / f"lazyvault-scan-{n}"
        marker = root.with_name(root.name + ".done")
        if marker.exists() and marker.read_text() == _fingerprint():
            ctx.log(f"  {case}: {cls.name} (reused {root})")
            return cls(root, n, small), Row(
                "k", case, cls.name, None, skipped=f"reused from --scan-cache {root}"
            )
        shutil.rmtree(root, ignore_errors=True)
        marker.unlink(missing_ok=True)
    s = cls(root, n, small)
    ctx.log(f"  {case}: {cls.name}")
    t0 = time.perf_counter()
    s.build()
    seconds = time.perf_counter() - t0
    if cached:
        marker.write_text(_fingerprint())
    workload = "l" if small else "k"
    extra = {"how": "in memory, from the Arrow table"} if cls is Polars else {}
    return s, Row(workload, case, cls.name, seconds, extra=extra)


def _systems(ctx: Context, workload: str) -> dict[str, type[Columnar]]:
    return {name: cls for name, cls in ctx.columnar.items() if workload in cls.workloads}


def metadata_scan(ctx: Context) -> list[Row]:
    """(k): build every system's copy of ``ctx.scan_n`` records, then count,
    find, first count after open, and Arrow out."""
    n = ctx.scan_n
    chosen = _systems(ctx, "k")
    names = list(chosen)
    expected = expected_keys(n)
    rows: list[Row] = []
    built: dict[str, Columnar] = {}
    columns(n)  # generated once, before any system's build is timed
    for name in names:
        s, row = _build(ctx, chosen[name], n, small=False)
        built[name] = s
        rows.append(row)

    cases: list[tuple[str, Callable[[Columnar], Any]]] = [
        (f"count of a 2-field predicate over {n:,} records", lambda s: s.count()),
        (f"find (keys) of a 2-field predicate over {n:,} records", lambda s: s.find()),
    ]
    for turn, (case, fn) in enumerate(cases):
        for name in _order(names, turn):
            s = built[name]
            s.open()
            try:
                got = fn(s)
                ok = got == len(expected) if isinstance(got, int) else sorted(got) == list(expected)
                assert ok, f"{name}: {case}: wrong answer"
                seconds = timed(lambda s=s, fn=fn: fn(s), ctx.repeat * 2)
            finally:
                s.close()
            extra = {"hits": len(expected)}
            rows.append(Row("k", case, name, seconds, extra=extra))
            if case.startswith("find (keys)") and isinstance(s, LazyVaultColumnar):
                rows.append(_find_results(ctx, s, n, expected))

    case = f"first count after open, {n:,} records"
    for name in _order(names, 2):
        s = built[name]
        try:
            samples = [s.first_count() for _ in range(ctx.repeat)]
        except NotImplementedError as e:
            rows.append(Row("k", case, name, None, skipped=str(e)))
            continue
        assert all(c == len(expected) for _, _, c in samples), name
        opens = sorted(o for o, _, _ in samples)
        firsts = sorted(f for _, f, _ in samples)
        extra = {"open": f"{opens[len(opens) // 2] * 1e3:.3g} ms"}
        rows.append(Row("k", case, name, firsts[len(firsts) // 2], extra=extra))

    case = f"all {n:,} records as an Arrow table"
    for name in _order(names, 3):
        s = built[name]
        s.open()
        try:
            try:
                table = s.to_arrow()
            except NotImplementedError as e:
                rows.append(Row("k", case, name, None, skipped=str(e)))
                continue
            assert table.num_rows == n, f"{name}: {table.num_rows} rows"
            seconds = timed(s.to_arrow, ctx.repeat)
            how = {
                "lazyvault": "store.to_arrow()",
                "DuckDB+Parquet": "pyarrow.parquet.read_table",
                "Lance": "ds.to_table()",
            }.get(name)
            rows.append(Row("k", case, name, seconds, extra={"via": how} if how else {}))
        finally:
            s.close()
    rows += _disk(built, "k", n, 0)
    for name, s in built.items():
        if ctx.scan_cache is None or name != "lazyvault":
            _remove(s)
    return rows


def _find_results(ctx: Context, s: LazyVaultColumnar, n: int, expected: tuple[str, ...]) -> Row:
    """lazyvault's ``find`` as it returns: ``store.find(QUERY)``, the ``Results`` holding the
    keys packed (no ``str`` made, no list); its keys checked once, outside the timing."""
    case = f"find (Results) of a 2-field predicate over {n:,} records"
    s.open()
    try:
        assert sorted(s.find_results().keys()) == list(expected), f"lazyvault: {case}: wrong answer"
        seconds = timed(s.find_results, ctx.repeat * 2)
    finally:
        s.close()
    extra = {"hits": len(expected), "how": "store.find(QUERY): Results, keys packed in Rust"}
    return Row("k", case, "lazyvault", seconds, extra=extra)


def _disk(built: dict[str, Columnar], workload: str, n: int, array_bytes: int) -> list[Row]:
    """Blocks used by each system's copy of the records."""
    rows = []
    for name, s in built.items():
        case = f"disk of {n:,} records"
        try:
            used = s.disk()
        except NotImplementedError as e:
            rows.append(Row(workload, case, name, None, unit="B", skipped=str(e)))
            continue
        extra = {"array bytes": array_bytes} if array_bytes else {}
        rows.append(Row(workload, case, name, used, unit="B", extra=extra))
    return rows


def _remove(s: Columnar) -> None:
    if s.root.exists():
        shutil.rmtree(s.root, ignore_errors=True)


# -- (l) small records ----------------------------------------------------------------


def small_records(ctx: Context) -> list[Row]:
    """(l): ``ctx.small_n`` records with one 64-float array each: write
    (durable), disk blocks used, read the array of every record."""
    n = ctx.small_n
    chosen = _systems(ctx, "l")
    names = list(chosen)
    rows: list[Row] = []
    built: dict[str, Columnar] = {}
    columns(n)
    for name in _order(names, 4):
        s, row = _build(ctx, chosen[name], n, small=True)
        if name == "SQLite":
            row.extra["mode"] = "journal_mode=DELETE, synchronous=FULL, one transaction"
        built[name] = s
        rows.append(row)
    rows += _disk({name: built[name] for name in names}, "l", n, n * ARRAY_LEN * 8)
    expected = small_arrays(n)
    case = f"read the array of each of {n:,} records"
    for name in _order(names, 5):
        s = built[name]
        s.open()
        try:
            got = s.arrays()
            assert len(got) == n and np.array_equal(np.stack(got), expected), name
            del got
            seconds = timed(s.arrays, ctx.repeat)
        finally:
            s.close()
        rows.append(Row("l", case, name, seconds))
    for s in built.values():
        _remove(s)
    return rows


# -- limits and targets -----------------------------------------------------------------


def physical(ctx: Context, limits: dict[str, float]) -> dict[str, str]:
    """The physical limit of each kind of measurement of (k) and (l), as text."""
    from report import fmt  # report imports this module

    # two columns: float64 temperature + a 4-byte dictionary code
    scan = ctx.scan_n * 12 / limits["sum"]
    # key (~16 B with its offset) + 8 + 4 + 8 + 1 + 8 bytes a record, copied once
    copy = ctx.scan_n * 45 / limits["memcpy"]
    # the array plus ~100 B of metadata a record, written durably
    write = ctx.small_n * (ARRAY_LEN * 8 + 100) / limits["write"]
    arrays = ctx.small_n * ARRAY_LEN * 8
    return {
        "scan": f"2 columns (12 B/record) at `.sum()` bandwidth: {fmt(scan, 's')}",
        "arrow": f"zero-copy ~0; one memcpy of ~45 B/record: {fmt(copy, 's')}",
        "write": f"~612 B/record at write+fsync bandwidth: {fmt(write, 's')}",
        "disk": f"the array bytes: {fmt(arrays, 'B')}",
        "read": f"the array bytes at memcpy bandwidth: {fmt(arrays / limits['memcpy'], 's')}",
    }


def limit_note(row: Row, limits: dict[str, float], ctx: Context) -> str | None:
    """lazyvault's result against the physical limit that binds it."""
    if row.value is None:
        return None
    text = physical(ctx, limits)
    if row.workload == "k" and row.case.startswith(("count", "find", "first")):
        return "limit: " + text["scan"]
    if row.workload == "k" and row.case.startswith("all"):
        return "limit: " + text["arrow"]
    if row.workload == "k" and row.case.startswith("disk"):
        return f"{row.value / ctx.scan_n:,.0f} B/record"
    if row.workload == "l" and row.case.startswith("write"):
        return "limit: " + text["write"]
    if row.workload == "l" and row.case.startswith("disk"):
        return f"{row.value / (ctx.small_n * ARRAY_LEN * 8):.2g}x the array bytes"
    if row.workload == "l" and row.case.startswith("read"):
        return "limit: " + text["read"]
    return None


BASELINE = Path(__file__).resolve().parent / "baseline15.json"

# (workload, case prefix, metric key of the baseline file); "find" is ``find(QUERY).keys()``
# (a list of str), what main measured at the baseline's commit, whose find returned a list
BASELINE_CASES = {
    "count": ("k", "count of"),
    "find": ("k", "find (keys)"),
    "find results": ("k", "find (Results)"),
    "first count": ("k", "first count"),
    "write small": ("l", "write"),
    "read small": ("l", "read the array"),
    "disk small": ("l", "disk"),
}


def _lv(rows: list[Row], workload: str, prefix: str, system: str = "lazyvault") -> Row | None:
    return next(
        (
            r
            for r in rows
            if r.workload == workload
            and r.case.startswith(prefix)
            and r.system == system
            and r.value is not None
        ),
        None,
    )


def baseline_of(rows: list[Row], ctx: Context, commit: str) -> dict[str, Any]:
    """lazyvault's numbers of this run, as the baseline file stores them."""
    out: dict[str, Any] = {"commit": commit, "scan_n": ctx.scan_n, "small_n": ctx.small_n}
    for key, (w, prefix) in BASELINE_CASES.items():
        row = _lv(rows, w, prefix)
        if row is not None:
            out[key] = row.value
    return out


def targets(rows: list[Row], ctx: Context, limits: dict[str, float]) -> str:
    """Issue 15's targets as measured in this run, each with the physical
    limit that binds it (a target counts only at --scan-n 1000000 and
    --small-n 100000)."""
    from report import fmt  # report imports this module

    base = json.loads(BASELINE.read_text()) if BASELINE.exists() else {}
    text = physical(ctx, limits)
    out = ["| target | measured | goal | met | physical limit |", "|---|---|---|---|---|"]
    kind = "scan"

    def add(what: str, measured: str, goal: str, met: bool | None) -> None:
        flag = "-" if met is None else ("yes" if met else "**no**")
        out.append(f"| {what} | {measured} | {goal} | {flag} | {text[kind]} |")

    full_k, full_l = ctx.scan_n >= 1_000_000, ctx.small_n >= 100_000
    size_k = "" if full_k else f" (at {ctx.scan_n:,}: not the target's 1M)"
    size_l = "" if full_l else f" (at {ctx.small_n:,}: not the target's 100k)"
    for op, prefix in (("count", "count of"), ("find", "find (keys)")):
        lv_row = _lv(rows, "k", prefix)
        duck = _lv(rows, "k", prefix, "DuckDB+Parquet")
        what = f"{op} of the 2-field predicate <= DuckDB over Parquet{size_k}"
        if lv_row and duck:
            r = lv_row.value / duck.value
            add(what, f"{r:.3g}", "<= 1", r <= 1 if full_k else None)
        else:
            add(what, "not measured", "<= 1", None)
        commit = base.get("commit", "?")
        at_size = op in base and base.get("scan_n") == ctx.scan_n
        if op == "find":
            # the target: what find returns now (Results, keys packed) against what find
            # returned then plus the list the baseline made of it (`find(QUERY).keys()`)
            results = _lv(rows, "k", "find (Results)")
            what = (
                f"find: >= 100x faster than main at {commit} (`store.find(QUERY)`, the Results "
                f"with keys packed in Rust, against the baseline's `find(QUERY).keys()`){size_k}"
            )
            if results and at_size:
                r = results.value / base[op]
                add(what, f"{r:.3g} (baseline {fmt(base[op], 's')})", "<= 0.01", r <= 0.01)
            else:
                add(what, "no baseline at this size", "<= 0.01", None)
            what = (
                f"find as a list (`find(QUERY).keys()`, as the baseline measured) against main "
                f"at {commit}, for comparison{size_k}"
            )
        else:
            what = f"{op}: >= 100x faster than main at {commit}{size_k}"
        if lv_row and at_size:
            r = lv_row.value / base[op]
            met = r <= 0.01 if op != "find" else None
            goal = "<= 0.01" if op != "find" else "-"
            add(what, f"{r:.3g} (baseline {fmt(base[op], 's')})", goal, met)
        else:
            add(what, "no baseline at this size", "<= 0.01" if op != "find" else "-", None)
    first, warm = _lv(rows, "k", "first count"), _lv(rows, "k", "count of")
    what = f"first count after open within 2x of later ones{size_k}"
    if first and warm:
        r = first.value / warm.value
        add(what, f"{r:.3g}", "<= 2", r <= 2 if full_k else None)
    else:
        add(what, "not measured", "<= 2", None)
    kind = "arrow"
    arrow = _lv(rows, "k", "all ")
    what = f"to_arrow() of 1M records{size_k}"
    if arrow:
        met = arrow.value <= 0.05 if full_k else None
        add(what, f"{arrow.value * 1e3:.3g} ms", "<= 50 ms", met)
    else:
        add(what, "not measured (no Store.to_arrow in this build)", "<= 50 ms", None)
    for what, prefix, goal in (
        ("write 100k small records within 3x of SQLite (FULL, one txn)", "write", 3.0),
        ("disk of 100k small records within 2x of SQLite's file", "disk", 2.0),
    ):
        kind = prefix
        lv_row, sq = _lv(rows, "l", prefix), _lv(rows, "l", prefix, "SQLite")
        if lv_row and sq:
            r = lv_row.value / sq.value
            add(what + size_l, f"{r:.3g}", f"<= {goal:g}", r <= goal if full_l else None)
        else:
            add(what + size_l, "not measured", f"<= {goal:g}", None)
    kind = "read"
    read = _lv(rows, "l", "read the array")
    what = f"read one array of each small record >= 3x faster than main{size_l}"
    if read and "read small" in base and base.get("small_n") == ctx.small_n:
        r = read.value / base["read small"]
        measured = f"{r:.3g} (baseline {fmt(base['read small'], 's')})"
        add(what, measured, "<= 0.333", r <= 1 / 3)
    else:
        add(what, "no baseline at this size", "<= 0.333", None)
    return "\n".join(out)


ALL_WORKLOADS = {"k": [metadata_scan], "l": [small_records]}
