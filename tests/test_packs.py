"""Packs (FORMAT.md, "Packs"): the small arrays of one put or one update() chunk are members
of one uncompressed zip of 64-byte aligned .npy members, which np.load reads as an npz."""

from __future__ import annotations

import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import lazyvault as lv
from lazyvault.record import array_entries

from conftest import pack_member

READ_MAX = 64 * 1024


def files(store_path: Path, suffix: str) -> list[Path]:
    return sorted((store_path / "arrays").glob(f"*/*{suffix}"))


def entries(store: lv.Store, key: str) -> dict[str, dict[str, Any]]:
    return dict(array_entries(store[key]))


def member_data_offset(pack: Path, entry: dict[str, Any]) -> int:
    """Where the array's data start in the pack, found through the zip's own
    directory (not the entry's pack_offset)."""
    with zipfile.ZipFile(pack) as z:
        info = z.getinfo(pack_member(pack, entry))
    with pack.open("rb") as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = np.frombuffer(f.read(4), "<u2")
    start = info.header_offset + 30 + int(name_len) + int(extra_len)
    assert start == entry["pack_offset"]
    return start + entry["data_offset"]


def test_small_records_take_64_bytes_of_local_header_and_74_of_directory(tmp_path: Path) -> None:
    """Issue 15's small records (one 512-byte array each): every member of the update()
    chunk's pack starts 64-byte aligned, so its local header (30 B, the 28 B name, the 6 B
    alignment field) takes exactly 64 bytes, and its central directory entry (46 B and the
    name, no alignment field) 74 (FORMAT.md, "Packs", format 2.0)."""
    path = tmp_path / "s.lv"
    n = 1000
    with lv.Store.open(path) as store:
        store.update({f"r{i}": {"i": i, "x": np.arange(64.0) + i} for i in range(n)})
        store.flush()
        ids = {entries(store, f"r{i}")["x"]["id"]: i for i in range(n)}
    (pack,) = files(path, ".npz")
    npy = 128 + 512  # the .npy header and the data of one member
    assert pack.stat().st_size == n * (64 + npy + 74) + 22  # and the end record
    with zipfile.ZipFile(pack) as z, pack.open("rb") as f:
        infos = z.infolist()
        assert len(infos) == n
        for info in infos:
            assert len(info.filename) == 28 and info.extra == b""
            f.seek(info.header_offset + 26)
            name_len, extra_len = np.frombuffer(f.read(4), "<u2")
            assert (name_len, extra_len) == (28, 6)
            # the local field: zipalign's id 0xd935, 2 bytes of data, the alignment 64
            assert f.read(28 + 6)[28:] == bytes.fromhex("35d9 0200 4000")
            assert (info.header_offset + 64) % 64 == 0
    by_name = {id_[:24]: i for id_, i in ids.items()}
    assert len(by_name) == n
    with np.load(pack) as npz:
        assert sorted(npz.files) == sorted(by_name)
        for name in npz.files:
            np.testing.assert_array_equal(npz[name], np.arange(64.0) + by_name[name])


def test_np_load_reads_a_pack_as_an_npz_of_the_arrays(tmp_path: Path) -> None:
    path = tmp_path / "s.lv"
    arrays = {
        "f8": np.linspace(0, 1, 7),
        "big_endian": np.arange(6, dtype=">i4").reshape(2, 3),
        "fortran": np.asfortranarray(np.arange(6, dtype="<f4").reshape(2, 3)),
        "structured": np.array([(1, 2.5), (3, 4.5)], dtype=[("a", "<i2"), ("b", ">f8")]),
        "scalar": np.array(3.5),
        "empty": np.zeros((0, 4)),
        "text": np.array(["ab", "cde"]),
        "edge": np.ones(READ_MAX, dtype=np.uint8),  # exactly 64 KiB: packed
    }
    big = np.ones(READ_MAX + 1, dtype=np.uint8)  # one byte more: a file of its own
    with lv.Store.open(path) as store:
        store["k"] = {**arrays, "big": big, "t": 1}
        got = entries(store, "k")
        (pack,) = files(path, ".npz")
        assert [p.name for p in files(path, ".npy")] == [f"{got['big']['id']}.npy"]
        assert "pack" not in got["big"]
        with np.load(pack) as npz:
            # members are named by the first 24 digits of the payload id (format 2.0)
            assert sorted(npz.files) == sorted(got[name]["id"][:24] for name in arrays)
            for name, expected in arrays.items():
                entry = got[name]
                assert entry["pack"] == pack.stem
                assert member_data_offset(pack, entry) % 64 == 0
                member = npz[entry["id"][:24]]
                assert member.dtype == expected.dtype and member.shape == expected.shape
                assert member.flags.f_contiguous == expected.flags.f_contiguous
                np.testing.assert_array_equal(member, expected)
                np.testing.assert_array_equal(store["k"].array(name), expected)
        rec = store["k"].load()
        for name, expected in arrays.items():
            np.testing.assert_array_equal(rec[name], expected)
            assert rec[name].dtype == expected.dtype
        np.testing.assert_array_equal(rec["big"], big)


def test_ten_thousand_small_records_are_a_handful_of_files(tmp_path: Path) -> None:
    path = tmp_path / "many.lv"
    n = 10_000
    with lv.Store.open(path) as store:
        store.update(
            {f"r{i:05}": {"i": i, "x": np.full(i % 40 + 1, i, dtype=np.int32)} for i in range(n)}
        )
        assert len(store) == n
    # update() writes chunks of 1,000 records: one pack each, no .npy file
    assert len(files(path, ".npy")) == 0
    packs = files(path, ".npz")
    assert 1 <= len(packs) <= 20, len(packs)
    # one file per array would take at least a 4 KiB block each (a member takes
    # about 430 bytes: its zip headers, aligned, its .npy header and data)
    assert sum(p.stat().st_blocks * 512 for p in packs) < n * 4096 // 8
    with lv.Store.open(path, "r") as reader:
        for i in random.Random(1).sample(range(n), 200):
            np.testing.assert_array_equal(
                reader[f"r{i:05}"].x, np.full(i % 40 + 1, i, dtype=np.int32)
            )
        report = reader.verify()
    assert report["ok"] and report["arrays"] == n, report


def test_overwrite_and_delete_then_gc_removes_dead_packs(tmp_path: Path) -> None:
    path = tmp_path / "s.lv"
    with lv.Store.open(path) as store:
        store.update({f"k{i}": {"x": np.full(10, i)} for i in range(5)})
        (first,) = files(path, ".npz")
        # the pack lives while records use members of it (3 of 5: not compacted)
        for i in range(2):
            store[f"k{i}"] = {"x": np.full(10, 100 + i)}
        store.flush()
        store.gc()
        assert first.exists()
        np.testing.assert_array_equal(store["k4"].x, np.full(10, 4))
        for i in range(2, 5):
            del store[f"k{i}"]
        report = store.gc()
        assert not first.exists()
        assert report["removed_files"] >= 1
        assert len(files(path, ".npz")) == 2
        for i in range(2):
            np.testing.assert_array_equal(store[f"k{i}"].x, np.full(10, 100 + i))
        assert store.verify()["ok"]


def test_gc_compacts_a_pack_whose_bytes_are_mostly_dead(tmp_path: Path) -> None:
    path = tmp_path / "s.lv"
    with lv.Store.open(path) as store:
        store.update({f"k{i}": {"x": np.full(500, i), "t": i} for i in range(10)})
        (first,) = files(path, ".npz")
        for i in range(8):  # 2 of 10 members still used
            store[f"k{i}"] = {"x": np.full(3, -i), "t": i}
        store.flush()
        before = {p.name for p in files(path, ".npz")}
        assert store.gc()["packs_compacted"] == 1
        assert not first.exists()
        after = {p.name for p in files(path, ".npz")}
        (new,) = after - before  # the two live members, rewritten
        with np.load(path / "arrays" / new[:2] / new) as npz:
            ids = (entries(store, k)["x"]["id"] for k in ("k8", "k9"))
            assert sorted(npz.files) == sorted(i[:24] for i in ids)
        for i in range(10):
            want = np.full(500, i) if i >= 8 else np.full(3, -i)
            np.testing.assert_array_equal(store[f"k{i}"].x, want)
            assert store[f"k{i}"].t == i
        assert store.verify()["ok"]
        assert store.gc()["packs_compacted"] == 0  # nothing more to compact
        assert {p.name for p in files(path, ".npz")} == after
    with lv.Store.open(path, "r") as reader:
        np.testing.assert_array_equal(reader["k9"].x, np.full(500, 9))


def test_packed_arrays_export_import_merge_and_repair(tmp_path: Path) -> None:
    path = tmp_path / "s.lv"
    objs = {
        f"k{i}": {"x": np.arange(i + 3, dtype="<i2"), "y": np.full((2, 2), i / 7)} for i in range(6)
    }
    with lv.Store.open(path) as store:
        store.update(objs)
        assert len(files(path, ".npz")) == 1 and not files(path, ".npy")
        store.export(tmp_path / "all.lvz")
        store.export(tmp_path / "all.npz")
        store.export(tmp_path / "all.safetensors")
    # an archive holds each payload as a member of its own, without pack fields
    with zipfile.ZipFile(tmp_path / "all.lvz") as z:
        assert sum(n.startswith("arrays/") for n in z.namelist()) == 12
        assert b'"pack"' not in z.read("lazyvault/records.jsonl")
    with lv.Store.open(tmp_path / "all.lvz") as archive:
        for key, obj in objs.items():
            np.testing.assert_array_equal(archive[key].x, obj["x"])
    with np.load(tmp_path / "all.npz") as npz:
        np.testing.assert_array_equal(npz["k3/y"], objs["k3"]["y"])
    # imports of small arrays make packs
    for source in ("all.lvz", "all.npz"):
        target = tmp_path / f"from-{source}.lv"
        with lv.Store.open(target) as again:
            again.import_file(tmp_path / source)
            assert files(target, ".npz") and not files(target, ".npy")
            assert again.verify()["ok"]
    with lv.Store.open(tmp_path / "from-all.lvz.lv", "r") as again:
        for key, obj in objs.items():
            np.testing.assert_array_equal(again[key].y, obj["y"])
    # merge links the pack: the same file under a second name
    with lv.Store.open(tmp_path / "t.lv") as target:
        target.merge(path, progress=False)
        (linked,) = files(tmp_path / "t.lv", ".npz")
        assert linked.stat().st_ino == files(path, ".npz")[0].stat().st_ino
        for key, obj in objs.items():
            np.testing.assert_array_equal(target[key].x, obj["x"])
        assert target.verify()["ok"]
    # repair rebuilds a lost index of a store with packs
    shutil.rmtree(path / "index")
    report = lv.Store.repair(path)
    assert report["records"] == 6 and not report["skipped"], report
    with lv.Store.open(path, "r") as store:
        for key, obj in objs.items():
            np.testing.assert_array_equal(store[key].y, obj["y"])
        assert store.verify()["ok"]


def test_verify_names_the_key_of_a_flipped_byte_in_a_packed_member(tmp_path: Path) -> None:
    path = tmp_path / "s.lv"
    with lv.Store.open(path) as store:
        store.update({"good": {"x": np.arange(50)}, "bad": {"y": np.arange(60.0)}})
        store.flush()
        entry = entries(store, "bad")["y"]
        pack = path / "arrays" / entry["pack"][:2] / f"{entry['pack']}.npz"
        at = member_data_offset(pack, entry) + 100
        data = bytearray(pack.read_bytes())
        data[at] ^= 0x01
        pack.write_bytes(bytes(data))
        report = store.verify()
    assert not report["ok"]
    assert report["checksum_mismatches"] == 1
    (problem,) = report["problems"]
    assert '"bad"' in problem and '"y"' in problem and ".npz" in problem
    # np.load's own CRC check of the zip sees it too
    with np.load(pack) as npz, pytest.raises(zipfile.BadZipFile):
        npz[entry["id"][:24]]


def test_a_reader_keeps_reading_a_packed_array_after_overwrite_and_gc(tmp_path: Path) -> None:
    path = tmp_path / "s.lv"
    with lv.Store.open(path) as store:
        store["k"] = {"x": np.arange(20)}
        store.flush()
        (old_pack,) = files(path, ".npz")
        reader = lv.Store.open(path, "r")
        before = reader["k"]  # not loaded yet
        loaded = reader["k"].x  # loaded: a private copy
        store["k"] = {"x": -np.arange(20)}
        store.gc()
        # the reader's pinned snapshot still references the old pack
        assert old_pack.exists()
        np.testing.assert_array_equal(before.x, np.arange(20))
        np.testing.assert_array_equal(loaded, np.arange(20))
        reader.refresh()
        np.testing.assert_array_equal(reader["k"].x, -np.arange(20))
        reader.close()
        store.gc()
        assert not old_pack.exists()
        np.testing.assert_array_equal(store["k"].x, -np.arange(20))


_WRITER = textwrap.dedent(
    """
    import sys
    import numpy as np
    import lazyvault as lv

    path, seed = sys.argv[1], int(sys.argv[2])
    rng = np.random.default_rng(seed)

    def value(i):
        x = np.full(i % 37 + 1, i, dtype=np.int64)
        return {"i": i, "x": x, "y": np.arange(i % 5, dtype="<f4")}

    store = lv.Store.open(path)
    i = int(sys.argv[3])
    print("ready", flush=True)
    while True:
        if rng.random() < 0.5:
            batch = {f"k{j}": value(j) for j in range(i, i + int(rng.integers(1, 40)))}
            store.update(batch)
            i += len(batch)
        else:
            store[f"k{i}"] = value(i)
            i += 1
        if rng.random() < 0.3:
            old = f"k{int(rng.integers(0, i))}"
            if old in store:
                del store[old]
                print("deleted", old, flush=True)
        for _ in range(int(rng.integers(0, 4))):  # overwrites: same values, new packs
            j = int(rng.integers(0, i))
            if f"k{j}" in store:
                store[f"k{j}"] = value(j)
        if rng.random() < 0.4:
            store.flush()
            print("committed", i, flush=True)
        elif rng.random() < 0.1:  # removes and compacts packs, commits
            store.gc()
            print("committed", i, flush=True)
    """
)


def expected(i: int) -> dict[str, Any]:
    return {
        "i": i,
        "x": np.full(i % 37 + 1, i, dtype=np.int64),
        "y": np.arange(i % 5, dtype="<f4"),
    }


def test_a_writer_of_small_records_killed_at_random_loses_no_commit(tmp_path: Path) -> None:
    path = tmp_path / "crash.lv"
    rng = random.Random(15)
    start = 0
    for round_ in range(8):
        proc = subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(path), str(round_), str(start)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        committed, deleted = 0, set()
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
            deadline = time.monotonic() + rng.uniform(0.2, 1.5)
            while time.monotonic() < deadline:
                line = proc.stdout.readline().split()
                if not line:
                    break
                if line[0] == "committed":
                    committed = int(line[1])
                elif line[0] == "deleted":
                    deleted.add(line[1])
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.kill()
            proc.communicate(timeout=60)
        if committed == 0:
            continue
        with lv.Store.open(path) as store:  # the next writer recovers
            keys = set(store)
            for j in range(start, committed):
                key = f"k{j}"
                # a delete may survive even when no flush followed it
                assert key in keys or key in deleted, (round_, key)
            # every record there, committed or not, reads back whole
            for key in keys:
                j = int(key[1:])
                got = store[key].load()
                want = expected(j)
                assert got["i"] == want["i"]
                np.testing.assert_array_equal(got["x"], want["x"])
                np.testing.assert_array_equal(got["y"], want["y"])
            start = max(committed, max((int(k[1:]) + 1 for k in keys), default=0))
            report = store.verify()
            assert report["ok"], report
            if round_ % 2:
                store.gc()
                assert store.verify()["ok"]
                assert not list((path / "arrays").glob("*/*.tmp"))


def test_gc_reports_packs_left_because_damaged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from lazyvault._cli import main

    path = tmp_path / "s.lv"
    with lv.Store.open(path) as store:
        store.update({f"k{i}": {"x": np.full(500, i)} for i in range(10)})
        (pack,) = files(path, ".npz")
        for i in range(8):  # mostly dead: due for compaction
            store[f"k{i}"] = {"x": np.full(3, -i)}
        entry = entries(store, "k9")["x"]
    data = bytearray(pack.read_bytes())
    data[member_data_offset(pack, entry) + 5] ^= 0x10  # a live member damaged
    pack.write_bytes(bytes(data))
    with lv.Store.open(path) as store:
        report = store.gc()
        assert report["packs_compacted"] == 0 and report["packs_damaged"] == 1, report
        assert pack.exists()
        problems = store.verify()["problems"]
        assert any("'k9'" in p or '"k9"' in p for p in problems), problems
    assert main(["gc", str(path)]) == 0
    out = capsys.readouterr().out
    assert "1 pack(s) left as they are because damaged" in out, out
    assert "lazyvault verify" in out, out
