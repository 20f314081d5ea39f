"""Invariants 1 and 2 and the zero-copy promise: metadata access opens no
payload; arrays are read-only: copies when small, views of a memory map
that fault in lazily when large;
old views survive overwrites; damaged payloads raise, never crash."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import lazyvault as lv

from conftest import damage_payload, payload_location, stored_files


def _mapped_payloads() -> dict[str, tuple[int, int]]:
    """Address ranges of the .npy files this process has mapped."""
    out = {}
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 6 and parts[5].endswith(".npy"):
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                out[parts[5]] = (lo, hi)
    return out


def _rss_of(path_prefix: str) -> int:
    """Resident bytes of this process's mappings of files under path_prefix."""
    total, current = 0, None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5 and ":" not in head[0]:
                current = head[5] if len(head) >= 6 else ""
            elif head and head[0] == "Rss:" and current and current.startswith(path_prefix):
                total += int(head[1]) * 1024
    return total


@pytest.fixture
def filled(store: lv.Store, store_path: Path) -> lv.Store:
    for i in range(20):
        store[f"run-{i:03d}"] = {
            "temperature": 250.0 + 10 * i,
            "material": "Si" if i % 2 else "Ge",
            "params": {"lr": 10.0**-i},
            "positions": np.full((100, 3), i, dtype=np.float64),
            "frames": [np.arange(i + 1), np.zeros(2, dtype=np.uint8)],
        }
    store.flush()
    return store


def test_metadata_access_opens_no_payload(filled: lv.Store, store_path: Path) -> None:
    # Move every payload away: any metadata operation that touched one would fail.
    hidden = store_path.parent / "hidden-arrays"
    shutil.move(store_path / "arrays", hidden)
    try:
        assert len(filled) == 20
        keys = list(filled)
        assert keys[0] == "run-000"
        for key in keys:
            rec = filled[key]
            assert rec.key == key
            assert rec.meta["temperature"] == rec.temperature
            assert rec.arrays["positions"].shape == (100, 3)
            assert rec.arrays["positions"].dtype == np.float64
            assert rec.arrays["frames/0"].nbytes == 8 * (int(key[-3:]) + 1)
            assert "run-" in repr(rec)
            assert "positions" in dir(rec)
        assert len(filled.find("temperature > 300")) == 14
        assert filled.count("material == 'Si'") == 10
        assert [r.key for r in filled.find(lambda r: r.params["lr"] > 0.05)] == [
            "run-000",
            "run-001",
        ]
        assert filled.get("nope") is None and "run-005" in filled
        assert "records=20" in repr(filled)
        assert not [p for p in _mapped_payloads() if p.startswith(str(store_path))]
        # and touching an array now fails with a clear error naming it
        with pytest.raises(lv.CorruptError, match=r"run-003.*positions"):
            filled["run-003"].positions
    finally:
        shutil.move(hidden, store_path / "arrays")
    assert filled["run-003"].positions[0, 0] == 3.0


def test_array_is_a_read_only_view_of_the_mapping(store: lv.Store, store_path: Path) -> None:
    store["k"] = {"positions": np.full((4400, 3), 7.0)}  # 103 KiB: over 64 KiB, mapped
    rec = store["k"]
    a = rec.positions
    assert type(a) is np.ndarray and not isinstance(a, np.memmap)
    assert rec.positions is a  # cached on the proxy
    assert not a.flags.writeable and not a.flags.owndata
    with pytest.raises(ValueError):
        a[0, 0] = 1.0
    with pytest.raises(ValueError):
        a.flags.writeable = True  # the exporter refuses a writable buffer
    # the data pointer lies inside a mapping of this record's payload file
    maps = _mapped_payloads()
    entry = rec._record["arrays"]["positions"]
    path = str(store_path / "arrays" / entry["id"][:2] / f"{entry['id']}.npy")
    lo, hi = maps[path]
    assert lo <= a.ctypes.data and a.ctypes.data + a.nbytes <= hi
    assert (a.ctypes.data - lo) % 64 == 0  # data offset 64-aligned, map page-aligned
    assert np.shares_memory(a, a[10:])
    assert float(a.sum()) == 7 * 4400 * 3


def test_small_array_is_a_read_only_aligned_copy(filled: lv.Store, store_path: Path) -> None:
    rec = filled["run-007"]
    a = rec.positions  # 2,400 bytes: at most 64 KiB, read into memory
    assert type(a) is np.ndarray and not isinstance(a, np.memmap)
    assert rec.positions is a
    assert not a.flags.writeable and not a.flags.owndata
    with pytest.raises(ValueError):
        a[0, 0] = 1.0
    with pytest.raises(ValueError):
        a.flags.writeable = True
    assert a.ctypes.data % 64 == 0
    entry = rec._record["arrays"]["positions"]
    path, _ = payload_location(store_path, entry)  # a pack member: read, never mapped
    assert str(path) not in _mapped_payloads() and path.suffix == ".npz"
    assert float(a.sum()) == 7 * 300


def test_mapping_outlives_proxy_and_store(store_path: Path) -> None:
    with lv.Store.open(store_path) as s:
        s["k"] = {"a": np.arange(1000.0)}
        a = s["k"].a
    # store closed and proxy gone: the view keeps its mapping alive
    assert a.sum() == sum(range(1000))


def test_faults_in_lazily(store: lv.Store, store_path: Path) -> None:
    n = 64 * 2**20
    store["big"] = {"a": np.ones(n // 8)}
    store.flush()
    rec = store["big"]
    a = rec.a  # mapped, nothing touched yet
    prefix = str(store_path / "arrays")
    assert _rss_of(prefix) < 1 * 2**20
    first = a[0]
    assert first == 1.0
    assert _rss_of(prefix) < 4 * 2**20  # one page (plus readahead), not 64 MiB
    assert a.sum() == n // 8
    assert _rss_of(prefix) > n // 2


def test_overwrite_and_delete_keep_live_views_valid(store: lv.Store, store_path: Path) -> None:
    store["k"] = {"a": np.arange(100_000, dtype=np.int64)}
    old = store["k"].a
    store["k"] = {"a": np.zeros(10, dtype=np.int64)}
    store.flush()  # the old payload is unlinked now
    assert len(stored_files(store_path)) == 1
    assert old.sum() == sum(range(100_000))  # unlinked but mapped: data intact
    assert store["k"].a.tolist() == [0] * 10
    new = store["k"].a
    del store["k"]
    store.flush()  # the pack's one member died: the pack is unlinked too
    assert stored_files(store_path) == []
    assert new.tolist() == [0] * 10


def test_payloads_are_removed_only_after_flush(store: lv.Store, store_path: Path) -> None:
    store["k"] = {"a": np.arange(3)}
    store.flush()
    store["k"] = {"a": np.arange(4)}
    # before the flush the durable index may still reference the old payload
    assert len(stored_files(store_path)) == 2
    report = store.verify()
    assert report["ok"] and report["orphans"] == []
    store.flush()
    assert len(stored_files(store_path)) == 1


@pytest.mark.parametrize("n", [10_000, 40_000])  # a pack member, a payload file
def test_truncated_payload_raises_never_crashes(store: lv.Store, store_path: Path, n: int) -> None:
    store["k"] = {"img": np.arange(n, dtype=np.uint16)}
    store.flush()
    damage_payload(store_path, store["k"]._record["arrays"]["img"], lambda b: b[:-100])
    with pytest.raises(lv.CorruptError, match=r"'k'.*'img'.*truncated"):
        store["k"].img
    report = store.verify()
    assert not report["ok"] and "truncated" in report["problems"][0]


@pytest.mark.parametrize(
    "damage",
    [
        lambda b: b"XXXXXX" + b[6:],  # magic
        lambda b: b[:6] + b"\x09\x00" + b[8:],  # version
        lambda b: b.replace(b"'<u2'", b"'<u4'"),  # header disagrees with the record
        lambda b: b.replace(b"(10000,)", b"(99999,)").replace(b"(40000,)", b"(99999,)"),
        lambda b: b[:40],  # header cut
        lambda b: b"",  # empty file
    ],
)
@pytest.mark.parametrize("n", [10_000, 40_000])  # a pack member, a payload file
def test_corrupt_header_raises(store: lv.Store, store_path: Path, damage, n: int) -> None:
    store["k"] = {"img": np.arange(n, dtype=np.uint16)}
    store.flush()
    damage_payload(store_path, store["k"]._record["arrays"]["img"], damage)
    with pytest.raises(lv.CorruptError, match=r"'k'.*'img'"):
        store["k"].img
    assert store["k"].meta == {}  # metadata still fine


def test_missing_payload_after_gc_of_orphans(store: lv.Store, store_path: Path) -> None:
    store["k"] = {"a": np.arange(5)}  # an overwrite: the journal holds two puts of "k"
    store["k"] = {"a": np.arange(3)}
    store.flush()
    orphan = store_path / "arrays" / "ab" / ("ab" + "0" * 30 + ".npy")
    orphan.parent.mkdir(exist_ok=True)
    orphan.write_bytes(b"junk")
    tmp = store_path / "arrays" / "ab" / ("ab" + "1" * 30 + ".npy.tmp")
    tmp.write_bytes(b"half written")
    report = store.verify()
    assert sorted(report["orphans"]) == sorted([str(orphan), str(tmp)])
    journal = store_path / "journal"
    before = {p.name: p.stat().st_size for p in journal.iterdir()}
    report = store.gc()
    assert (report["removed_files"], report["removed_bytes"]) == (2, 4 + 12)
    # gc's checkpoint holds every record: no journal segment is needed
    after = {p.name: p.stat().st_size for p in journal.iterdir()}
    assert before and after == {}
    assert report["journal_bytes_freed"] == sum(before.values())
    assert store.verify()["orphans"] == []
    assert store["k"].a.tolist() == [0, 1, 2]
