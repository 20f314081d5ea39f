"""Queries over tagged metadata values (store/QUERY.md; schema/FORMAT.md, "Tagged values"),
through the Python API: a tagged value is seen as the value it stands for, NaN compares false
(``!=`` true), datetimes compare with ISO 8601 literals, tuples index like lists, ``$dict`` is the
object it escapes. Each query's answer equals the same test done in Python on ``rec.meta``, with
and without a secondary index on the field."""

from __future__ import annotations

import datetime
import math
from collections.abc import Callable
from typing import Any
from zoneinfo import ZoneInfo

import numpy as np
import pytest

import lazyvault as lv

PARIS = ZoneInfo("Europe/Paris")
UTC = datetime.UTC


def _records() -> dict[str, dict[str, Any]]:
    return {
        "feb": {
            "when": datetime.datetime(2024, 2, 29, 23, 59),
            "day": datetime.date(2024, 2, 29),
            "loss": 0.5,
            "t": (1, "a"),
            "big": 2**64,
            "n": np.int64(3),
            "m": np.datetime64("2024-02-01T00:00:00"),
            "esc": {"$x": 1},
        },
        "mar": {
            "when": datetime.datetime(2024, 3, 1, 0, 0),
            "day": datetime.date(2024, 3, 1),
            "loss": float("nan"),
            "t": (2, "b"),
            "big": 2**70,
            "n": np.int64(5),
            "m": np.datetime64("2024-03-02T00:00:00"),
            "esc": {"$x": 2},
        },
        "aware": {
            # 2024-03-01T00:30:00+01:00 is 2024-02-29T23:30:00Z
            "when": datetime.datetime(2024, 3, 1, 0, 30, tzinfo=PARIS),
            "loss": float("inf"),
            "t": (3,),
            "big": -(2**70),
            "n": np.float32("nan"),
            "m": np.datetime64("NaT"),
        },
        "utc": {
            "when": datetime.datetime(2024, 3, 1, 12, 30, tzinfo=UTC),
            "loss": -1.0,
            "big": 5,
            "naive": datetime.datetime(2024, 3, 1),
        },
    }


@pytest.fixture(scope="module", params=["scan", "indexed"])
def store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = tmp_path_factory.mktemp("queries") / "s.lv"
    s = lv.Store.open(path)
    s.update(_records(), progress=False)
    if request.param == "indexed":
        for field in ("when", "loss", "big", "n", "m", "day"):
            s.create_index(field)
    yield s
    s.close()


def _keys(store: lv.Store, query: str) -> list[str]:
    return sorted(store.keys(query))


def _where(predicate: Callable[[dict[str, Any]], bool]) -> list[str]:
    return sorted(k for k, meta in _records().items() if _safe(predicate, meta))


def _safe(predicate: Callable[[dict[str, Any]], bool], meta: dict[str, Any]) -> bool:
    try:
        return bool(predicate(meta))
    except (KeyError, TypeError, IndexError):
        return False


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        # a temporal value against an ISO 8601 literal (a date literal is midnight; a literal
        # without an offset against an aware value is UTC)
        ("when >= '2024-03-01'", ["mar", "utc"]),
        ("when < '2024-03-01T00:00:00'", ["aware", "feb"]),
        ("when == '2024-03-01T12:30:00+00:00'", ["utc"]),
        ("when == '2024-03-01T13:30:00+01:00'", ["utc"]),
        ("when == '2024-02-29T23:30:00Z'", ["aware"]),
        ("day >= '2024-03-01'", ["mar"]),
        ("day == '2024-03-01'", ["mar"]),
        ("m > '2024-03-01'", ["mar"]),
        ("when > 'not a date'", []),
        # NaN: ordered comparisons and == false, != true
        ("loss > 0", ["aware", "feb"]),
        ("loss == loss", ["aware", "feb", "utc"]),
        ("loss != 0.5", ["aware", "mar", "utc"]),
        ("loss <= 0.5", ["feb", "utc"]),
        ("n > 0", ["feb", "mar"]),
        ("n != 3", ["aware", "mar"]),
        # tuples are lists
        ("t[0] == 2", ["mar"]),
        ("t[-1] == 3", ["aware"]),
        ("'a' in t", ["feb"]),
        ("t == [1, 'a']", ["feb"]),
        # big ints compare exactly
        ("big > 18446744073709551615", ["feb", "mar"]),
        ("big == 18446744073709551616", ["feb"]),
        ("big < 0", ["aware"]),
        # an escaped dict is the dict
        ("esc['$x'] == 2", ["mar"]),
        ("exists(esc['$x'])", ["feb", "mar"]),
    ],
)
def test_query(store: lv.Store, query: str, expected: list[str]) -> None:
    assert _keys(store, query) == expected
    assert store.count(query) == len(expected)


def test_nan_never_orders(store: lv.Store) -> None:
    assert _keys(store, "loss > 0") == _where(lambda m: m["loss"] > 0)
    assert _keys(store, "loss < 1") == _where(lambda m: m["loss"] < 1)
    assert _keys(store, "loss != 0.5") == _where(lambda m: m["loss"] != 0.5)
    assert not any(math.isnan(store[k].loss) for k in store.keys("loss >= -10"))


def test_a_naive_and_an_aware_stored_value_are_unordered(store: lv.Store) -> None:
    # utc: when is aware, naive is naive: neither order nor equality holds
    for op in ("==", "<", "<=", ">", ">="):
        assert _keys(store, f"when {op} naive") == [], op
