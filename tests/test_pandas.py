"""``Store.to_pandas`` and ``Results.to_pandas``: one row per record, metadata
flattened into dotted columns, array shape and dtype columns, from the index
alone; pandas stays optional."""

from __future__ import annotations

import math
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import lazyvault as lv

pd = pytest.importorskip("pandas")


@pytest.fixture
def filled(store: lv.Store) -> lv.Store:
    store["run-001"] = {
        "temperature": 300.0,
        "material": "Si",
        "params": {"lr": 1e-3, "opt": {"name": "adam", "beta": 0.9}},
        "tags": ["a", "b"],
        "positions": np.zeros((10, 3)),
        "frames": [np.arange(4, dtype=np.int32)],
    }
    store["run-002"] = {"temperature": 200.0, "material": "Ge", "positions": np.ones((5, 3))}
    store["run-003"] = {"temperature": 350.0, "note": "no arrays", "empty": {}}
    store.flush()
    return store


def test_store_to_pandas(filled: lv.Store, store_path: Path) -> None:
    hidden = store_path.parent / "hidden"
    shutil.move(store_path / "arrays", hidden)  # no payload is needed
    try:
        df = filled.to_pandas()
    finally:
        shutil.move(hidden, store_path / "arrays")
    assert list(df.index) == ["run-001", "run-002", "run-003"]
    assert df.index.name == "key"
    assert list(df.columns) == [
        "temperature",
        "material",
        "params.lr",
        "params.opt.name",
        "params.opt.beta",
        "tags",
        "positions.shape",
        "positions.dtype",
        "frames/0.shape",
        "frames/0.dtype",
        "note",
        "empty",
    ]
    assert df["temperature"].dtype == np.float64
    assert df["temperature"].tolist() == [300.0, 200.0, 350.0]
    assert df.loc["run-001", "params.opt.beta"] == 0.9
    assert df.loc["run-001", "tags"] == ["a", "b"]
    assert df.loc["run-001", "positions.shape"] == (10, 3)
    assert df.loc["run-002", "positions.shape"] == (5, 3)
    assert df.loc["run-001", "positions.dtype"] == "float64"
    assert df.loc["run-001", "frames/0.dtype"] == "int32"
    assert df.loc["run-003", "empty"] == {}
    assert pd.isna(df.loc["run-003", "positions.dtype"])
    assert math.isnan(df.loc["run-002", "params.lr"])
    # the frame is ordinary pandas: filter, group, describe
    assert df[df["temperature"] > 250].index.tolist() == ["run-001", "run-003"]
    assert df.groupby("positions.dtype").size().to_dict() == {"float64": 2}


def test_query_and_results(filled: lv.Store) -> None:
    df = filled.to_pandas("temperature >= 300")
    assert list(df.index) == ["run-001", "run-003"]
    results = filled.find("material == 'Ge'")
    df = results.to_pandas()
    assert list(df.index) == ["run-002"]
    assert list(df.columns) == ["temperature", "material", "positions.shape", "positions.dtype"]
    assert list(results[:0].to_pandas().index) == []
    with pytest.raises(lv.QueryError):
        filled.to_pandas("temperature >")


def test_empty_store(store: lv.Store) -> None:
    df = store.to_pandas()
    assert len(df) == 0 and df.index.name == "key"


def test_archive_to_pandas(filled: lv.Store, tmp_path: Path) -> None:
    filled.export(tmp_path / "a.lvz")
    with lv.Store.open(tmp_path / "a.lvz") as archive:
        df = archive.to_pandas("exists(positions)")
        assert list(df.index) == ["run-001", "run-002"]
        assert df.loc["run-002", "positions.shape"] == (5, 3)


def test_missing_pandas_gives_a_clear_import_error(
    filled: lv.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pandas", None)  # `import pandas` raises ImportError
    for call in (filled.to_pandas, filled.find("temperature > 0").to_pandas):
        with pytest.raises(ImportError, match=r"pip install pandas") as info:
            call()
        assert info.value.name == "pandas"
    # and everything else works without it
    assert len(filled) == 3 and "run-001" in str(filled)
