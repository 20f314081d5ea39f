"""The MutableMapping API, open modes, keys, errors, locking, format version."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import lazyvault as lv


def test_mapping_api(store: lv.Store) -> None:
    assert isinstance(store, MutableMapping)
    assert len(store) == 0 and list(store) == []
    store["b"] = {"x": 1, "a": np.arange(3)}
    store["a"] = {"x": 2}
    assert len(store) == 2
    assert list(store) == ["a", "b"]  # code point order
    assert list(store.keys()) == ["a", "b"]
    assert "a" in store and "zz" not in store
    assert store.get("zz") is None and store.get("zz", 5) == 5
    assert [k for k, _ in store.items()] == ["a", "b"]
    assert store["a"].x == 2
    store["a"] = {"x": 3}  # overwrite keeps the count
    assert len(store) == 2 and store["a"].x == 3
    del store["a"]
    assert len(store) == 1 and "a" not in store
    with pytest.raises(KeyError):
        del store["a"]
    with pytest.raises(KeyError) as info:
        store["a"]
    assert isinstance(info.value, lv.MissingKeyError)
    assert isinstance(info.value, lv.LazyvaultError)
    store.update({"c": {"y": 1}, "d": {"y": 2}})
    assert store.count() == 3


HOSTILE_KEYS = [
    "../x",
    "../../../../../../tmp/escape",
    "/etc/passwd",
    "a/b",
    "a\\b",
    "\x00",
    "nul\x00inside",
    ".",
    "..",
    "🦀 crab",
    "é" * 300,
    " ",
    "arrays",
    "lazyvault.json",
]


def test_any_nonempty_string_is_a_key_and_none_reaches_a_path(
    store: lv.Store, store_path: Path, tmp_path: Path
) -> None:
    before = sorted(p.name for p in tmp_path.iterdir())
    for i, key in enumerate(HOSTILE_KEYS):
        store[key] = {"i": i, "a": np.full(4, i)}
    store.flush()
    for i, key in enumerate(HOSTILE_KEYS):
        rec = store[key]
        assert rec.key == key and rec.i == i
        assert rec.a.tolist() == [i] * 4
    assert sorted(store) == sorted(HOSTILE_KEYS)
    # nothing was created next to the store, and inside it only our own names
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    allowed_top = {"lazyvault.json", "lazyvault.lock", "index", "arrays", "journal", "checkpoints"}
    assert {p.name for p in store_path.iterdir()} <= allowed_top
    for p in (store_path / "journal").iterdir():  # segments are numbered, never keyed
        assert len(p.name) == 20 and p.name.endswith(".log")
        int(p.name[:16], 16)
    for p in (store_path / "arrays").rglob("*"):
        rel = p.relative_to(store_path / "arrays").parts
        if p.is_file():
            assert len(rel) == 2 and len(rel[1]) == 36 and rel[1][-4:] in (".npy", ".npz")
            assert rel[1][:2] == rel[0]
            int(rel[1][:32], 16)


@pytest.mark.parametrize("key", [1, b"bytes", None, ("t",), 1.5])
def test_non_string_keys_raise_type_error(store: lv.Store, key: object) -> None:
    for op in (
        lambda: store[key],
        lambda: store.__setitem__(key, {}),
        lambda: store.__delitem__(key),
        lambda: key in store,
    ):
        with pytest.raises(TypeError) as info:
            op()
        assert isinstance(info.value, lv.KeyTypeError)


def test_empty_key_raises_value_error(store: lv.Store) -> None:
    for op in (lambda: store[""], lambda: store.__setitem__("", {}), lambda: "" in store):
        with pytest.raises(ValueError) as info:
            op()
        assert isinstance(info.value, lv.InvalidKeyError)


def test_open_modes(tmp_path: Path) -> None:
    path = tmp_path / "m.lv"
    with pytest.raises(lv.StoreNotFoundError) as info:
        lv.Store.open(path, "r")
    assert isinstance(info.value, FileNotFoundError)
    assert not path.exists()
    with lv.Store.open(path, "w") as s:
        s["k"] = {"v": 1}
    with pytest.raises(lv.StoreExistsError) as info2:
        lv.Store.open(path, "w")
    assert isinstance(info2.value, FileExistsError)
    with lv.Store.open(path, "r") as s:
        assert s["k"].v == 1
        assert s.mode == "r"
        with pytest.raises(lv.ReadOnlyError):
            s["k2"] = {}
        with pytest.raises(lv.ReadOnlyError):
            del s["k"]
        assert len(s) == 1
    with pytest.raises(ValueError):
        lv.Store.open(path, "x")  # type: ignore[arg-type]


def test_a_non_store_directory_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "notastore"
    d.mkdir()
    (d / "file.txt").write_text("hello")
    with pytest.raises(lv.NotAStoreError):
        lv.Store.open(d)
    assert sorted(p.name for p in d.iterdir()) == ["file.txt"]
    f = tmp_path / "plainfile"
    f.write_text("x")
    with pytest.raises(lv.NotAStoreError):
        lv.Store.open(f)


def test_empty_directory_becomes_a_store(tmp_path: Path) -> None:
    d = tmp_path / "empty"
    d.mkdir()
    with lv.Store.open(d) as s:
        s["k"] = {"v": 1}
    manifest = json.loads((d / "lazyvault.json").read_text())
    assert manifest["format"] == "lazyvault"
    assert manifest["format_version"] == lv.FORMAT_VERSION


def test_newer_major_format_is_refused_newer_minor_accepted(store_path: Path) -> None:
    with lv.Store.open(store_path) as s:
        s["k"] = {"v": 1}
    manifest_path = store_path / "lazyvault.json"
    manifest = json.loads(manifest_path.read_text())
    major, minor = map(int, manifest["format_version"].split("."))
    manifest["format_version"] = f"{major}.{minor + 3}"
    manifest_path.write_text(json.dumps(manifest))
    with lv.Store.open(store_path, "r") as s:
        assert s["k"].v == 1
    manifest["format_version"] = f"{major + 1}.0"
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(lv.FormatVersionError, match=f"{major + 1}.0"):
        lv.Store.open(store_path)
    manifest_path.write_text("{not json")
    with pytest.raises(lv.LazyvaultError):
        lv.Store.open(store_path)


def test_second_opener_in_this_process_shares_the_writer_role(
    store: lv.Store, store_path: Path
) -> None:
    store["k"] = {"v": 1}
    store.flush()
    again = lv.Store.open(store_path)  # a notebook re-running its cell
    try:
        assert again["k"].v == 1 and not again.is_writer
        again["k2"] = {"v": 2}  # no StoreLockedError: one writer per process
        assert again.is_writer and store.is_writer
        assert store["k2"].v == 2  # written through the same index
        store["k3"] = {"v": 3}
        assert sorted(again) == ["k", "k2", "k3"]
    finally:
        again.close()
    store["k4"] = {"v": 4}  # the first handle still writes after the second closed
    store.flush()
    assert sorted(store) == ["k", "k2", "k3", "k4"]


def test_second_opener_in_another_process_gets_the_holder_pid(
    store: lv.Store, store_path: Path
) -> None:
    store["k"] = {"v": 1}
    store.flush()
    code = (
        "import sys, lazyvault as lv\n"
        "s = lv.Store.open(sys.argv[1])\n"  # opens: a reader until its first write
        "assert s['k'].v == 1 and not s.is_writer\n"
        "try:\n"
        "    s['x'] = {'v': 2}\n"
        "except lv.StoreLockedError as e:\n"
        "    print(e.pid); sys.exit(0)\n"
        "sys.exit(3)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(store_path)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == os.getpid()
    assert "x" not in store


def test_open_close_reopen_loop(store_path: Path) -> None:
    for i in range(50):
        with lv.Store.open(store_path) as s:
            s[f"k{i}"] = {"i": i}
            assert len(s) == i + 1
    with lv.Store.open(store_path, "r") as s:
        assert [s[f"k{i}"].i for i in range(50)] == list(range(50))


def test_closed_store_raises(store_path: Path) -> None:
    s = lv.Store.open(store_path)
    s["k"] = {"v": 1}
    s.close()
    s.close()  # idempotent
    assert s.closed
    with pytest.raises(lv.ClosedError):
        s["k"]
    with pytest.raises(ValueError):
        len(s)
    assert "closed" in repr(s)


def test_error_hierarchy() -> None:
    assert issubclass(lv.QueryError, ValueError)
    assert issubclass(lv.MissingKeyError, KeyError)
    assert issubclass(lv.KeyTypeError, TypeError)
    assert issubclass(lv.StorageError, OSError)
    for name in lv.__all__:
        obj = getattr(lv, name)
        if isinstance(obj, type) and issubclass(obj, BaseException):
            assert issubclass(obj, lv.LazyvaultError), name


def test_zero_itemsize_void_is_stored(store: lv.Store) -> None:
    # numpy writes V0 (no bytes per item) to .npy; so does lazyvault
    store["k"] = {"a": np.zeros((3, 2), dtype="V0")}
    assert store["k"].a.dtype == np.dtype("V0") and store["k"].a.shape == (3, 2)


def test_durable_after_close_in_a_subprocess(store_path: Path) -> None:
    code = (
        "import sys, numpy as np, lazyvault as lv\n"
        "s = lv.Store.open(sys.argv[1])\n"
        "s['k'] = {'v': 7, 'a': np.arange(5)}\n"
        "s.flush()\n"
        "import os; os._exit(0)\n"  # no close, no atexit: flush alone must suffice
    )
    subprocess.run([sys.executable, "-c", code, str(store_path)], check=True, timeout=60)
    with lv.Store.open(store_path, "r") as s:
        assert s["k"].v == 7 and s["k"].a.tolist() == [0, 1, 2, 3, 4]


def test_unclosed_store_is_closed_at_exit(store_path: Path) -> None:
    code = "import sys, lazyvault as lv\ns = lv.Store.open(sys.argv[1])\ns['k'] = {'v': 8}\n"
    subprocess.run([sys.executable, "-c", code, str(store_path)], check=True, timeout=60)
    with lv.Store.open(store_path, "r") as s:
        assert s["k"].v == 8


MISSING_INDEX = r"index directory \S+ is missing; `lazyvault repair"


def test_missing_index_reads_but_refuses_writes_not_recreated_empty(store_path: Path) -> None:
    # An empty new index would make every payload an orphan that gc() deletes.
    import shutil

    with lv.Store.open(store_path) as s:
        s["k"] = {"a": np.arange(3)}
    shutil.rmtree(store_path / "index")
    with lv.Store.open(store_path) as s:  # readers never open the index
        assert list(s) == ["k"] and s["k"].a.tolist() == [0, 1, 2]
        with pytest.raises(lv.CorruptError, match=MISSING_INDEX):
            s["k2"] = {"a": np.arange(2)}
        with pytest.raises(lv.CorruptError, match=MISSING_INDEX):
            s.gc()
        assert list(s) == ["k"] and not s.is_writer
    assert not (store_path / "index").exists()
    assert len(list((store_path / "arrays").glob("*/*.np[yz]"))) == 1


def test_interrupted_creation_can_be_reopened(tmp_path: Path) -> None:
    # a crash between taking the lock and renaming the manifest into place
    d = tmp_path / "half.lv"
    (d / "arrays").mkdir(parents=True)
    (d / "lazyvault.lock").write_text("12345\n")
    (d / "lazyvault.json.tmp").write_text("{")
    with lv.Store.open(d) as s:
        s["k"] = {"v": 1}
    with lv.Store.open(d, "r") as s:
        assert s["k"].v == 1


def test_store_used_in_a_forked_child_raises_and_records_still_work(store: lv.Store) -> None:
    store["k"] = {"v": 1, "a": np.arange(5)}
    rec = store["k"]
    pid = os.fork()
    if pid == 0:  # child: never touch sled; pass records instead
        code = 3
        try:
            try:
                len(store)
                code = 1
            except lv.ForkedStoreError:
                code = 2 if rec.a.tolist() == [0, 1, 2, 3, 4] and rec.v == 1 else 4
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 2
    store["k2"] = {"v": 2}
    store.flush()  # the parent's store is untouched by the child
    assert len(store) == 2


def test_forked_child_exiting_normally_does_not_hang(store_path: Path) -> None:
    # found by a fresh-user trial: the child's exit dropped the Store, whose
    # sled flush waited forever for a flusher thread that fork() did not copy
    code = (
        "import os, sys, lazyvault as lv\n"
        "s = lv.Store.open(sys.argv[1])\n"
        "s['k'] = {'x': 1}\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    sys.exit(0)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print(os.waitstatus_to_exitcode(status))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(store_path)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "0"
    with lv.Store.open(store_path, "r") as s:
        assert s["k"].x == 1


def test_a_forked_child_writing_after_its_parent_wrote_gets_an_error_not_a_hang(
    tmp_path: Path,
) -> None:
    # found by a fresh-user trial: the child's first write waited forever
    # for sled's I/O threads, which the parent started and fork() did not copy
    code = (
        "import os, sys, lazyvault as lv\n"
        "d = sys.argv[1]\n"
        "with lv.Store.open(d + '/a.lv') as s:\n"
        "    s['base'] = {'m': 1}\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    with lv.Store.open(d + '/a.lv', 'r') as r:\n"
        "        assert r['base'].m == 1  # reading works\n"
        "    try:\n"
        "        with lv.Store.open(d + '/b.lv') as s:\n"
        "            s['k'] = {'m': 1}\n"
        "        os._exit(1)\n"
        "    except lv.ForkedStoreError as e:\n"
        "        ok = e.opener_pid == os.getppid() and e.pid == os.getpid() and 'spawn' in str(e)\n"
        "        os._exit(2 if ok else 3)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print(os.waitstatus_to_exitcode(status))\n"
        "with lv.Store.open(d + '/c.lv') as s:  # the parent still writes\n"
        "    s['k'] = {'m': 2}\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "2"
    with lv.Store.open(tmp_path / "c.lv", "r") as s:
        assert s["k"].m == 2


def test_misuse_gives_clear_errors(store: lv.Store, store_path: Path) -> None:
    with pytest.raises(TypeError, match=r"Store\.open"):
        lv.Store(str(store_path))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="allow_pickle"):
        lv.Store.open(store_path.parent / "other.lv", allow_pickle="no")  # type: ignore[arg-type]
    store["k"] = {"v": 1}
    assert store.count(lambda r: r.v == 1) == 1
    with pytest.raises(TypeError):
        list(store["k"])
    with pytest.raises(lv.QueryError):
        store.find("v == '\ud800'")


def test_final_trial_regressions(tmp_path: Path) -> None:
    """Found by the last fresh-user trial."""
    import gc as _gc

    # a store dropped without close() releases its lock at once (no cycle)
    def save() -> None:
        s = lv.Store.open(tmp_path / "u.lv")
        s["k"] = {"v": 1}

    _gc.disable()
    try:
        save()
        with lv.Store.open(tmp_path / "u.lv") as s:
            assert s["k"].v == 1
    finally:
        _gc.enable()
    # a mistyped archive path does not become a directory store
    with pytest.raises(lv.StoreNotFoundError):
        lv.Store.open(tmp_path / "typo.lvz")
    assert not (tmp_path / "typo.lvz").exists()
    # loads checks allow_pickle like Store.open
    with pytest.raises(TypeError):
        lv.loads(lv.dumps({"s": {1}}), allow_pickle="no")  # type: ignore[arg-type]
    # archives are read-only mappings
    with lv.Store.open(tmp_path / "a.lv") as s:
        s["k"] = {"x": np.ones(3)}
        s.export(tmp_path / "out.lvz")
    with lv.Store.open(tmp_path / "out.lvz") as archive:
        with pytest.raises(lv.ReadOnlyError):
            archive["k"] = 1  # type: ignore[index]
        with pytest.raises(lv.ReadOnlyError):
            del archive["k"]  # type: ignore[attr-defined]
    # the CLI verifies an archive without a traceback
    from lazyvault._cli import main

    assert main(["verify", str(tmp_path / "out.lvz")]) == 0


class _Unpicklable:
    def __reduce__(self) -> Any:
        raise pickle.PicklingError("this object refuses to be pickled")


def test_update_is_all_or_nothing_per_chunk(
    store: lv.Store, store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lv.store, "_UPDATE_CHUNK_RECORDS", 2)
    objs: dict[str, Any] = {f"k{i}": {"i": i, "a": np.arange(i + 1)} for i in range(4)}
    objs["k3"] = {"bad": _Unpicklable(), "a": np.arange(2)}
    with pytest.raises(pickle.PicklingError):
        store.update(objs, progress=False)
    # chunk [k0, k1] was written; chunk [k2, k3] failed as a whole
    assert sorted(store) == ["k0", "k1"]
    assert len(list((store_path / "arrays").glob("*/*"))) == 1  # the chunk's pack
    with pytest.raises(lv.InvalidKeyError):
        store.update({"k2": {"i": 2}, "": {"i": 0}}, progress=False)
    assert "k2" not in store


def test_update_writes_many_records_and_arrays_in_chunks(
    store: lv.Store, store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lv.store, "_UPDATE_CHUNK_BYTES", 1000)
    objs = {f"k{i}": {"i": i, "a": np.full(100, i), "b": np.arange(i)} for i in range(30)}
    objs["k7"] = {"i": 70}  # a repeated key: the later value wins, as in dict.update
    store.update(objs, k7={"i": 7, "a": np.full(100, 7)}, progress=False)
    assert len(store) == 30
    assert store["k7"].i == 7 and store["k7"].a.tolist() == [7] * 100
    for i in (0, 1, 29):
        assert store[f"k{i}"].a.tolist() == [i] * 100
        assert store[f"k{i}"].b.tolist() == list(range(i))
    store.flush()
    # small arrays: one pack per chunk, each referenced (no orphan below)
    assert not list((store_path / "arrays").glob("*/*.npy"))
    assert 1 < len(list((store_path / "arrays").glob("*/*.npz"))) <= 30
    report = store.verify()
    assert report["ok"] and report["orphans"] == [], report


def test_update_copies_records_in_order_between_chunks(
    store: lv.Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lv.store, "_UPDATE_CHUNK_RECORDS", 2)
    with lv.Store.open(tmp_path / "other.lv") as other:
        other["r"] = {"v": "copied", "a": np.arange(3)}
        pairs = [("x", {"v": 1}), ("y", other["r"]), ("x", {"v": 2}), ("z", {"v": 3})]
        store.update(pairs, progress=False)
    assert store["x"].v == 2 and store["z"].v == 3
    assert store["y"].v == "copied" and store["y"].a.tolist() == [0, 1, 2]


def test_replace_arrays_writes_only_the_new_arrays(store_path: Path) -> None:
    from conftest import stored_files as payload_files

    store = lv.Store.open(store_path, allow_pickle=True)
    big = np.arange(200_000, dtype=np.float64).reshape(400, 500)  # 1.6 MB: mapped
    obj = {"run": 3, "big": big, "labels": np.arange(4), "nested": {"w": np.ones(3)}, "s": {1}}
    store["k"] = obj
    store.flush()
    before = store["k"]
    held = before.big  # a mapping made before the replacement stays valid
    files = set(payload_files(store_path))

    store.replace_arrays("k", {"labels": np.array(["a", "b"]), "nested/w": np.array([7.0, 8.0])})
    rec = store["k"]
    assert rec.meta == before.meta and rec.run == 3
    assert list(rec.arrays) == list(before.arrays)  # same names, same order
    assert rec.arrays["big"] == before.arrays["big"]
    assert rec.labels.tolist() == ["a", "b"] and rec.labels.dtype == np.dtype("<U1")
    loaded = rec.load()
    assert loaded["nested"]["w"].tolist() == [7.0, 8.0] and loaded["s"] == {1}
    np.testing.assert_array_equal(loaded["big"], big)
    store.flush()
    now = set(payload_files(store_path))
    # the two small arrays were the members of one pack: one new pack, the old one removed
    assert len(now) == len(files) and len(now - files) == 1
    np.testing.assert_array_equal(held, big)
    report = store.verify()
    assert not report["problems"] and not report["orphans"], report
    store.close()


def test_replace_arrays_refuses_missing_keys_and_unknown_names(store: lv.Store) -> None:
    store["k"] = {"a": np.arange(3)}
    with pytest.raises(lv.MissingKeyError):
        store.replace_arrays("nope", {"a": np.arange(2)})
    with pytest.raises(lv.InvalidArrayError, match="no array of this name"):
        store.replace_arrays("k", {"b": np.arange(2)})
    with pytest.raises(TypeError):
        store.replace_arrays(3, {"a": np.arange(2)})  # type: ignore[arg-type]
    for value in (None, "hello", [1, 2], np.ma.masked_array([1, 2], mask=[0, 1])):
        with pytest.raises(TypeError, match=r"numpy\.ndarray"):
            store.replace_arrays("k", {"a": value})
    assert store["k"].a.tolist() == [0, 1, 2]


def test_update_with_no_pairs_says_so_and_writes_nothing_of_that_chunk(store: lv.Store) -> None:
    # found by a fresh-user trial: raw unpacking errors
    with pytest.raises(TypeError, match=r"mapping or an iterable of \(key, obj\) pairs, not str"):
        store.update("abc")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"element #1 is int 1, not a pair"):
        store.update([("a", {"v": 1}), 1])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"element #0 is tuple \('a', 1, 2\), not a pair"):
        store.update([("a", 1, 2)])  # type: ignore[list-item]
    assert len(store) == 0  # the chunk with the bad element is not written
    store.update([("a", {"v": 1})])
    assert store["a"].v == 1


def test_an_empty_path_is_no_store_in_every_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a fresh user's trial: Store.open("") raised StorageError with errno EIO
    monkeypatch.chdir(tmp_path)
    for mode in ("r", "a", "w"):
        for path in ("", b""):
            with pytest.raises(lv.StoreNotFoundError, match="empty path") as e:
                lv.Store.open(path, mode)
            assert isinstance(e.value, FileNotFoundError)
    assert os.listdir(tmp_path) == []


def test_a_path_with_a_nul_byte_is_a_value_error_in_every_mode(tmp_path: Path) -> None:
    # a fresh user's trial: mode "r" said no such store, "a" and "w" StorageError EIO
    for mode in ("r", "a", "w"):
        for path in (f"{tmp_path}/x\0y", os.fsencode(f"{tmp_path}/x\0y")):
            with pytest.raises(ValueError, match="null byte"):
                lv.Store.open(path, mode)
    assert os.listdir(tmp_path) == []


def test_export_import_and_merge_refuse_a_path_with_a_nul_byte(tmp_path: Path) -> None:
    # a fresh user's trial: export and import_file raised StorageError EIO
    with lv.Store.open(tmp_path / "s") as s:
        s["k"] = {"a": np.zeros(2)}
        s.flush()
        for ext in (".lvz", ".npz", ".safetensors"):
            with pytest.raises(ValueError, match="null byte in the export path"):
                s.export(f"{tmp_path}/x\0y{ext}")
        with pytest.raises(ValueError, match="null byte in the file path"):
            s.import_file(f"{tmp_path}/x\0y.npy")
        with pytest.raises(ValueError, match="null byte in the file path"):
            s.import_file([os.fsencode(f"{tmp_path}/x\0y.npy")])
        with pytest.raises(ValueError, match="null byte in the store path"):
            s.merge(f"{tmp_path}/x\0y")
        assert list(s) == ["k"]
    assert sorted(os.listdir(tmp_path)) == ["s"]


def test_merge_and_repair_take_paths_as_open_does(tmp_path: Path) -> None:
    # a fresh user's trial: merge(b"...") and repair(b"...") raised TypeError, merge("") EIO,
    # repair("...\0...") StoreNotFoundError with the NUL in its message
    with lv.Store.open(tmp_path / "src") as src:
        src["k"] = {"a": np.arange(3)}
    with lv.Store.open(tmp_path / "dst") as dst:
        assert dst.merge(os.fsencode(tmp_path / "src")) == ["k"]
        with pytest.raises(lv.StoreNotFoundError, match="empty path"):
            dst.merge("")
        with pytest.raises(lv.StoreNotFoundError, match="empty path"):
            dst.merge([b""])
        assert dst["k"].a.tolist() == [0, 1, 2]
    report = lv.Store.repair(os.fsencode(tmp_path / "dst"))
    assert report["records"] == 1
    with pytest.raises(ValueError, match="null byte"):
        lv.Store.repair(f"{tmp_path}/dst\0x")
    with pytest.raises(lv.StoreNotFoundError, match="empty path"):
        lv.Store.repair("")


def test_a_store_path_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    # a fresh user's trial: such a store opened, then its path read back as U+FFFD, so exporting
    # an archive raised a false CorruptError and a pickled store could not be opened
    path = os.fsencode(tmp_path) + b"/\xff.lv"
    for mode in ("r", "a", "w"):
        with pytest.raises(ValueError, match="not valid UTF-8"):
            lv.Store.open(path, mode)
    assert os.listdir(tmp_path) == []


def test_a_bytes_path_opens_like_its_str_and_replace_arrays_wants_a_mapping(tmp_path: Path) -> None:
    # a fresh user's trial: b"..." failed inside open(), replace_arrays(k, 5) raised
    # AttributeError
    path = tmp_path / "b.lv"
    with lv.Store.open(os.fsencode(path)) as s:
        s["k"] = {"a": np.zeros(2)}
        with pytest.raises(TypeError, match="mapping"):
            s.replace_arrays("k", 5)  # type: ignore[arg-type]
        assert s["k"].a.tolist() == [0.0, 0.0]
    with lv.Store.open(path, "r") as s:
        assert list(s) == ["k"]

    class BytesPath:  # an os.PathLike whose __fspath__ gives bytes (a trial: TypeError)
        def __fspath__(self) -> bytes:
            return os.fsencode(path)

    with lv.Store.open(BytesPath(), "r") as s:
        assert list(s) == ["k"]
