"""``Store.merge``: other stores' records moved in, in one all-or-nothing batch, their payload files
hard-linked under new ids (no byte copied); the sources stay valid, unchanged stores."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import lazyvault as lv

from conftest import payload_files


def make_source(path: Path, keys: list[str], *, seed: int = 0) -> dict[str, dict[str, Any]]:
    """A flushed, closed store at ``path`` with one record per key; returns what it holds."""
    rng = np.random.default_rng(seed)
    objs = {
        k: {"x": rng.random((3, 4)), "i": np.arange(i + 2), "name": k, "n": i}
        for i, k in enumerate(keys)
    }
    with lv.Store.open(path, mode="w") as s:
        s.update(objs, progress=False)
    return objs


def check_equal(store: lv.Store, objs: dict[str, dict[str, Any]]) -> None:
    for k, obj in objs.items():
        rec = store[k]
        np.testing.assert_array_equal(rec["x"], obj["x"])
        np.testing.assert_array_equal(rec["i"], obj["i"])
        assert rec["name"] == obj["name"]
        assert rec["n"] == obj["n"]


def inodes(path: Path) -> dict[int, int]:
    """``{inode: st_nlink}`` of every payload file of the store at ``path``."""
    return {f.stat().st_ino: f.stat().st_nlink for f in payload_files(path)}


def test_merge_links_payloads_and_keeps_the_sources(tmp_path: Path) -> None:
    a = make_source(tmp_path / "a.lv", ["a1", "a2"], seed=1)
    b = make_source(tmp_path / "b.lv", ["b1"], seed=2)
    with lv.Store.open(tmp_path / "t.lv") as t:
        t["old"] = {"y": np.ones(2)}
        keys = t.merge([tmp_path / "a.lv", str(tmp_path / "b.lv")], progress=False)
        assert keys == ["a1", "a2", "b1"]
        assert sorted(t) == ["a1", "a2", "b1", "old"]
        check_equal(t, a | b)
    src = inodes(tmp_path / "a.lv") | inodes(tmp_path / "b.lv")
    dst = inodes(tmp_path / "t.lv")
    # every source payload is also a payload of the target: the same inode, two links
    assert set(src) <= set(dst)
    assert all(dst[i] == 2 for i in src)
    with lv.Store.open(tmp_path / "t.lv", mode="r") as t:
        check_equal(t, a | b)
        assert t.verify(progress=False)["ok"]
    for name, objs in [("a.lv", a), ("b.lv", b)]:
        with lv.Store.open(tmp_path / name, mode="r") as s:
            assert sorted(s) == sorted(objs)
            check_equal(s, objs)
            assert s.verify(progress=False)["ok"]


def test_a_key_in_two_sources_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    make_source(tmp_path / "a.lv", ["k", "a"])
    make_source(tmp_path / "b.lv", ["b", "k"])
    with lv.Store.open(tmp_path / "t.lv") as t:
        t["old"] = {"y": np.ones(2)}
        before = payload_files(tmp_path / "t.lv")
        with pytest.raises(lv.InteropError, match="'k'") as info:
            t.merge([tmp_path / "a.lv", tmp_path / "b.lv"], progress=False)
        assert isinstance(info.value, ValueError)
        assert "a.lv" in str(info.value) and "b.lv" in str(info.value)
        assert sorted(t) == ["old"]
        assert payload_files(tmp_path / "t.lv") == before


def test_existing_keys_are_replaced(tmp_path: Path) -> None:
    a = make_source(tmp_path / "a.lv", ["k", "new"])
    with lv.Store.open(tmp_path / "t.lv") as t:
        t["k"] = {"y": np.zeros(5)}
        t.flush()
        assert t.merge(tmp_path / "a.lv", progress=False) == ["k", "new"]
        check_equal(t, a)
        assert sorted(t["k"].arrays) == ["i", "x"]
        t.flush()
    with lv.Store.open(tmp_path / "t.lv", mode="r") as t:
        check_equal(t, a)
        assert len(t) == 2


def test_progress_counts_records(tmp_path: Path) -> None:
    make_source(tmp_path / "a.lv", [f"k{i}" for i in range(5)])
    calls: list[tuple[int, int | None]] = []
    with lv.Store.open(tmp_path / "t.lv") as t:
        t.merge([tmp_path / "a.lv"], progress=lambda done, total: calls.append((done, total)))
    assert calls[0] == (0, 5)
    assert calls[-1] == (5, 5)


def test_merging_a_store_into_itself_is_refused(tmp_path: Path) -> None:
    make_source(tmp_path / "a.lv", ["k"])
    with lv.Store.open(tmp_path / "a.lv") as t:
        with pytest.raises(lv.InteropError, match="itself"):
            t.merge(os.fspath(tmp_path / "a.lv"), progress=False)
        assert sorted(t) == ["k"]
        assert len(payload_files(tmp_path / "a.lv")) == 2
