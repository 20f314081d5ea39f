"""Secondary indexes from Python: same answers as a full scan, explained,
kept through overwrite, delete, reopen and repair."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import lazyvault as lv

QUERIES = [
    "temperature == 300",
    "temperature > 350 and material == 'Si'",
    "temperature in [300, 310, 'hot']",
    "temperature >= 305.5",
    "material == 'Ge' and temperature < 320",
    "params.lr < 0.01",
]


def answers(store: lv.Store) -> dict[str, list[str]]:
    return {q: store.find(q).keys() for q in QUERIES}


def fill(store: lv.Store) -> None:
    for i in range(200):
        store[f"run-{i:03}"] = {
            "temperature": 300 + i % 60 if i % 7 else "hot",
            "material": "Si" if i % 3 else "Ge",
            "params": {"lr": 10.0 ** -(i % 5)},
        }


def test_indexed_answers_equal_full_scan_answers(tmp_path: Path) -> None:
    path = tmp_path / "s.lv"
    with lv.Store.open(path) as store:
        fill(store)
        expected = answers(store)
        assert store.explain("temperature == 300").startswith("full scan of 200 records")
        store.create_index("temperature")
        store.create_index("params.lr")
        assert store.indexes() == ["params.lr", "temperature"]
        assert answers(store) == expected
        plan = store.explain("temperature > 350 and material == 'Si'")
        assert plan.startswith("index temperature: > 350, ")
        assert store.explain("params.lr < 0.01").startswith("index params.lr: < 0.01")
        # writes keep the index current
        store["run-000"] = {"temperature": 999, "material": "Si", "params": {"lr": 1.0}}
        del store["run-001"]
        assert store.find("temperature == 999").keys() == ["run-000"]
        assert store.count("temperature > 350") == len(
            [
                k
                for k in store
                if isinstance(store[k].temperature, int) and store[k].temperature > 350
            ]
        )
        expected = answers(store)
    with lv.Store.open(path) as store:
        assert store.indexes() == ["params.lr", "temperature"]
        assert answers(store) == expected
    shutil.rmtree(path / "index")
    report = lv.Store.repair(path)
    assert report["indexes"] == ["params.lr", "temperature"]
    with lv.Store.open(path) as store:
        assert store.indexes() == ["params.lr", "temperature"]
        assert answers(store) == expected
        assert store.drop_index("temperature") is True
        assert store.drop_index("temperature") is False
        assert store.indexes() == ["params.lr"]
        assert answers(store) == expected


def test_index_errors(tmp_path: Path) -> None:
    with lv.Store.open(tmp_path / "s.lv") as store:
        with pytest.raises(lv.InvalidFieldError):
            store.create_index("a..b")
        with pytest.raises(ValueError):
            store.create_index("")
        with pytest.raises(TypeError):
            store.create_index(3)  # type: ignore[arg-type]
        with pytest.raises(lv.QueryError):
            store.explain("temperature >")
        store["x"] = {"t": 1}
    with lv.Store.open(tmp_path / "s.lv", mode="r") as store:
        with pytest.raises(lv.ReadOnlyError):
            store.create_index("t")
