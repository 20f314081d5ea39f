"""A lost or damaged index is rebuilt from the record journal (FORMAT.md,
"Repair"), from Python and from the CLI; verify checks the journal and the
payload checksums recorded at write time, with a progress report."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import lazyvault as lv

from conftest import damage_payload


@dataclass
class Run:
    name: str
    tags: set[str]  # a set goes to the pickled remainder
    positions: np.ndarray


def cli(*args: str | os.PathLike[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lazyvault", *map(os.fspath, args)],
        capture_output=True,
        text=True,
        timeout=300,
    )


def fill(path: Path) -> dict[str, object]:
    """A store with overwrites, deletes and a pickled record; returns what
    each key holds."""
    expected: dict[str, object] = {}
    with lv.Store.open(path, allow_pickle=True) as store:
        for i in range(12):
            value = {"i": i, "w": np.arange(i * 10, dtype=np.float32).reshape(-1, 2)}
            store[f"k{i % 8}"] = value
            expected[f"k{i % 8}"] = value
        del store["k3"]
        del expected["k3"]
        run = Run("r", {"a", "b"}, np.eye(3))
        store["run"] = run
        expected["run"] = run
    return expected


def check(path: Path, expected: dict[str, object]) -> None:
    with lv.Store.open(path, mode="r", allow_pickle=True) as store:
        assert sorted(store) == sorted(expected)
        for key, value in expected.items():
            got = store[key].load()
            if isinstance(value, Run):
                assert isinstance(got, Run) and got.tags == value.tags
                np.testing.assert_array_equal(got.positions, value.positions)
            else:
                assert isinstance(value, dict) and isinstance(got, dict)
                assert got["i"] == value["i"]
                np.testing.assert_array_equal(got["w"], value["w"])
        assert store.verify()["ok"]


def test_a_deleted_index_still_reads_refuses_writes_then_is_repaired(tmp_path: Path) -> None:
    path = tmp_path / "s.lv"
    expected = fill(path)
    shutil.rmtree(path / "index")
    # readers never open the index: the checkpoint and the journal suffice
    check(path, expected)
    with lv.Store.open(path, allow_pickle=True) as store:
        assert sorted(store) == sorted(expected)
        with pytest.raises(lv.CorruptError, match="lazyvault repair"):
            store["new"] = {"i": -1}
        assert not store.is_writer and "new" not in store
        with pytest.raises(lv.CorruptError, match="lazyvault repair"):
            store.gc()
    assert not (path / "index").exists()  # refused, not recreated empty
    report = lv.Store.repair(path)
    assert report["records"] == len(expected)
    assert report["skipped"] == [] and report["moved_index"] is None
    check(path, expected)


def test_a_damaged_index_is_repaired_from_the_cli(tmp_path: Path) -> None:
    path = tmp_path / "s.lv"
    expected = fill(path)
    for f in (path / "index").iterdir():
        if f.is_file():
            f.write_bytes(os.urandom(f.stat().st_size))
    proc = cli("repair", path, "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["records"] == len(expected)
    assert Path(report["moved_index"]).name == "index.damaged-1"
    check(path, expected)
    proc = cli("repair", path)
    assert proc.returncode == 0
    assert f"index rebuilt: {len(expected)} records" in proc.stdout
    assert "index.damaged-2" in proc.stdout


def test_repair_errors_are_clear(tmp_path: Path) -> None:
    with pytest.raises(lv.StoreNotFoundError):
        lv.Store.repair(tmp_path / "missing")
    (tmp_path / "plain").mkdir()
    with pytest.raises(lv.LazyvaultError, match="not a lazyvault store"):
        lv.Store.repair(tmp_path / "plain")
    with lv.Store.open(tmp_path / "held") as store:
        with pytest.raises(lv.StoreLockedError):
            lv.Store.repair(tmp_path / "held")
        store["x"] = {"a": 1}
    with pytest.raises(TypeError):
        lv.Store.repair(3)  # type: ignore[arg-type]
    proc = cli("repair", tmp_path / "missing")
    assert proc.returncode == 1 and proc.stderr.startswith("lazyvault: ")


def test_verify_hashes_payloads_and_reports_progress(tmp_path: Path) -> None:
    path = tmp_path / "s.lv"
    with lv.Store.open(path) as store:
        for i in range(5):
            store[f"k{i}"] = {"a": np.full(1000, i, dtype=np.int64)}
        calls: list[tuple[int, int]] = []
        report = store.verify(progress=lambda done, total: calls.append((done, total)))
        assert report["ok"] and report["checksummed"] == 5
        assert calls and calls[-1] == (5, 5)
        assert store.verify(checksums=False, progress=False)["checksummed"] == 0
        with pytest.raises(TypeError):
            store.verify(progress="yes")  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            store.verify(checksums="no")  # type: ignore[arg-type]

        def stop(done: int, total: int) -> None:
            raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            store.verify(progress=stop)
        # One flipped data byte: only the checksum can tell.
        entry = store["k2"]._record["arrays"]["a"]
        damage_payload(path, entry, lambda b: b[:-1] + bytes([b[-1] ^ 1]))
        report = store.verify(progress=False)
        assert not report["ok"]
        assert len(report["problems"]) == 1 and "checksum" in report["problems"][0]
        assert 'record "k2"' in report["problems"][0]
        assert store.verify(checksums=False, progress=False)["ok"]
    full = cli("verify", path)
    assert full.returncode == 1 and "checksum" in full.stdout
    quick = cli("verify", path, "--quick")
    assert quick.returncode == 0, quick.stdout


def test_progress_bar_is_drawn_when_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with lv.Store.open(tmp_path / "s.lv") as store:
        store["a"] = {"x": np.zeros(3)}
        capsys.readouterr()
        store.verify(progress=True)
        assert "verify" in capsys.readouterr().err
        store.verify()  # not a terminal here: no bar
        assert capsys.readouterr().err == ""
