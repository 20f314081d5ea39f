"""Tests of the ``lazyvault`` command line, run as ``python -m lazyvault`` in a
subprocess and through ``main([...])`` in-process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import lazyvault as lv
from lazyvault._cli import main

from conftest import damage_payload, payload_location

KEYS = ["a/b c", "f", "run-001", "run-002", "run-003"]  # code point order


def cli(*args: str | os.PathLike[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Runs ``python -m lazyvault ARGS`` and returns the completed process."""
    return subprocess.run(
        [sys.executable, "-m", "lazyvault", *map(os.fspath, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
    )


@pytest.fixture
def small_store(tmp_path: Path) -> Path:
    path = tmp_path / "small.lv"
    with lv.Store.open(path, mode="w") as store:
        store["run-001"] = {
            "temperature": 300.0,
            "material": "Si",
            "positions": np.zeros((10, 3)),
        }
        store["run-002"] = {
            "temperature": 200.0,
            "material": "Ge",
            "positions": np.ones((5, 3)),
            "mask": np.ones(4, dtype=bool),
        }
        store["run-003"] = {"temperature": 350.0, "material": "Si", "note": "ünïcode"}
        store["a/b c"] = {"temperature": 10}
        store["f"] = {"w": np.asfortranarray(np.zeros((3, 4), dtype=">f4"))}
    return path


def assert_error(proc: subprocess.CompletedProcess, code: int, *needles: str) -> None:
    assert proc.returncode == code, proc.stderr
    assert proc.stderr.startswith("lazyvault: "), proc.stderr
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in proc.stderr


# -- ls ---------------------------------------------------------------------------


def test_ls_lists_every_key(small_store: Path) -> None:
    proc = cli("ls", small_store)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == KEYS
    assert proc.stderr == ""


def test_ls_json(small_store: Path) -> None:
    proc = cli("ls", small_store, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == KEYS


def test_ls_query(small_store: Path) -> None:
    proc = cli("ls", small_store, "temperature > 250 and material == 'Si'", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == ["run-001", "run-003"]
    proc = cli("ls", small_store, "positions.shape[0] >= 10")
    assert proc.stdout.splitlines() == ["run-001"]


def test_ls_bad_query_is_an_error_with_its_column(small_store: Path) -> None:
    proc = cli("ls", small_store, "temperature >> 3")
    assert_error(proc, 1, "column")
    assert proc.stdout == ""


def test_missing_store(tmp_path: Path) -> None:
    missing = tmp_path / "nope.lv"
    for command in (["ls"], ["show", "k"], ["verify"]):
        proc = cli(command[0], missing, *command[1:])
        assert_error(proc, 1, "no such store", "nope.lv")
    assert not missing.exists()  # read-only opens create nothing


def test_gc_of_a_directory_of_other_files_says_it_is_no_store(tmp_path: Path) -> None:
    # a fresh user's trial: `gc` said "no such store" where reading commands say what it is
    other = tmp_path / "photos"
    other.mkdir()
    (other / "a.txt").write_text("hi")
    for command in ("gc", "verify"):
        assert_error(cli(command, other), 1, "not a lazyvault store", "photos")
    assert sorted(os.listdir(other)) == ["a.txt"]
    assert_error(cli("gc", tmp_path / "nope.lv"), 1, "no such store", "nope.lv")
    assert not (tmp_path / "nope.lv").exists()


def test_reading_commands_run_beside_a_writer_and_writing_ones_are_refused(
    small_store: Path, tmp_path: Path
) -> None:
    with lv.Store.open(small_store, mode="a") as writer:
        writer["run-004"] = {"temperature": 400.0, "material": "Si"}  # takes the writer role
        assert writer.is_writer
        # the reading commands open with mode "r": no lock, the last commit
        # (run-004 is not flushed yet, so they do not see it)
        proc = cli("ls", small_store, "--json")
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout) == KEYS
        proc = cli("find", small_store, "material == 'Si'", "--json")
        assert proc.returncode == 0, proc.stderr
        assert [r["key"] for r in json.loads(proc.stdout)] == ["run-001", "run-003"]
        proc = cli("show", small_store, "run-002", "--json")
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["meta"] == {"temperature": 200.0, "material": "Ge"}
        proc = cli("stats", small_store, "--json")
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["records"] == len(KEYS)
        proc = cli("verify", small_store, "--json")
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["records"] == len(KEYS)
        out = tmp_path / "beside.lvz"
        proc = cli("export", small_store, out, "--query", "material == 'Si'")
        assert proc.returncode == 0, proc.stderr
        with lv.Store.open(out) as archive:
            assert list(archive) == ["run-001", "run-003"]
        # the writing commands need the writer role, held by this process
        for args in (["gc"], ["import", tmp_path / "beside.lvz"]):
            proc = cli(*args[:1], small_store, *args[1:])
            assert_error(proc, 1, "being written by process", str(os.getpid()))
        writer.flush()
        proc = cli("ls", small_store, "--json")
        assert json.loads(proc.stdout) == [*KEYS, "run-004"]
    # the writer closed: the writing commands run again
    proc = cli("gc", small_store)
    assert proc.returncode == 0, proc.stderr


# -- show -------------------------------------------------------------------------


def test_show_text(small_store: Path) -> None:
    proc = cli("show", small_store, "run-002")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("<lazyvault.Record 'run-002'")
    assert '"material": "Ge"' in out and '"temperature": 200.0' in out
    assert "positions  shape=(5, 3)  dtype=float64  nbytes=120  order=C" in out
    assert "mask       shape=(4,)  dtype=bool  nbytes=4  order=C" in out


def test_show_and_repr_escape_control_characters_in_field_and_array_names(tmp_path: Path) -> None:
    # a fresh user's trial: ESC, TAB and newlines of names reached the terminal raw
    path = tmp_path / "s"
    with lv.Store.open(path) as s:
        s["k"] = {"a\x1bb": 1, "n": {"x\ty": 2}, "arr\nz": np.zeros(2)}
        rec = s["k"]
        assert repr(rec).isprintable() and "'a\\x1bb'=1" in repr(rec)
        assert "'arr\\nz': float64 (2,)" in repr(rec)
    proc = cli("show", path, "k")
    assert proc.returncode == 0, proc.stderr
    assert all(line.isprintable() for line in proc.stdout.splitlines())
    assert "  'arr\\nz'  shape=(2,)  dtype=float64  nbytes=16  order=C" in proc.stdout
    # DEL, C1 controls and bidirectional overrides in the metadata JSON too (a second trial)
    with lv.Store.open(path) as s:
        s["k2"] = {"d\x7f": "\u202ex\x9b"}
    proc = cli("show", path, "k2")
    assert proc.returncode == 0, proc.stderr
    assert all(line.isprintable() for line in proc.stdout.splitlines())
    meta = proc.stdout.split("meta:\n", 1)[1].split("\n\narrays:", 1)[0]
    assert json.loads(meta) == {"d\x7f": "\u202ex\x9b"}


def test_show_json(small_store: Path) -> None:
    proc = cli("show", small_store, "run-002", "--json")
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(proc.stdout)
    assert shown["key"] == "run-002"
    assert shown["meta"] == {"temperature": 200.0, "material": "Ge"}
    assert shown["arrays"] == {
        "positions": {"shape": [5, 3], "dtype": "float64", "nbytes": 120, "order": "C"},
        "mask": {"shape": [4], "dtype": "bool", "nbytes": 4, "order": "C"},
    }
    assert shown["repr"].startswith("<lazyvault.Record 'run-002'")
    fortran = json.loads(cli("show", small_store, "f", "--json").stdout)
    assert fortran["arrays"]["w"] == {"shape": [3, 4], "dtype": ">f4", "nbytes": 48, "order": "F"}
    unicode = json.loads(cli("show", small_store, "run-003", "--json").stdout)
    assert unicode["meta"]["note"] == "ünïcode" and unicode["arrays"] == {}


def test_show_reads_no_payload(small_store: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy.lv"
    shutil.copytree(small_store, copy)
    for payload in (copy / "arrays").rglob("*.np[yz]"):  # payload files and packs
        payload.unlink()
    proc = cli("show", copy, "run-001", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["arrays"]["positions"]["shape"] == [10, 3]


def test_show_missing_key(small_store: Path) -> None:
    assert_error(cli("show", small_store, "run-999"), 1, "no record 'run-999'")


# -- verify and gc ------------------------------------------------------------------


def test_verify_ok(small_store: Path) -> None:
    proc = cli("verify", small_store)
    assert proc.returncode == 0, proc.stderr
    assert ": ok: 5 records, 4 arrays checked" in proc.stdout
    report = json.loads(cli("verify", small_store, "--json").stdout)
    assert report["ok"] is True and report["records"] == 5 and report["arrays"] == 4
    assert report["problems"] == [] and report["orphans"] == []


def entry_of(store_path: Path, key: str, name: str) -> dict[str, Any]:
    with lv.Store.open(store_path, mode="r") as store:
        return dict(store[key]._record["arrays"][name])


def test_verify_problems_exit_1(small_store: Path) -> None:
    victim, _ = payload_location(small_store, entry_of(small_store, "run-001", "positions"))
    victim.unlink()
    proc = cli("verify", small_store)
    assert proc.returncode == 1
    assert "problem:" in proc.stdout and victim.name in proc.stdout
    proc = cli("verify", small_store, "--json")
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    assert report["ok"] is False and len(report["problems"]) == 1


def test_verify_counts_a_failed_checksum_as_compared(small_store: Path) -> None:
    # one checksum compared and failed was printed as "0 checksums"
    proc = cli("verify", small_store)
    assert ", 4 checksums compared\n" in proc.stdout, proc.stdout
    entry = entry_of(small_store, "run-001", "positions")
    # header and size still match: only the checksum tells
    damage_payload(small_store, entry, lambda b: b[:-1] + bytes([b[-1] ^ 1]))
    proc = cli("verify", small_store)
    assert proc.returncode == 1
    assert ": 1 problem(s): 5 records, 4 arrays checked, 4 checksums compared, 1 mismatch\n" in (
        proc.stdout
    )
    report = json.loads(cli("verify", small_store, "--json").stdout)
    assert (report["checksummed"], report["checksum_mismatches"]) == (4, 1)
    with lv.Store.open(small_store, mode="r") as store:
        report = store.verify(progress=False)
        assert (report["checksummed"], report["checksum_mismatches"]) == (4, 1)
        assert len(report["problems"]) == 1 and "checksum" in report["problems"][0]
        quick = store.verify(checksums=False, progress=False)
        assert (quick["checksummed"], quick["checksum_mismatches"]) == (0, 0)
    assert ", 0 checksums compared\n" in cli("verify", small_store, "--quick").stdout


def test_gc_removes_orphans(small_store: Path) -> None:
    original, _ = payload_location(small_store, entry_of(small_store, "run-001", "positions"))
    orphan = small_store / "arrays" / "ab" / ("ab" + "0" * 30 + original.suffix)
    orphan.parent.mkdir(exist_ok=True)
    shutil.copy(original, orphan)
    proc = cli("verify", small_store)
    assert proc.returncode == 0  # orphans are not problems
    assert "1 orphan file" in proc.stdout and orphan.name in proc.stdout
    size = orphan.stat().st_size
    proc = cli("gc", small_store, "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["removed_files"] == 1 and report["removed_bytes"] == size
    assert report["journal_bytes_freed"] >= 0
    assert not orphan.exists() and original.exists()
    assert "removed 0 orphan" in cli("gc", small_store).stdout


# -- find and stats ------------------------------------------------------------------


def hide_payloads(store: Path, tmp_path: Path) -> Path:
    """A copy of ``store`` without its payload files: commands that read
    only the index must work on it."""
    copy = tmp_path / "index-only.lv"
    shutil.copytree(store, copy)
    shutil.rmtree(copy / "arrays")
    return copy


def test_find_text(small_store: Path, tmp_path: Path) -> None:
    proc = cli("find", hide_payloads(small_store, tmp_path), "temperature >= 200")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        'run-001  temperature=300.0 material="Si"  [positions float64 (10, 3)]',
        'run-002  temperature=200.0 material="Ge"  [positions float64 (5, 3), mask bool (4,)]',
        'run-003  temperature=350.0 material="Si" note="ünïcode"',
    ]
    assert cli("find", small_store, "temperature < 0").stdout == ""


def test_find_json(small_store: Path, tmp_path: Path) -> None:
    proc = cli("find", hide_payloads(small_store, tmp_path), "exists(w)", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [
        {
            "key": "f",
            "meta": {},
            "arrays": {"w": {"shape": [3, 4], "dtype": ">f4", "nbytes": 48, "order": "F"}},
        }
    ]


def test_find_keeps_one_line_per_record(tmp_path: Path) -> None:
    path = tmp_path / "nl.lv"
    with lv.Store.open(path) as store:
        store["a\nb"] = {"text": "x\ny", "nested": {"deep": [1, 2]}, "long": "z" * 100}
    proc = cli("find", path, "exists(text)")
    assert proc.returncode == 0, proc.stderr
    (line,) = proc.stdout.splitlines()
    assert line.startswith("a\\nb  ") and "nested.deep=[1,2]" in line and "zzz..." in line
    assert len(line) < 200


def test_find_errors(small_store: Path) -> None:
    assert_error(cli("find", small_store, "temperature >"), 1, "column")
    assert cli("find", small_store).returncode == 2


def test_stats(small_store: Path, tmp_path: Path) -> None:
    index_only = hide_payloads(small_store, tmp_path)
    proc = cli("stats", index_only, "--json")
    assert proc.returncode == 0, proc.stderr
    stats = json.loads(proc.stdout)
    with lv.Store.open(index_only, mode="r") as store:
        version = store.version
    assert version > 0
    assert stats == {
        "path": str(index_only),
        "version": version,
        "records": 5,
        "arrays": 4,
        "bytes": 240 + 120 + 4 + 48,
        "dtypes": {
            "float64": {"arrays": 2, "bytes": 360},
            ">f4": {"arrays": 1, "bytes": 48},
            "bool": {"arrays": 1, "bytes": 4},
        },
    }
    text = cli("stats", index_only).stdout.splitlines()
    assert text[0] == f"{index_only}: 5 records, 4 arrays, 412 B of array data (412 bytes)"
    assert text[2].split() == ["float64", "2", "360", "(360", "B)"]
    si = json.loads(cli("stats", small_store, "material == 'Si'", "--json").stdout)
    assert si["records"] == 2 and si["arrays"] == 1 and si["bytes"] == 240
    empty = tmp_path / "empty.lv"
    lv.Store.open(empty).close()
    assert (
        cli("stats", empty).stdout == f"{empty}: 0 records, 0 arrays, 0 B of array data (0 bytes)\n"
    )


# -- export and import ------------------------------------------------------------------


def test_export_query_and_keys(small_store: Path, tmp_path: Path) -> None:
    out = tmp_path / "si.lvz"
    proc = cli("export", small_store, out, "--query", "material == 'Si'")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{out}: wrote 2 record(s) from {small_store}\n"
    assert proc.stderr == ""  # no bar: stderr is not a terminal
    with lv.Store.open(out) as archive:
        assert list(archive) == ["run-001", "run-003"]
    out = tmp_path / "two.npz"
    proc = cli("export", small_store, out, "--keys", "run-002", "f", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"path": str(small_store), "out": str(out), "records": 2}
    assert sorted(np.load(out).files) == [
        "__lazyvault__.json",
        "f/w",
        "run-002/mask",
        "run-002/positions",
    ]
    everything = tmp_path / "all.lvz"
    assert cli("export", small_store, everything).returncode == 0
    assert cli("ls", everything).stdout.splitlines() == KEYS


def test_export_errors(small_store: Path, tmp_path: Path) -> None:
    out = tmp_path / "x.lvz"
    proc = cli("export", small_store, out, "--query", "x == 1", "--keys", "f")
    assert proc.returncode == 2 and "not allowed with" in proc.stderr
    proc = cli("export", small_store, tmp_path / "x.txt")  # OUT's extension: a usage error
    assert proc.returncode == 2 and proc.stderr.startswith("lazyvault export: error: "), proc.stderr
    assert "x.txt" in proc.stderr and ".safetensors" in proc.stderr
    assert_error(cli("export", small_store, out, "--keys", "nope"), 1, "nope")
    assert_error(cli("export", small_store, tmp_path / "no" / "such" / "x.npz"), 1, "such")
    assert_error(cli("export", small_store, out, "--query", "x >"), 1, "column")
    assert not out.exists()
    assert cli("export", small_store, out).returncode == 0
    assert_error(cli("export", out, tmp_path / "y.lvz"), 1, "archive")


def test_import_files_and_directories(small_store: Path, tmp_path: Path) -> None:
    np.save(tmp_path / "alone.npy", np.arange(4))
    cli("export", small_store, tmp_path / "all.lvz")
    data = tmp_path / "dir"
    data.mkdir()
    np.save(data / "x.npy", np.zeros(2))
    np.savez(data / "y.npz", a=np.ones(3))
    target = tmp_path / "new.lv"  # created by import
    proc = cli("import", target, tmp_path / "alone.npy", tmp_path / "all.lvz", data)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["alone", *KEYS, "x", "y"]
    proc = cli("import", target, tmp_path / "alone.npy", "--key", "renamed", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {
        "path": str(target),
        "records": 1,
        "keys": ["renamed"],
    }
    with lv.Store.open(target) as store:
        assert store["renamed"].data.tolist() == [0, 1, 2, 3]
        assert store["y"].a.tolist() == [1.0, 1.0, 1.0]
        assert store["run-001"].positions.shape == (10, 3)


def test_import_errors(small_store: Path, tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.arange(4))
    proc = cli("import", small_store, tmp_path / "a.npy", tmp_path / "a.npy", "--key", "k")
    assert proc.returncode == 2 and "single FILE" in proc.stderr
    (tmp_path / "junk.bin").write_bytes(b"nothing we know")
    assert_error(cli("import", small_store, tmp_path / "junk.bin"), 1, "junk.bin")
    assert_error(cli("import", small_store, tmp_path / "missing.npy"), 1, "missing.npy")
    assert cli("import", small_store).returncode == 2
    with lv.Store.open(small_store, mode="r") as store:
        assert list(store) == KEYS


def test_import_of_several_files_is_all_or_nothing(tmp_path: Path) -> None:
    # found by a new user's trial: each FILE was imported on its own
    np.save(tmp_path / "good.npy", np.arange(3))
    (tmp_path / "short.npy").write_bytes((tmp_path / "good.npy").read_bytes()[:-8])
    np.savez(tmp_path / "good.npz", x=np.arange(2))
    store = tmp_path / "s.lv"
    assert_error(cli("import", store, tmp_path / "good.npy", tmp_path / "short.npy"), 1, "short")
    assert not store.exists()  # the store the refused import would have created
    assert_error(cli("import", store, tmp_path / "good.npy", tmp_path / "good.npz"), 1, "good")
    proc = cli("import", store, tmp_path / "good.npy", "--json")
    assert json.loads(proc.stdout) == {"path": str(store), "records": 1, "keys": ["good"]}
    objects = tmp_path / "objects.npy"
    np.save(objects, np.array([{"a": 1}], dtype=object))
    assert_error(cli("import", store, objects), 1, "--allow-pickle")
    assert cli("import", store, objects, "--allow-pickle").returncode == 0
    with lv.Store.open(store, mode="r", allow_pickle=True) as s:
        assert sorted(s) == ["good", "objects"] and s["objects"].data[0] == {"a": 1}


def test_import_of_an_empty_directory_or_a_file_twice_creates_no_store(tmp_path: Path) -> None:
    # an empty directory created an empty store; a file twice was "a key collision"
    (tmp_path / "empty").mkdir()
    np.save(tmp_path / "a.npy", np.arange(3))
    store = tmp_path / "s.lv"
    assert_error(cli("import", store, tmp_path / "empty"), 1, "nothing to import")
    assert not store.exists()
    proc = cli("import", store, tmp_path / "a.npy", tmp_path / "a.npy")
    assert_error(proc, 1, "a.npy is given twice")
    assert not store.exists()


def test_gc_and_repair_refuse_an_archive(small_store: Path, tmp_path: Path) -> None:
    archive = tmp_path / "a.lvz"
    with lv.Store.open(small_store) as store:
        store.export(archive)
    for command in ("gc", "repair"):
        assert_error(cli(command, archive), 1, "a .lvz archive", "verify")


def npy_with_header(path: Path, header_size: int) -> None:
    """A valid ``.npy`` of ``arange(3)`` whose header text is padded with
    spaces to ``header_size`` bytes (version 2.0: a 4-byte header length)."""
    text = "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }"
    text += " " * (header_size - len(text) - 1) + "\n"
    preamble = b"\x93NUMPY\x02\x00" + len(text).to_bytes(4, "little")
    path.write_bytes(preamble + text.encode() + np.arange(3, dtype="<i8").tobytes())


def test_import_max_header_size(tmp_path: Path) -> None:
    big = tmp_path / "big.npy"
    npy_with_header(big, 20_032)  # 12 + 20,032 bytes: the data stays 64-byte aligned
    assert np.load(big, max_header_size=30_000).tolist() == [0, 1, 2]
    store = tmp_path / "s.lv"
    assert_error(cli("import", store, big), 1, "big.npy", "header")
    proc = cli("import", store, big, "--max-header-size", "30000")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "big\n"
    with lv.Store.open(store, mode="r") as s:
        assert s["big"].data.tolist() == [0, 1, 2]
    assert_error(cli("import", store, big, "--max-header-size", "20000", "--key", "b2"), 1, "big")


def test_import_max_ratio(tmp_path: Path) -> None:
    packed = tmp_path / "zeros.npz"
    np.savez_compressed(packed, z=np.zeros(100_000))  # deflates about 800:1
    store = tmp_path / "s.lv"
    assert_error(cli("import", store, packed, "--max-ratio", "10"), 1, "zeros.npz")
    assert not store.exists() or cli("ls", store).stdout == ""
    proc = cli("import", store, packed, "--max-ratio", "1000")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "zeros\n"


@pytest.mark.parametrize("value", ["0", "-5", "x", "1.5", str(2**64), "9" * 30])
@pytest.mark.parametrize("option", ["--max-header-size", "--max-ratio"])
def test_import_limits_must_be_positive_integers(tmp_path: Path, option: str, value: str) -> None:
    proc = cli("import", tmp_path / "s.lv", tmp_path / "a.npy", option, value)
    assert proc.returncode == 2 and "not a whole number from 1" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "s.lv").exists()


# -- usage --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["bogus"],
        ["ls"],
        ["show", "x.lv"],
        ["verify", "a", "b"],
        ["find", "x.lv"],
        ["stats"],
        ["export", "x.lv"],
        ["import", "x.lv"],
        ["stats", "x.lv", "--bogus"],
    ],
    ids=[
        "nothing",
        "unknown",
        "ls-no-path",
        "show-no-key",
        "verify-extra",
        "find-no-expr",
        "stats-no-path",
        "export-no-out",
        "import-no-file",
        "stats-bad-flag",
    ],
)
def test_usage_errors_exit_2(args: list[str]) -> None:
    proc = cli(*args)
    assert proc.returncode == 2
    assert "usage: lazyvault" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_help_has_an_example_per_subcommand() -> None:
    proc = cli("--help")
    assert proc.returncode == 0
    for command in (
        "ls",
        "find",
        "show",
        "stats",
        "export",
        "import",
        "verify",
        "gc",
        "repair",
    ):
        assert f"lazyvault {command} " in proc.stdout
        sub = cli(command, "--help")
        assert sub.returncode == 0
        assert "example:" in sub.stdout and f"lazyvault {command}" in sub.stdout


# -- in-process main() ----------------------------------------------------------------


def test_main_in_process(small_store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ls", str(small_store)]) == 0
    assert capsys.readouterr().out.splitlines() == KEYS
    assert main(["verify", str(small_store), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True
    assert main(["show", str(small_store), "run-001", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["meta"]["material"] == "Si"
    # main() released the store each time: it can be opened for writing now.
    with lv.Store.open(small_store, mode="a") as store:
        assert len(store) == 5
    assert main(["ls", str(small_store / "nope")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("lazyvault: ") and "no such store" in err
    assert main([]) == 2
    assert main(["--help"]) == 0
    assert "examples:" in capsys.readouterr().out
    assert main(["show"]) == 2


def test_gc_on_a_mistyped_path_creates_nothing(tmp_path: Path) -> None:
    # found by a fresh-user trial: gc created an empty store at the typo
    missing = tmp_path / "typo.lv"
    assert main(["gc", str(missing)]) == 1
    assert not missing.exists()


def test_find_escapes_control_characters_in_keys_as_ls_does(tmp_path: Path) -> None:
    # a fresh user's trial: find printed ESC and TAB of keys raw to the terminal
    path = tmp_path / "s.lv"
    with lv.Store.open(path) as store:
        store["esc\x1b[31mRED"] = {"v": 1}
        store["tab\tkey"] = {"v": 2}
    proc = cli("find", path, "exists(v)")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["esc\\x1b[31mRED  v=1", "tab\\tkey  v=2"]


def test_ls_escapes_control_characters_and_export_names_a_missing_key(tmp_path: Path) -> None:
    # fresh-user trial: a key with a newline printed as two lines, ESC went raw
    path = tmp_path / "s.lv"
    with lv.Store.open(path) as store:
        store["line\nbreak"] = {"a": 1}
        store["esc\x1b[31m"] = {"a": 2}
    proc = cli("ls", path)
    assert proc.returncode == 0
    assert proc.stdout.splitlines() == ["esc\\x1b[31m", "line\\nbreak"]
    assert json.loads(cli("ls", path, "--json").stdout) == ["esc\x1b[31m", "line\nbreak"]
    proc = cli("export", path, tmp_path / "o.lvz", "--keys", "nokey")
    assert proc.returncode == 1
    assert "no record with key 'nokey'" in proc.stderr


def test_a_query_of_undecodable_bytes_is_an_error_on_an_archive_too(
    small_store: Path, tmp_path: Path
) -> None:
    # argv bytes that are not UTF-8 reach Python as lone surrogates: the
    # store said "not valid Unicode at column N", an archive died with a
    # UnicodeEncodeError traceback
    archive = tmp_path / "all.lvz"
    assert cli("export", small_store, archive).returncode == 0
    expr = os.fsdecode(b"material == '\xff'")
    for path in (small_store, archive):
        for command in ("ls", "find", "stats"):
            assert_error(cli(command, path, expr), 1, "not valid Unicode at column 14")


def test_show_of_an_undecodable_key_is_an_error_on_an_archive_too(
    small_store: Path, tmp_path: Path
) -> None:
    # as above for a key: an archive died with a UnicodeEncodeError traceback
    archive = tmp_path / "all.lvz"
    assert cli("export", small_store, archive).returncode == 0
    for path in (small_store, archive):
        assert_error(cli("show", path, os.fsdecode(b"\xff")), 1, "not valid Unicode text")
