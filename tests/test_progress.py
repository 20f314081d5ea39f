"""``progress=`` of the bulk operations (``update``, ``export``, ``import_file``,
``gc``, ``verify``): None (a bar only when interactive), True (a tqdm bar on
stderr), False, or a callable ``f(done, total)``; and importing a directory."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import lazyvault as lv


def recorder() -> tuple[list[tuple[int, Any]], Callable[[int, Any], None]]:
    calls: list[tuple[int, Any]] = []
    return calls, lambda done, total: calls.append((done, total))


def objects(n: int) -> dict[str, dict[str, Any]]:
    return {f"k{i}": {"i": i, "a": np.arange(i + 1), "b": np.zeros(2)} for i in range(n)}


# -- update ---------------------------------------------------------------------------


@pytest.fixture
def chunks_of_two(monkeypatch: pytest.MonkeyPatch) -> None:
    """update() writes 2 records per chunk (1,000 by default)."""
    monkeypatch.setattr(lv.store, "_UPDATE_CHUNK_RECORDS", 2)


def test_update_reports_each_chunk_written(store: lv.Store, chunks_of_two: None) -> None:
    calls, report = recorder()
    store.update(objects(5), progress=report)
    assert calls == [(0, 5), (2, 5), (4, 5), (5, 5)]
    assert [store[f"k{i}"].i for i in range(5)] == list(range(5))


def test_update_reports_once_for_a_small_update(store: lv.Store) -> None:
    calls, report = recorder()
    store.update(objects(5), progress=report)
    assert calls == [(0, 5), (5, 5)]


def test_update_from_an_iterator_has_no_total(store: lv.Store, chunks_of_two: None) -> None:
    calls, report = recorder()
    store.update(((f"g{i}", {"i": i}) for i in range(3)), progress=report)
    assert calls == [(0, None), (2, None), (3, None)]
    calls.clear()
    store.update([("p", {"i": 1})], q={"i": 2}, progress=report)  # pairs and keywords
    assert calls == [(0, 2), (2, 2)] and store["q"].i == 2


def test_update_keeps_dict_semantics(store: lv.Store) -> None:
    store.update({"a": {"x": 1}})
    store.update(b={"x": 2})
    store.update([("c", {"x": 3})])
    store["progress"] = {"x": 4}  # the one key update() cannot take as a keyword
    assert [store[k].x for k in ("a", "b", "c", "progress")] == [1, 2, 3, 4]


def test_progress_true_draws_a_tqdm_bar_on_stderr(
    store: lv.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    store.update(objects(3), progress=True)
    err = capsys.readouterr().err
    assert "update" in err and "record" in err
    store.update(objects(3), progress=False)
    store.update(objects(3))  # None: stderr is not a terminal here, so no bar
    assert capsys.readouterr().err == ""


def test_bad_progress_is_a_type_error(store: lv.Store, tmp_path: Path) -> None:
    for call in (
        lambda: store.update({"a": {}}, progress="yes"),
        lambda: store.export(tmp_path / "x.lvz", progress=1),
        lambda: store.gc(progress="no"),
    ):
        with pytest.raises(TypeError, match="progress must be"):
            call()
    assert "a" not in store


def test_an_exception_from_the_callable_stops_the_update(
    store: lv.Store, chunks_of_two: None
) -> None:
    def stop(done: int, total: Any) -> None:
        if done == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        store.update(objects(5), progress=stop)
    assert sorted(store) == ["k0", "k1"]


# -- export, import, gc ------------------------------------------------------------------


@pytest.mark.parametrize("ext", ["npz", "safetensors"])
def test_export_reports_arrays(store: lv.Store, tmp_path: Path, ext: str) -> None:
    store.update(objects(4))
    calls, report = recorder()
    store.export(tmp_path / f"out.{ext}", progress=report)
    assert calls == [(i, 8) for i in range(9)]


def test_export_lvz_reports_one_step(store: lv.Store, tmp_path: Path) -> None:
    store.update(objects(4))
    calls, report = recorder()
    store.export(tmp_path / "out.lvz", query="i >= 2", progress=report)
    assert calls == [(0, 4), (4, 4)]


def test_export_and_import_with_a_bar(
    store: lv.Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store.update(objects(3))
    store.export(tmp_path / "out.npz", progress=True)
    assert "export" in capsys.readouterr().err
    with lv.Store.open(tmp_path / "back.lv") as back:
        back.import_file(tmp_path / "out.npz", progress=True)
        assert "import" in capsys.readouterr().err
        assert sorted(back) == ["k0", "k1", "k2"]


def test_import_of_a_multi_record_file_reports_records(store: lv.Store, tmp_path: Path) -> None:
    store.update(objects(3))
    store.export(tmp_path / "out.lvz")
    store.export(tmp_path / "out.npz")
    with lv.Store.open(tmp_path / "back.lv") as back:
        for name in ("out.lvz", "out.npz"):
            calls, report = recorder()
            assert back.import_file(tmp_path / name, progress=report) == ["k0", "k1", "k2"]
            assert calls == [(i, 6) for i in range(7)]  # arrays, two per record
        calls, report = recorder()
        np.save(tmp_path / "one.npy", np.arange(3))
        assert back.import_file(tmp_path / "one.npy", progress=report) == ["one"]
        assert calls == [(0, 1), (1, 1)]


def test_gc_reports_its_one_step(store: lv.Store) -> None:
    calls, report = recorder()
    result = store.gc(progress=report)
    assert (result["removed_files"], result["removed_bytes"]) == (0, 0)
    assert calls == [(0, 1), (1, 1)]


def test_verify_takes_the_same_progress(store: lv.Store) -> None:
    store.update(objects(3))
    calls, report = recorder()
    assert store.verify(progress=report)["ok"]
    # the total first (the first report came after the first record)
    assert calls[0] == (0, 3) and calls[-1] == (3, 3)


# -- bars show their total from the first report -------------------------------------


@pytest.mark.parametrize("operation", ["update", "verify", "export", "import", "gc"])
def test_a_bar_shows_its_total_at_once(
    store: lv.Store, tmp_path: Path, capsys: pytest.CaptureFixture[str], operation: str
) -> None:
    # the bar began without a total and showed it only on a later redraw
    # (tqdm redraws on progress, at most every 0.1 s): "0 record [...]"
    if operation != "update":
        store.update(objects(3), progress=False)
        store.export(tmp_path / "in.npz", progress=False)
    if operation == "update":
        store.update(objects(3), progress=True)
    elif operation == "verify":
        store.verify(progress=True)
    elif operation == "export":
        store.export(tmp_path / "out.safetensors", progress=True)
    elif operation == "import":
        with lv.Store.open(tmp_path / "back.lv") as back:
            back.import_file(tmp_path / "in.npz", progress=True)
    else:
        store.gc(progress=True)
    total = {"update": 3, "verify": 3, "export": 6, "import": 6, "gc": 1}[operation]
    err = capsys.readouterr().err
    assert f"| 0/{total} [" in err, err


# -- importing a directory --------------------------------------------------------------


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    (root / "sub").mkdir(parents=True)
    (root / ".hidden").mkdir()
    np.save(root / "a.npy", np.arange(3))
    np.savez(root / "sub" / "b.npz", x=np.ones(2), y=np.zeros(1))
    with open(root / "sub" / "C.NPY", "wb") as f:  # suffixes match case-insensitively
        np.save(f, np.arange(2))
    np.save(root / ".hidden" / "h.npy", np.arange(1))
    np.save(root / ".dot.npy", np.arange(1))
    (root / "README.txt").write_text("not imported")
    with lv.Store.open(tmp_path / "src.lv") as src:
        src.update({"r1": {"v": 1, "w": np.eye(2)}, "r2": {"v": 2}})
        src.export(root / "sub" / "records.lvz")
    with lv.Store.open(root / "inner.lv") as inner:  # a store inside: skipped
        inner["x"] = {"w": np.zeros(3)}
    return root


def test_import_a_directory(store: lv.Store, tree: Path) -> None:
    calls, report = recorder()
    keys = store.import_file(tree, progress=report)
    assert keys == ["a", "sub/C", "sub/b", "r1", "r2"]
    # arrays over every file, the total known once all are checked
    assert calls == [(i, 5) for i in range(6)]
    assert store["a"].data.tolist() == [0, 1, 2]
    assert store["sub/b"].x.tolist() == [1.0, 1.0]
    assert store["r1"].w.tolist() == [[1.0, 0.0], [0.0, 1.0]]
    assert sorted(store) == sorted(keys)


def test_import_a_directory_refuses_key_collisions_before_writing(
    store: lv.Store, tree: Path
) -> None:
    np.savez(tree / "a.npz", z=np.zeros(1))  # a.npy and a.npz: both "a"
    with pytest.raises(lv.InteropError, match="'a'"):
        store.import_file(tree)
    assert len(store) == 0
    (tree / "a.npz").unlink()
    (tree / "bad.npy").write_bytes(b"not an npy file at all")
    with pytest.raises(lv.UnknownFormatError, match=r"bad\.npy"):
        store.import_file(tree)
    assert len(store) == 0


def test_import_a_directory_takes_no_key(store: lv.Store, tree: Path) -> None:
    with pytest.raises(lv.InteropError, match="directory"):
        store.import_file(tree, key="x")
    with pytest.raises(lv.InteropError, match="is a lazyvault store"):
        store.import_file(tree / "inner.lv")
    assert len(store) == 0
