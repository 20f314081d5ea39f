"""One adapter per system: the same operations, each done the way a user of
that system would do it.

Every adapter stores objects under its own ``root`` directory and offers:

- ``write(objects)``: store ``(key, meta, arrays)`` objects and make them
  durable (see ``syncfs``): the same durability for every system;
- ``open()`` / ``close()``: what a new process does before reading;
- ``meta(key)``: the metadata dict of one object;
- ``scan()``: the keys whose metadata match ``data.QUERY``, in key order;
- ``array(key, name)``: one array, lazily where the system can (a memory
  map, an h5py/zarr handle); ``touch`` reads every byte of it;
- ``replace_array(key, name, value)``: replace one array of an object,
  durably;
- ``picklable(key)``: the object as the system hands it to a user, to be
  pickled with protocol 5;
- ``show(key)``: what a notebook prints for the object (``repr``).

``lazy`` says whether arrays are memory maps of the stored file, so that
reader processes share page-cache pages (workload g).
"""

from __future__ import annotations

import ctypes
import importlib.util
import itertools
import json
import os
import pickle
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from data import QUERY, SQL_WHERE, matches

import lazyvault as lv

_libc = ctypes.CDLL(None, use_errno=True)


def syncfs(path: Path) -> None:
    """Makes every file written on ``path``'s filesystem durable: one
    ``syncfs(2)`` barrier, the cheapest correct way for a system without a
    durability protocol of its own to make a batch of files durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if _libc.syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), str(path))
    finally:
        os.close(fd)


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def touch(a: Any) -> float:
    """Reads every byte of an array: ``.sum()`` of all of it (``a[:]`` is a
    view of a memory map, a read for h5py, zarr and safetensors slices)."""
    return float(np.asarray(a[:]).sum())


class System:
    name = ""
    requires: tuple[str, ...] = ()
    lazy = False
    # datasets ("small-N", "big", "many") the system cannot hold, with why
    cannot: ClassVar[dict[str, str]] = {}

    def __init__(self, root: Path) -> None:
        self.root = root

    @classmethod
    def missing(cls) -> str | None:
        """Why this system cannot run here, or None."""
        absent = [m for m in cls.requires if importlib.util.find_spec(m) is None]
        if absent:
            return f"not installed: {', '.join(absent)} (./dev bench installs the peers)"
        return None

    def write(self, objects: Iterable[tuple[str, dict, dict]]) -> None:
        raise NotImplementedError

    def open(self) -> None:
        pass

    def close(self) -> None:
        pass

    def meta(self, key: str) -> dict:
        raise NotImplementedError

    def scan(self) -> list[str]:
        raise NotImplementedError

    def array(self, key: str, name: str) -> Any:
        raise NotImplementedError

    def array_names(self, key: str) -> list[str]:
        raise NotImplementedError

    def arrays(self, key: str) -> Any:
        """All arrays of one object as the system hands them out at once
        (an object supporting ``[name]``): a dict loaded once, or a lazy
        handle (h5py/zarr group, safetensors file, lazyvault record)."""
        return {n: self.array(key, n) for n in self.array_names(key)}

    def handoff(self, key: str) -> bytes | None:
        """What another process needs to read ``key`` without opening the
        store (workload g), or None: the reader opens the files itself."""
        return None

    def replace_array(self, key: str, name: str, value: np.ndarray) -> None:
        raise NotImplementedError

    def picklable(self, key: str) -> Any:
        return {**self.meta(key), **{n: self.array(key, n) for n in self.array_names(key)}}

    def show(self, key: str) -> str:
        return repr(self.picklable(key))


class LazyVault(System):
    """lazyvault: ``store.update(...)``, ``flush()``; reads through records."""

    name = "lazyvault"
    lazy = True

    def write(self, objects):
        with lv.Store.open(self.root, "w") as store:
            store.update(((k, {**m, **a}) for k, m, a in objects), progress=False)
            store.flush()

    def open(self):
        self.store = lv.Store.open(self.root)

    def close(self):
        self.store.close()

    def meta(self, key):
        return self.store[key].meta

    def scan(self):
        return self.store.keys(QUERY)

    def array(self, key, name):
        return getattr(self.store[key], name)

    def array_names(self, key):
        return list(self.store[key].arrays)

    def arrays(self, key):
        return _Attributes(self.store[key])

    def handoff(self, key):
        # one process holds a store: others get a reference to the record
        # (Record.ref) and map the same payload files (the designed way)
        return pickle.dumps(self.store[key].ref())

    def replace_array(self, key, name, value):
        self.store.replace_arrays(key, {name: value})
        self.store.flush()

    def picklable(self, key):
        return self.store[key]

    def show(self, key):
        return repr(self.store[key])


class _Getter:
    """``[name]`` through a function (safetensors' ``get_tensor``)."""

    def __init__(self, get: Any) -> None:
        self.get = get

    def __getitem__(self, name: str) -> Any:
        return self.get(name)


class _Attributes:
    """``[name]`` of an object's attributes (a lazyvault record's arrays)."""

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __getitem__(self, name: str) -> Any:
        return getattr(self.obj, name)


class _FilesPerArray(System):
    """Arrays as one ``.npy`` per array under ``files/<key>/``, read with
    ``np.load(mmap_mode="r")``: shared by the numpy and SQLite systems."""

    lazy = True

    def _dir(self, key: str) -> Path:
        return self.root / "files" / key

    def _save_arrays(self, key: str, arrays: dict) -> None:
        d = self._dir(key)
        d.mkdir(parents=True, exist_ok=True)
        for name, a in arrays.items():
            np.save(d / f"{name}.npy", a)

    def array(self, key, name):
        return np.load(self._dir(key) / f"{name}.npy", mmap_mode="r")

    def array_names(self, key):
        return sorted(p.name[:-4] for p in os.scandir(self._dir(key)) if p.name.endswith(".npy"))

    def replace_array(self, key, name, value):
        path = self._dir(key) / f"{name}.npy"
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            np.save(f, value)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_path(path.parent)


class NumpyFiles(_FilesPerArray):
    """numpy: ``files/<key>/meta.json`` and one ``np.save`` file per array."""

    name = "numpy .npy"

    def write(self, objects):
        for key, meta, arrays in objects:
            self._save_arrays(key, arrays)
            (self._dir(key) / "meta.json").write_text(json.dumps(meta))
        syncfs(self.root)

    def meta(self, key):
        return json.loads((self._dir(key) / "meta.json").read_bytes())

    def scan(self):
        keys = sorted(os.listdir(self.root / "files"))
        return [k for k in keys if matches(self.meta(k))]


class SqliteFiles(_FilesPerArray):
    """SQLite (metadata as JSON text, ``json_extract``) plus one ``.npy``
    per array; one transaction, ``synchronous=FULL``."""

    name = "SQLite+npy"

    def write(self, objects):
        self.root.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.root / "index.sqlite")
        db.execute("pragma synchronous=FULL")
        db.execute("create table objects (key text primary key, meta text not null)")
        rows = []
        for key, meta, arrays in objects:
            self._save_arrays(key, arrays)
            rows.append((key, json.dumps(meta)))
        syncfs(self.root)  # the files are durable before the rows naming them
        with db:
            db.executemany("insert into objects values (?, ?)", rows)
        db.close()

    def open(self):
        self.db = sqlite3.connect(self.root / "index.sqlite")

    def close(self):
        self.db.close()

    def meta(self, key):
        (text,) = self.db.execute("select meta from objects where key = ?", (key,)).fetchone()
        return json.loads(text)

    def scan(self):
        sql = f"select key from objects where {SQL_WHERE} order by key"
        return [k for (k,) in self.db.execute(sql)]


class Npz(System):
    """numpy ``.npz``: one ``np.savez`` file per object, metadata as a JSON
    string member ``__meta__``; ``np.load`` reads a member on access."""

    name = "numpy .npz"

    def _path(self, key: str) -> Path:
        return self.root / f"{key}.npz"

    def write(self, objects):
        self.root.mkdir(parents=True, exist_ok=True)
        for key, meta, arrays in objects:
            np.savez(self._path(key), __meta__=np.array(json.dumps(meta)), **arrays)
        syncfs(self.root)

    def meta(self, key):
        with np.load(self._path(key)) as z:
            return json.loads(z["__meta__"][()])

    def scan(self):
        keys = sorted(p[:-4] for p in os.listdir(self.root))
        return [k for k in keys if matches(self.meta(k))]

    def array(self, key, name):
        with np.load(self._path(key)) as z:
            return z[name]

    def array_names(self, key):
        with np.load(self._path(key)) as z:
            return [n for n in z.files if n != "__meta__"]

    def arrays(self, key):
        return np.load(self._path(key))  # NpzFile: reads a member on access

    def replace_array(self, key, name, value):
        with np.load(self._path(key)) as z:
            members = {n: z[n] for n in z.files}
        members[name] = value
        tmp = self.root / f"{key}.tmp.npz"
        np.savez(tmp, **members)
        fsync_path(tmp)
        os.replace(tmp, self._path(key))
        fsync_path(self.root)


class PickleFiles(System):
    """A directory of pickles: ``<key>.pkl`` (metadata) and
    ``<key>.arrays.pkl`` (the arrays, protocol 5)."""

    name = "pickle files"

    def write(self, objects):
        self.root.mkdir(parents=True, exist_ok=True)
        for key, meta, arrays in objects:
            (self.root / f"{key}.pkl").write_bytes(pickle.dumps(meta, protocol=5))
            with open(self.root / f"{key}.arrays.pkl", "wb") as f:
                pickle.dump(arrays, f, protocol=5)
        syncfs(self.root)

    def meta(self, key):
        return pickle.loads((self.root / f"{key}.pkl").read_bytes())

    def scan(self):
        keys = sorted(p[:-4] for p in os.listdir(self.root) if not p.endswith(".arrays.pkl"))
        return [k for k in keys if matches(self.meta(k))]

    def _arrays(self, key: str) -> dict:
        with open(self.root / f"{key}.arrays.pkl", "rb") as f:
            return pickle.load(f)

    def array(self, key, name):
        return self._arrays(key)[name]

    def array_names(self, key):
        return list(self._arrays(key))

    def arrays(self, key):
        return self._arrays(key)

    def replace_array(self, key, name, value):
        arrays = self._arrays(key)
        arrays[name] = value
        path = self.root / f"{key}.arrays.pkl"
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            pickle.dump(arrays, f, protocol=5)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_path(self.root)


class Joblib(System):
    """joblib: one ``joblib.dump`` of ``{"meta", "arrays"}`` per object,
    read with ``joblib.load(mmap_mode="r")``."""

    name = "joblib"
    requires = ("joblib",)
    lazy = True

    def _path(self, key: str) -> Path:
        return self.root / f"{key}.joblib"

    def write(self, objects):
        import joblib

        self.root.mkdir(parents=True, exist_ok=True)
        for key, meta, arrays in objects:
            joblib.dump({"meta": meta, "arrays": arrays}, self._path(key))
        syncfs(self.root)

    def _load(self, key: str) -> dict:
        import joblib

        return joblib.load(self._path(key), mmap_mode="r")

    def meta(self, key):
        return self._load(key)["meta"]

    def scan(self):
        keys = sorted(p[:-7] for p in os.listdir(self.root))
        return [k for k in keys if matches(self.meta(k))]

    def array(self, key, name):
        return self._load(key)["arrays"][name]

    def array_names(self, key):
        return list(self._load(key)["arrays"])

    def arrays(self, key):
        return self._load(key)["arrays"]

    def replace_array(self, key, name, value):
        import joblib

        obj = self._load(key)
        obj["arrays"][name] = value
        tmp = self.root / f"{key}.tmp"
        joblib.dump(obj, tmp)  # not over the mapped file (SIGBUS)
        fsync_path(tmp)
        os.replace(tmp, self._path(key))
        fsync_path(self.root)


class Safetensors(System):
    """safetensors: one file per object, metadata as JSON in the header's
    ``__metadata__``; ``safe_open(framework="numpy")`` reads on access."""

    name = "safetensors"
    requires = ("safetensors",)

    def _path(self, key: str) -> Path:
        return self.root / f"{key}.safetensors"

    def write(self, objects):
        from safetensors.numpy import save_file

        self.root.mkdir(parents=True, exist_ok=True)
        for key, meta, arrays in objects:
            save_file(arrays, self._path(key), metadata={"meta": json.dumps(meta)})
        syncfs(self.root)

    def meta(self, key):
        from safetensors import safe_open

        with safe_open(self._path(key), framework="numpy") as f:
            return json.loads(f.metadata()["meta"])

    def scan(self):
        keys = sorted(p[:-12] for p in os.listdir(self.root))
        return [k for k in keys if matches(self.meta(k))]

    def array(self, key, name):
        from safetensors import safe_open

        with safe_open(self._path(key), framework="numpy") as f:
            return f.get_slice(name)

    def array_names(self, key):
        from safetensors import safe_open

        with safe_open(self._path(key), framework="numpy") as f:
            return list(f.keys())

    def arrays(self, key):
        from safetensors import safe_open

        f = safe_open(self._path(key), framework="numpy")
        return _Getter(f.get_tensor)

    def replace_array(self, key, name, value):
        from safetensors.numpy import load_file, save_file

        arrays = load_file(self._path(key))
        arrays[name] = value
        tmp = self.root / f"{key}.tmp"
        save_file(arrays, tmp, metadata={"meta": json.dumps(self.meta(key))})
        fsync_path(tmp)
        os.replace(tmp, self._path(key))
        fsync_path(self.root)

    def picklable(self, key):
        from safetensors.numpy import load_file

        return {**self.meta(key), **load_file(self._path(key))}


class H5py(System):
    """h5py: one HDF5 file, a group per object with the metadata as a JSON
    attribute and one contiguous dataset per array."""

    name = "h5py"
    requires = ("h5py",)

    def write(self, objects):
        import h5py

        self.root.mkdir(parents=True, exist_ok=True)
        with h5py.File(self.root / "store.h5", "w") as f:
            for key, meta, arrays in objects:
                g = f.create_group(key)
                g.attrs["meta"] = json.dumps(meta)
                for name, a in arrays.items():
                    g.create_dataset(name, data=a)
        syncfs(self.root)

    def open(self):
        import h5py

        self.file = h5py.File(self.root / "store.h5", "r")

    def close(self):
        self.file.close()

    def meta(self, key):
        return json.loads(self.file[key].attrs["meta"])

    def scan(self):
        return [k for k in sorted(self.file) if matches(self.meta(k))]

    def array(self, key, name):
        return self.file[key][name]

    def array_names(self, key):
        return list(self.file[key])

    def arrays(self, key):
        return self.file[key]

    def replace_array(self, key, name, value):
        import h5py

        self.file.close()
        with h5py.File(self.root / "store.h5", "r+") as f:
            del f[key][name]
            f[key].create_dataset(name, data=value)
        fsync_path(self.root / "store.h5")
        self.open()

    def picklable(self, key):
        g = self.file[key]
        return {**self.meta(key), **{n: g[n][()] for n in g}}

    def show(self, key):
        g = self.file[key]
        return repr({**self.meta(key), **{n: g[n] for n in g}})


class Zarr(System):
    """zarr (v3, its defaults: zstd-compressed chunks): one group store, a
    group per object with the metadata in its attributes."""

    name = "zarr"
    requires = ("zarr",)

    def write(self, objects):
        import zarr

        root = zarr.open_group(self.root, mode="w")
        for key, meta, arrays in objects:
            g = root.create_group(key, attributes={"meta": meta})
            for name, a in arrays.items():
                g.create_array(name, data=a)
        syncfs(self.root)

    def open(self):
        import zarr

        self.group = zarr.open_group(self.root, mode="r")

    def meta(self, key):
        return self.group[key].attrs["meta"]

    def scan(self):
        keys = sorted(self.group.group_keys())
        return [k for k in keys if matches(self.meta(k))]

    def array(self, key, name):
        return self.group[key][name]

    def array_names(self, key):
        return sorted(self.group[key].array_keys())

    def arrays(self, key):
        return self.group[key]

    def replace_array(self, key, name, value):
        import zarr

        g = zarr.open_group(self.root / key, mode="r+")
        g.create_array(name, data=value, overwrite=True)
        syncfs(self.root)

    def picklable(self, key):
        g = self.group[key]
        return {**self.meta(key), **{n: g[n] for n in g.array_keys()}}


LANCE_WHERE = "temperature > 399.0 and material = 'Si'"  # data.QUERY in Lance's SQL


class _BlobArray:
    """A Lance blob holding an array's raw bytes, read on indexing: ``a[i:j]``
    (rows of axis 0) reads those rows with one ``read_range``, ``a[:]`` all."""

    def __init__(self, blob: Any, dtype: str, shape: list[int]) -> None:
        self.blob, self.dtype, self.shape = blob, np.dtype(dtype), tuple(shape)

    def __getitem__(self, index: Any) -> np.ndarray:
        rest: tuple = ()
        if isinstance(index, tuple):
            index, rest = index[0], index[1:]
        if not self.shape:  # 0-d
            a = np.frombuffer(self.blob.read_range(0, self.dtype.itemsize), self.dtype)
            return a.reshape(())[(index, *rest)]
        single = isinstance(index, (int, np.integer))
        rows = slice(int(index), int(index) + 1) if single else index
        start, stop, step = rows.indices(self.shape[0])
        if step != 1:
            raise IndexError("only contiguous row slices")
        row_bytes = self.dtype.itemsize * int(np.prod(self.shape[1:], dtype=np.int64))
        stop = max(stop, start)
        data = self.blob.read_range(start * row_bytes, (stop - start) * row_bytes)
        a = np.frombuffer(data, self.dtype).reshape((stop - start, *self.shape[1:]))
        if single:
            a = a[0]
        return a[rest] if rest else a

    def __repr__(self) -> str:
        return f"<Lance blob {self.dtype} {self.shape}>"


class Lance(System):
    """Lance (pylance): one dataset, a row per object: ``key``, the metadata
    as columns (nested dicts as structs, lists as lists), and each array as a
    blob column (``lance.blob.blob_field``) of its raw bytes, dtype and shape
    in a JSON column ``__arrays__``; a BTREE scalar index on ``key``. Arrays
    are read lazily through ``take_blobs`` (file-like ``BlobFile``s)."""

    name = "Lance"
    requires = ("lance", "pyarrow")
    cannot: ClassVar[dict[str, str]] = {
        "many": "one object of thousands of arrays would be a row of thousands of blob columns"
    }

    @property
    def uri(self) -> Path:
        return self.root / "objects.lance"

    def _batch(self, chunk: list[tuple[str, dict, dict]], schema: Any) -> Any:
        import pyarrow as pa
        from lance.blob import blob_array

        metas = pa.Table.from_pylist([m for _, m, _ in chunk])
        cols: dict[str, Any] = {"key": pa.array([k for k, _, _ in chunk], pa.string())}
        cols.update(zip(metas.column_names, metas.columns, strict=True))
        layout = [
            json.dumps({n: [a.dtype.str, list(a.shape)] for n, a in arrays.items()})
            for _, _, arrays in chunk
        ]
        cols["__arrays__"] = pa.array(layout, pa.string())
        for name in chunk[0][2]:
            cols[name] = blob_array(
                [memoryview(np.ascontiguousarray(a[name])).cast("B") for _, _, a in chunk]
            )
        table = pa.table(cols)
        return table.cast(schema) if schema is not None else table

    def write(self, objects):
        import lance
        import pyarrow as pa

        self.root.mkdir(parents=True, exist_ok=True)
        it = iter(objects)
        first = self._batch(list(itertools.islice(it, 1000)), None)

        def rest():
            yield from first.to_batches()
            while chunk := list(itertools.islice(it, 1000)):
                yield from self._batch(chunk, first.schema).to_batches()

        reader = pa.RecordBatchReader.from_batches(first.schema, rest())
        ds = lance.write_dataset(reader, self.uri, mode="create")
        ds.create_scalar_index("key", "BTREE")
        syncfs(self.root)

    def open(self):
        import lance

        self.ds = lance.dataset(self.uri)
        self.rows: dict[str, int] | None = None
        blobs = {"__arrays__", "key"}
        self.meta_columns = [
            f.name
            for f in self.ds.schema
            if f.name not in blobs and "lance.blob" not in str(f.type) and not _is_blob(f)
        ]

    def close(self):
        del self.ds

    def _where_key(self, key: str) -> str:
        return "key = '" + key.replace("'", "''") + "'"

    def meta(self, key):
        t = self.ds.to_table(filter=self._where_key(key), columns=self.meta_columns)
        return t.to_pylist()[0]

    def scan(self):
        t = self.ds.to_table(filter=LANCE_WHERE, columns=["key"])
        return sorted(t.column("key").to_pylist())

    def _row(self, key: str) -> int:
        if self.rows is None:  # every key's row, read once per open
            keys = self.ds.to_table(columns=["key"]).column("key").to_pylist()
            self.rows = {k: i for i, k in enumerate(keys)}
        return self.rows[key]

    def _layout(self, key: str) -> dict:
        row = self._row(key)
        return json.loads(self.ds.take([row], columns=["__arrays__"]).column(0)[0].as_py())

    def array(self, key, name):
        dtype, shape = self._layout(key)[name]
        (blob,) = self.ds.take_blobs(name, indices=[self._row(key)])
        return _BlobArray(blob, dtype, shape)

    def array_names(self, key):
        return list(self._layout(key))

    def replace_array(self, key, name, value):
        import pyarrow as pa
        from lance.blob import blob_array

        layout = self._layout(key)
        layout[name] = [value.dtype.str, list(value.shape)]
        new = pa.table(
            {
                "key": pa.array([key], pa.string()),
                "__arrays__": pa.array([json.dumps(layout)], pa.string()),
                name: blob_array([memoryview(np.ascontiguousarray(value)).cast("B")]),
            }
        )
        self.ds.merge_insert("key").when_matched_update_all().execute(new)
        syncfs(self.root)
        self.open()

    def picklable(self, key):
        # what a user holds to ship an object: its arrays read into memory
        # (one read each, no further copy: an array over the bytes read)
        arrays = {n: self.array(key, n)[:] for n in self.array_names(key)}
        return {**self.meta(key), **arrays}

    def show(self, key):
        return repr({**self.meta(key), **{n: self.array(key, n) for n in self.array_names(key)}})


def _is_blob(field: Any) -> bool:
    meta = field.metadata or {}
    return any(b"blob" in k for k in meta) or "blob" in str(field.type).lower()


ALL: tuple[type[System], ...] = (
    LazyVault,
    NumpyFiles,
    Npz,
    PickleFiles,
    Joblib,
    Safetensors,
    H5py,
    Zarr,
    SqliteFiles,
    Lance,
)
