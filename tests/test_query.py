"""find/count/keys through the Python API: the query language evaluated in
Rust over the index, checked against the same predicate written in Python."""

from __future__ import annotations

import numpy as np
import pytest

import lazyvault as lv

MATERIALS = ["Si", "Ge", "GaAs", "Si"]


@pytest.fixture
def runs(store: lv.Store) -> lv.Store:
    for i in range(40):
        obj = {
            "temperature": 200.0 + 5 * i,
            "material": MATERIALS[i % 4],
            "step": i,
            "params": {"lr": 10.0 ** -(i % 5), "name": f"p{i % 3}"},
            "tags": ["hot"] if i > 30 else ["cold", "x"],
            "positions": np.zeros((i + 1, 3), dtype=np.float32 if i % 2 else np.float64),
        }
        if i % 10 == 0:
            obj["note"] = None
        if i % 7 == 0:
            obj["temperature"] = "unknown"  # mixed types across records
        store[f"run-{i:03d}"] = obj
    return store


def _expect(store: lv.Store, predicate) -> list[str]:
    out = []
    for key in store:
        rec = store[key]
        try:
            if predicate(rec.meta, rec.arrays, key):
                out.append(key)
        except (KeyError, TypeError, IndexError):
            pass  # missing fields and mixed types never match
    return out


CASES = [
    ("temperature > 300", lambda m, a, k: m["temperature"] > 300),
    (
        "temperature > 250 and material == 'Si'",
        lambda m, a, k: m["temperature"] > 250 and m["material"] == "Si",
    ),
    (
        "material in ['Ge', 'GaAs'] or step < 3",
        lambda m, a, k: m["material"] in ("Ge", "GaAs") or m["step"] < 3,
    ),
    ("not (material == 'Si')", lambda m, a, k: m["material"] != "Si"),
    ("params.lr < 1e-3", lambda m, a, k: m["params"]["lr"] < 1e-3),
    ("params.name != 'p1'", lambda m, a, k: m["params"]["name"] != "p1"),
    ("tags[0] == 'hot'", lambda m, a, k: m["tags"][0] == "hot"),
    ("exists(note)", lambda m, a, k: "note" in m),
    ("positions.shape[0] > 30", lambda m, a, k: a["positions"].shape[0] > 30),
    ("positions.dtype == 'float32'", lambda m, a, k: a["positions"].dtype == np.float32),
    ("key.startswith('run-01')", lambda m, a, k: k.startswith("run-01")),
    (
        "(step >= 10 and step < 20) or temperature == 'unknown'",
        lambda m, a, k: 10 <= m["step"] < 20 or m["temperature"] == "unknown",
    ),
]


@pytest.mark.parametrize(("expr", "predicate"), CASES, ids=[c[0] for c in CASES])
def test_find_matches_the_python_predicate(runs: lv.Store, expr: str, predicate) -> None:
    want = _expect(runs, predicate)
    assert 0 < len(want) < len(runs), "the case must discriminate"
    results = runs.find(expr)
    assert results.keys() == want
    assert [r.key for r in results] == want
    assert runs.count(expr) == len(want)
    assert runs.keys(expr) == want
    assert [r.key for r in runs.find(lambda r: r.key in set(want))] == want


def test_missing_fields_and_mixed_types_never_match_nor_raise(runs: lv.Store) -> None:
    assert runs.count("no_such_field == 1") == 0
    assert runs.count("no_such_field != 1") == 0
    assert runs.count("params.missing.deeper > 0") == 0
    assert runs.count("material > 3") == 0  # string vs number
    # 'unknown' temperatures are neither > nor <= 300
    n_str = runs.count("temperature == 'unknown'")
    assert n_str == 6
    assert runs.count("temperature > 300") + runs.count("temperature <= 300") == 40 - n_str


def test_results_are_lazy_sequences(runs: lv.Store) -> None:
    results = runs.find("step < 10")
    assert len(results) == 10
    assert results[0].key == "run-000" and results[-1].key == "run-009"
    sub = results[2:4]
    assert [r.key for r in sub] == ["run-002", "run-003"]
    assert "10 records" in repr(results)


@pytest.mark.parametrize(
    ("expr", "column"),
    [
        ("temperature >> 3", 14),
        ("material == 'Si", 13),
        ("(step < 3", 10),
        ("step < 3 and", 13),
        ("", 1),
    ],
)
def test_bad_queries_raise_query_error_with_column(runs: lv.Store, expr: str, column: int) -> None:
    with pytest.raises(lv.QueryError) as info:
        runs.find(expr)
    err = info.value
    assert isinstance(err, ValueError)
    assert err.expression == expr
    assert abs(err.column - column) <= 1, (err.column, str(err))
    assert "^" in str(err)


def test_find_rejects_other_types(runs: lv.Store) -> None:
    with pytest.raises(TypeError):
        runs.find(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not int"):
        runs.find(3)  # type: ignore[arg-type]


def test_find_none_is_every_record_as_count_none_counts(runs: lv.Store) -> None:
    every = runs.find(None)
    assert every.keys() == sorted(runs.keys()) == runs.find().keys()
    assert len(every) == runs.count(None) == len(runs)
