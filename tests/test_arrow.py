"""``to_arrow`` and ``to_polars``: records' metadata as Arrow tables, built in Rust and handed over
through the Arrow PyCapsule interface (``__arrow_c_stream__``); pyarrow, polars and DuckDB read the
same stream. Every table is checked against the records it came from."""

from __future__ import annotations

import datetime
import gc
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lazyvault as lv
from lazyvault import _lazyvault, _tagged
from lazyvault._display import flatten

pa = pytest.importorskip("pyarrow")

UTC = datetime.UTC
STRINGS = pa.dictionary(pa.int32(), pa.string())
PARIS = ZoneInfo("Europe/Paris")


# -- the export itself, on a table built in Rust by hand -----------------------


def test_stream_export_of_every_column_type() -> None:
    stream = _lazyvault._arrow_example()
    assert stream.num_rows == 6 and "6 rows" in repr(stream)
    table = pa.table(stream)
    assert table.num_rows == 6 and len(table.column(0).chunks) == 2  # two batches, as sent
    assert table.schema.field("key").nullable is False
    assert table.schema.field("tags").metadata == {
        b"lazyvault.kind": b"meta",
        b"lazyvault.json": b"true",
    }
    rows = table.slice(0, 3).to_pylist()
    assert rows[0] == {
        "key": "a",
        "temperature": 300.0,
        "step": 1,
        "ok": True,
        "material": "Si",
        "when": datetime.datetime(2024, 3, 1, 12, 30),
        "at": None,
        "tags": '[1, "a"]',
        "positions.shape": [10, 3],
    }
    assert rows[1]["at"] == datetime.datetime(2024, 3, 1, 12, 30, tzinfo=UTC)
    assert rows[1]["temperature"] is None and rows[1]["tags"] == "null"
    assert rows[2]["positions.shape"] == [] and rows[2]["when"] == datetime.datetime(1970, 1, 1)
    assert table.schema.field("material").type == STRINGS
    assert str(table.schema.field("at").type) == "timestamp[us, tz=+00:00]"
    assert str(table.schema.field("positions.shape").type) == "list<item: uint64>"


def test_stream_exports_again_and_a_capsule_nobody_takes_is_released() -> None:
    stream = _lazyvault._arrow_example()
    first = pa.table(stream)
    again = pa.RecordBatchReader.from_stream(stream).read_all()  # a new stream each time
    assert first.equals(again)
    assert pa.schema(stream) == first.schema  # __arrow_c_schema__
    for _ in range(100):  # the capsule's destructor releases a stream no consumer moved out
        capsule = stream.__arrow_c_stream__()
        del capsule
    gc.collect()
    assert pa.table(stream).equals(first)


def test_requested_schema_is_ignored() -> None:
    stream = _lazyvault._arrow_example()
    capsule = stream.__arrow_c_stream__(requested_schema=None)
    assert type(capsule).__name__ == "PyCapsule"
    reader = pa.RecordBatchReader._import_from_c_capsule(capsule)
    assert reader.read_all().num_rows == 6


def test_the_table_outlives_the_stream_and_the_store(tmp_path: Path) -> None:
    with lv.Store.open(tmp_path / "s.lv") as store:
        store["a"] = {"x": 1, "name": "Si"}
        table = store.to_arrow()
    del store
    gc.collect()
    assert table.to_pylist() == [{"key": "a", "x": 1, "name": "Si"}]


# -- a store's metadata, checked against its records --------------------------


def cells(table: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(key, {column: value})`` per row, null cells left out, JSON text decoded, shapes as tuples
    (the flattened metadata and array facts of the record the row came from)."""
    fields = table.schema
    columns = [table.column(i).to_pylist() for i in range(table.num_columns)]
    for row in range(table.num_rows):
        values: dict[str, Any] = {}
        for i in range(1, table.num_columns):
            value = columns[i][row]
            if value is None:
                continue
            meta = fields.field(i).metadata or {}
            if meta.get(b"lazyvault.json") == b"true":
                value = _tagged.decode(json.loads(value))
            elif meta.get(b"lazyvault.fact") == b"shape":
                value = tuple(value)
            values[fields.field(i).name] = value
        yield columns[0][row], values


def expected(store: lv.Handle, keys: list[str]) -> Rows:
    """What each record's row holds: its metadata flattened to dotted names (a JSON null: None),
    then its array facts."""
    out = []
    for key in keys:
        rec = store[key]
        row = flatten(rec.meta)
        for name, info in rec.arrays.items():
            row[f"{name}.shape"] = tuple(info.shape)
            row[f"{name}.dtype"] = str(info.dtype)
        out.append((key, row))
    return out


Rows = list[tuple[str, dict[str, Any]]]


def same_rows(got: Rows, want: Rows) -> None:
    """Row by row equality; a JSON null in the record is a null cell of a typed column (or the
    text ``null`` of a JSON-text one), so None values compare as absent."""
    assert [k for k, _ in got] == [k for k, _ in want]
    for (key, g), (_, w) in zip(got, want, strict=True):
        w = {name: v for name, v in w.items() if v is not None}
        g = {name: v for name, v in g.items() if v is not None}
        assert g.keys() == w.keys(), key
        for name, value in w.items():
            if isinstance(value, float) and np.isnan(value):
                assert np.isnan(g[name]), (key, name)
            else:
                assert g[name] == value, (key, name, g[name], value)
                assert (type(g[name]) is str) == (type(value) is str), (key, name)


MIXED: dict[str, dict[str, Any]] = {
    "r00": {
        "temperature": 300,  # int here, float below: one float column
        "material": "Si",
        "params": {"lr": 1e-3, "opt": {"name": "adam", "beta": 0.9}},
        "tags": ["a", "b"],
        "when": datetime.datetime(2024, 3, 1, 12, 30),
        "at": datetime.datetime(2024, 3, 1, 12, 30, tzinfo=UTC),
        "flag": True,
        "positions": np.zeros((10, 3)),
    },
    "r01": {
        "temperature": 250.5,
        "material": "Ge",
        "params": {"lr": 0.01},
        "tags": [],
        "when": datetime.datetime(2024, 3, 2, 0, 0, 0, 1),
        "at": datetime.datetime(2024, 3, 2, tzinfo=PARIS),
        "flag": False,
        "extra": None,
        "frames": [np.arange(4, dtype=np.int32), np.ones(2, np.float32)],
    },
    "r02": {"temperature": 10, "material": 7, "note": "a string where others have none"},
    "r03": {"empty": {}, "nested": {"a": {"b": {"c": 1}}}, "params": "not a dict here"},
    "r04": {"big": 2**70, "nan": float("nan"), "when": "not a datetime", "flag": 1},
    "r05": {"$weird": {"$dict": 1}, "t": (1, 2), "f4": np.float32(1.5)},
}


@pytest.fixture
def mixed(store: lv.Store) -> lv.Store:
    for key, value in MIXED.items():
        store[key] = value
    store.flush()
    return store


def test_round_trip_of_mixed_metadata(mixed: lv.Store) -> None:
    table = mixed.to_arrow()
    same_rows(list(cells(table)), expected(mixed, sorted(MIXED)))
    types = {f.name: str(f.type) for f in table.schema}
    assert types["key"] == "string"
    assert types["temperature"] == "double"  # ints and floats
    assert types["params.lr"] == "double"
    assert table.schema.field("params.opt.name").type == STRINGS
    assert types["tags"] == "string"  # lists: JSON text
    assert table.schema.field("tags").metadata[b"lazyvault.json"] == b"true"
    assert types["when"] == "string"  # datetimes and a str: JSON text
    assert types["positions.shape"] == "list<item: uint64>"
    assert table.schema.field("frames/1.dtype").type == STRINGS
    assert "positions.descr" not in types and "$live" not in types
    assert table.schema.field("params.lr").metadata[b"lazyvault.path"] == b'["params","lr"]'


def test_dates_and_numpy_scalars_come_back_as_they_were(store: lv.Store) -> None:
    store["a"] = {"day": datetime.date(2024, 1, 1), "f4": np.float32(1.5)}
    store["b"] = {"day": datetime.date(2024, 1, 2), "f4": np.float32(2.5)}
    table = store.to_arrow()
    assert table.schema.field("day").metadata.get(b"lazyvault.date") == b"true"
    assert table.schema.field("f4").metadata.get(b"lazyvault.numpy") == b"<f4"
    # the same from a checkpoint's column file, and after a merge of runs
    store.close()
    reader = lv.Store.open(store.path, mode="r")
    frame = reader.to_pandas()
    assert str(frame["f4"].dtype) == "float32"
    assert str(frame["day"].dtype) == "datetime64[s]"  # as to_pandas gives dates (midnight)
    assert [d.date() for d in frame["day"]] == [
        datetime.date(2024, 1, 1),
        datetime.date(2024, 1, 2),
    ]


def test_datetimes_naive_and_aware(store: lv.Store) -> None:
    naive = [datetime.datetime(2024, 3, d, 12, 30, 0, 250) for d in (1, 2)]
    aware = [datetime.datetime(2024, 3, 1, tzinfo=PARIS), datetime.datetime(2024, 1, 1, tzinfo=UTC)]
    for i in range(2):
        store[f"k{i}"] = {"naive": naive[i], "aware": aware[i]}
    table = store.to_arrow()
    assert str(table.schema.field("naive").type) == "timestamp[us]"
    assert str(table.schema.field("aware").type).startswith("timestamp[us, tz=")
    assert table.column("naive").to_pylist() == naive
    assert table.column("aware").to_pylist() == aware  # the same instants


def test_query_selects_rows_and_drops_empty_columns(mixed: lv.Store) -> None:
    table = mixed.to_arrow("exists(positions) or exists(params.lr)")
    assert table.column("key").to_pylist() == ["r00", "r01"]
    assert "note" not in table.column_names and "big" not in table.column_names
    same_rows(list(cells(table)), expected(mixed, ["r00", "r01"]))
    table = mixed.to_arrow("material == 'Ge'")
    assert table.column("material").to_pylist() == ["Ge"]
    assert str(table.schema.field("temperature").type) == "double"
    empty = mixed.to_arrow("temperature > 1e9")
    assert empty.num_rows == 0 and empty.column_names == ["key"]
    with pytest.raises(lv.QueryError):
        mixed.to_arrow("temperature >")
    with pytest.raises(TypeError):
        mixed.to_arrow(3)  # type: ignore[arg-type]


def test_a_type_changing_across_records_and_commits(store: lv.Store) -> None:
    store["a"] = {"x": 1, "y": "text"}
    store["b"] = {"x": 2, "y": "more"}
    store.flush()
    assert str(store.to_arrow().schema.field("x").type) == "int64"
    store["c"] = {"x": 2.5, "y": 3}
    store.flush()
    store["d"] = {"x": [1], "z": True}  # unflushed: the writer sees it
    table = store.to_arrow()
    assert table.column("key").to_pylist() == ["a", "b", "c", "d"]
    same_rows(list(cells(table)), expected(store, ["a", "b", "c", "d"]))
    assert table.schema.field("x").metadata[b"lazyvault.json"] == b"true"
    del store["b"]
    store["a"] = {"x": 10}
    store.flush()
    table = store.to_arrow()
    assert table.column("key").to_pylist() == ["a", "c", "d"]
    same_rows(list(cells(table)), expected(store, ["a", "c", "d"]))


def test_a_column_is_typed_from_the_selected_values_alone(
    store: lv.Store, store_path: Path
) -> None:
    # the store's checkpoint holds ints for most records of "material": strings of the few
    # selected came out as JSON text ('"Si"'), typed again only once rewritten
    for i in range(10):
        store[f"k{i}"] = {"material": 1 if i < 7 else "Si", "t": i}
    store.close()
    with lv.Store.open(store_path, "r") as reader:
        for table in (
            reader.to_arrow("material == 'Si'"),
            reader.find("material == 'Si'").to_arrow(),
            reader.to_arrow(keys=["k9", "k7", "k8"]).sort_by("key"),
        ):
            field = table.schema.field("material")
            assert str(field.type) == "dictionary<values=string, indices=int32, ordered=0>"
            assert b"lazyvault.json" not in (field.metadata or {})
            assert table.column("material").to_pylist() == ["Si"] * 3
        mixed = reader.to_arrow("t >= 5")  # ints and strings: JSON text
        assert mixed.column("material").to_pylist() == ["1", "1", '"Si"', '"Si"', '"Si"']
    with lv.Store.open(store_path, "a") as writer:
        writer["k9"] = {"material": "Ge", "t": 9}  # unflushed, beside the checkpoint's rows
        table = writer.to_arrow("t >= 7")
        assert str(table.schema.field("material").type).startswith("dictionary")
        assert table.column("material").to_pylist() == ["Si", "Si", "Ge"]


def test_a_merged_checkpoint_gives_the_table_its_records_give(store_path: Path) -> None:
    # a fresh clone's proptest run (the ops as it shrank them): after close, the merged
    # checkpoint run held "params" as Float64 beside JSON text (its inputs' split), and
    # to_arrow() of every row gave JSON text where the same records before gave double
    nan, when, null = float("nan"), datetime.datetime(2024, 3, 1, 12), ("null",)
    fields = ["temperature", "material", "params"]
    ops: list[Any] = [
        (39, [None, None, None]), (3, [None, "Si", null]), (19, [None, when, None]),
        (22, [[1, "Si"], None, 275.5]), (14, [None, None, nan]), (25, [when, 300, None]),
        (29, [None, 54, None]), (18, [[1, "Si"], "", None]), (36, [None, 16, None]),
        (0, [None, 66.5, 386]), (16, [None, 67, None]), (2, [250, 111.5, "Si"]),
        (13, [124, None, None]), "reopen", (2, [None, 211, None]), (14, [None, None, "Si"]),
        (20, [None, 266, nan]), (9, [None, 33.5, None]), (24, [None, None, None]), -3, -25,
        (15, [nan, None, 308.5]), "reopen", "flush", -24, (16, [328, 14.5, nan]), "flush",
        "reopen", (1, [38.5, null, None]), "reopen", "reopen", "reopen",
        (3, [260.5, None, None]), -39, (24, [None, null, None]), (5, [False, "Ge", None]),
        (37, [151, None, None]), (37, [None, True, 41]), (32, [None, [1, "Si"], None]),
        (29, [None, 283, None]), (14, [True, None, 16]), (25, ["GaAs", None, None]), -37,
        (27, [None, None, None]), (34, [None, False, None]),
    ]  # fmt: skip
    s = lv.Store.open(store_path, "w")
    for op in ops:
        if op == "reopen":
            s.close()  # each close writes a checkpoint run; runs merge by level
            s = lv.Store.open(store_path, "a")
        elif op == "flush":
            s.flush()
        elif isinstance(op, int):
            del s[f"k{-op:03d}"]
        else:
            values = zip(fields, op[1], strict=True)
            s[f"k{op[0]:03d}"] = {f: None if v == null else v for f, v in values if v is not None}
    query = "not (material == 'Si')"
    before = s.to_arrow(query)
    s.close()
    with lv.Store.open(store_path, "r") as reader:
        after = reader.to_arrow(query)
    assert str(after.schema.field("params").type) == "double"
    assert after.column("params").to_pylist()[:2] == [386.0, None]

    # the same columns (their order is first-seen per checkpoint run), types and values (JSON
    # text as the values it reads as: an int held beside floats may read "328.0", README says)
    def values(table: Any, name: str) -> str:
        cells = table.column(name).to_pylist()
        if (table.schema.field(name).metadata or {}).get(b"lazyvault.json"):
            cells = [None if c is None else json.loads(c, parse_int=float) for c in cells]
        return str(cells)

    assert sorted(after.column_names) == sorted(before.column_names)
    for name in after.column_names:
        assert after.schema.field(name).equals(before.schema.field(name), check_metadata=True)
        assert values(after, name) == values(before, name), name


def test_strings_from_a_checkpoint_and_later_changes_share_one_dictionary(
    store_path: Path,
) -> None:
    # an adversarial trial: the dictionary listed "A" twice (the checkpoint's and the changed
    # records'), so pyarrow's own to_pandas() refused it and value_counts split "A" in two
    import pyarrow.compute as pc

    with lv.Store.open(store_path) as s:
        for i in range(6):
            s[f"r{i}"] = {"k": "AB"[i % 2]}
    with lv.Store.open(store_path) as s:
        s["r9"] = {"k": "A"}
        s.flush()
        for table in (s.to_arrow("k == 'A'"), s.to_arrow()):
            dictionary = table.column("k").combine_chunks().dictionary.to_pylist()
            assert len(dictionary) == len(set(dictionary))
            counts = {
                v["values"]: v["counts"] for v in pc.value_counts(table.column("k")).to_pylist()
            }
            assert counts["A"] == 4
            assert table.to_pandas()["k"].tolist().count("A") == 4


def test_a_nul_in_a_field_or_array_name_is_escaped_in_column_names(store: lv.Store) -> None:
    # a fresh user's trial: pyarrow refused the whole table ("Null byte ... not allowed")
    store["bad"] = {"x": 2, "a\0b": 1, "m\0": np.zeros(2)}
    store["good"] = {"x": 3}
    for table in (store.to_arrow(), store.find("x > 0").to_arrow(), store.to_arrow(keys=["bad"])):
        names = table.column_names
        assert "a\\x00b" in names and "m\\x00.shape" in names and "x" in names
        field = table.schema.field("a\\x00b")
        assert json.loads(field.metadata[b"lazyvault.path"]) == ["a\0b"]
    assert store.to_pandas().loc["bad", "a\\x00b"] == 1


def test_an_archive_gives_the_columns_of_the_query_whatever_the_order_of_keys(
    store: lv.Store, tmp_path: Path
) -> None:
    # a fresh user's trial: to_arrow(keys=["b", "a"]) ordered the columns by the keys given
    store["a"] = {"x": 1}
    store["b"] = {"y": 2}
    store.export(tmp_path / "a.lvz")
    with lv.Store.open(tmp_path / "a.lvz") as archive:
        whole = archive.to_arrow()
        table = archive.to_arrow(keys=["b", "a", "b"])
        assert table.column_names == whole.column_names == ["key", "x", "y"]
        assert table.column("key").to_pylist() == ["b", "a", "b"]
        assert table.column("y").to_pylist() == [2, None, 2]
    assert store.to_arrow(keys=["b", "a"]).column_names == ["key", "x", "y"]


def test_a_reader_sees_the_last_commit(store: lv.Store, store_path: Path) -> None:
    store["a"] = {"x": 1}
    store.flush()
    store["b"] = {"x": 2}
    with lv.Store.open(store_path, mode="r") as reader:
        assert reader.to_arrow().column("key").to_pylist() == ["a"]


def test_results_and_archives(mixed: lv.Store, tmp_path: Path) -> None:
    results = mixed.find("exists(material)")
    table = results.to_arrow()
    assert table.column("key").to_pylist() == ["r00", "r01", "r02"]
    same_rows(list(cells(table)), expected(mixed, ["r00", "r01", "r02"]))
    assert results[::-1].to_arrow().column("key").to_pylist() == ["r02", "r01", "r00"]
    mixed.export(tmp_path / "a.lvz")
    with lv.Store.open(tmp_path / "a.lvz") as archive:
        table = archive.to_arrow()
        same_rows(list(cells(table)), expected(archive, list(archive)))
        assert archive.to_arrow("exists(t)").column("key").to_pylist() == ["r05"]
        assert archive.find("exists(t)").to_arrow().num_rows == 1


def test_no_copy_into_pyarrow(store: lv.Store) -> None:
    for i in range(2000):
        store[f"k{i:05}"] = {"x": i, "y": i / 3, "name": f"n{i % 7}", "tags": [i]}
    store.flush()
    stream = store._core.to_arrow(None)  # the Rust table, before pyarrow sees it
    before = pa.total_allocated_bytes()
    table = pa.table(stream)
    assert table.num_rows == 2000
    # pyarrow's pool allocated nothing: the buffers are the ones Rust built
    assert pa.total_allocated_bytes() - before < 4096
    again = pa.table(stream)
    x, x_again = table.column("x").chunks[0], again.column("x").chunks[0]
    assert x.buffers()[1].address == x_again.buffers()[1].address


def test_payloads_are_never_opened(mixed: lv.Store, store_path: Path) -> None:
    hidden = store_path.parent / "hidden"
    (store_path / "arrays").rename(hidden)
    try:
        assert mixed.to_arrow().num_rows == len(MIXED)
    finally:
        hidden.rename(store_path / "arrays")


# -- polars and DuckDB ---------------------------------------------------------


def test_polars_equals_the_arrow_table(mixed: lv.Store) -> None:
    pl = pytest.importorskip("polars")
    df = mixed.to_polars()
    table = mixed.to_arrow()
    assert df.columns == table.column_names
    assert df["key"].to_list() == table.column("key").to_pylist()
    assert df.schema["material"] == pl.String  # dictionaries as plain strings
    assert df.schema["positions.shape"] == pl.List(pl.UInt64)
    for name in table.column_names:
        got, want = df[name].to_list(), table.column(name).to_pylist()
        assert [None if g != g else g for g in got] == [None if w != w else w for w in want], name
    assert mixed.to_polars("material == 'Si'")["key"].to_list() == ["r00"]
    assert mixed.find("exists(t)").to_polars()["key"].to_list() == ["r05"]


def test_duckdb_queries_the_table(mixed: lv.Store) -> None:
    duckdb = pytest.importorskip("duckdb")
    t = mixed.to_arrow()  # noqa: F841 (DuckDB finds it by name)
    rows = duckdb.sql(
        'select key, "params.lr" from t where temperature > 100 order by key'
    ).fetchall()
    assert rows == [("r00", 1e-3), ("r01", 0.01)]
    stream = mixed._core.to_arrow(None)  # noqa: F841 (the PyCapsule object itself, no pyarrow)
    assert duckdb.sql("select count(*) from stream").fetchall() == [(len(MIXED),)]


# -- optional dependencies ------------------------------------------------------


def test_missing_pyarrow_or_polars_names_the_extra(
    mixed: lv.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    for call in (mixed.to_arrow, mixed.find("flag == true").to_arrow):
        with pytest.raises(ImportError, match=r"lazyvault\[arrow\]") as info:
            call()
        assert info.value.name == "pyarrow"
    monkeypatch.setitem(sys.modules, "polars", None)
    with pytest.raises(ImportError, match=r"lazyvault\[polars\]") as polars_info:
        mixed.to_polars()
    assert polars_info.value.name == "polars"


def test_to_pandas_without_pyarrow_is_the_same_frame(
    mixed: lv.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    pd = pytest.importorskip("pandas")
    # but for aware datetimes of several zones: UTC from Arrow, object (each its zone) without
    with_arrow = mixed.to_pandas().drop(columns="at")
    results_with_arrow = mixed.find("exists(material)").to_pandas().drop(columns="at")
    assert str(mixed.to_pandas()["at"].dtype) == "datetime64[us, UTC]"
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.compute", None)
    without = mixed.to_pandas()
    assert without["at"].tolist()[:2] == [MIXED["r00"]["at"], MIXED["r01"]["at"]]
    pd.testing.assert_frame_equal(without.drop(columns="at"), with_arrow)
    results = mixed.find("exists(material)").to_pandas().drop(columns="at")
    pd.testing.assert_frame_equal(results, results_with_arrow)


def test_keys_in_their_order(mixed: lv.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    table = mixed.to_arrow(keys=["r03", "r00"])
    assert table.column("key").to_pylist() == ["r03", "r00"]
    same_rows(list(cells(table)), expected(mixed, ["r03", "r00"]))
    assert mixed.to_arrow(keys=[]).num_rows == 0
    for call in (mixed.to_arrow, mixed.to_pandas):
        with pytest.raises(lv.MissingKeyError, match="nope"):
            call(keys=["r00", "nope"])
        with pytest.raises(ValueError, match="not both"):
            call("x > 1", keys=["r00"])
        with pytest.raises(TypeError):
            call(keys="r00")
    results = mixed.find("exists(material)")
    del mixed["r01"]
    with pytest.raises(lv.MissingKeyError):
        results.to_arrow()
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # record by record: the same errors
    with pytest.raises(lv.MissingKeyError):
        results.to_pandas()
    with pytest.raises(ValueError, match="not both"):
        mixed.to_pandas("x > 1", keys=["r00"])


# -- checkpoint runs: their mapped column files -----------------------------------


def _mapped_ranges(path_part: str) -> list[tuple[int, int]]:
    """Address ranges of this process's mappings of files whose path contains ``path_part``."""
    ranges = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and path_part in fields[5]:
                start, end = (int(x, 16) for x in fields[0].split("-"))
                ranges.append((start, end))
    return ranges


def test_one_checkpoint_run_goes_out_without_a_copy(store_path: Path) -> None:
    with lv.Store.open(store_path) as store:
        store.update({f"k{i:04}": {"x": i, "y": i / 4, "name": f"n{i % 3}"} for i in range(500)})
    with lv.Store.open(store_path, mode="r") as reader:
        first, second = reader.to_arrow(), reader.to_arrow()
        x1, x2 = (t.column("x").chunks[0].buffers()[1].address for t in (first, second))
        assert x1 == x2  # the same bytes both times: the run's column file, not a fresh build
        if Path("/proc/self/maps").exists():
            ranges = _mapped_ranges(str(store_path))
            assert ranges and any(a <= x1 < b for a, b in ranges)
        same_rows(list(cells(first)), expected(reader, list(reader)))
        want = list(cells(first))
    del reader
    gc.collect()
    assert list(cells(first)) == want  # the table keeps the mapping alive


def test_runs_and_changes_merge_in_key_order(store_path: Path) -> None:
    with lv.Store.open(store_path) as store:  # run 1
        for i in range(0, 40, 2):
            when = datetime.datetime(2024, 1, 1 + i % 28)
            store[f"k{i:02}"] = {"x": i, "kind": "even", "t": when}
    with lv.Store.open(store_path) as store:  # run 2: ints become floats, a key replaced
        for i in range(1, 40, 2):
            store[f"k{i:02}"] = {"x": i + 0.5, "kind": "odd"}
        store["k00"] = {"x": "zero", "extra": [1, 2]}
    with lv.Store.open(store_path) as store:
        del store["k02"]
        store["k41"] = {"x": 41, "kind": "tail", "t": datetime.datetime(2025, 1, 1, tzinfo=UTC)}
        store.flush()  # the changed records, not yet in a run
        keys = sorted(store)
        table = store.to_arrow()
        assert table.column("key").to_pylist() == keys
        same_rows(list(cells(table)), expected(store, keys))
        assert table.schema.field("x").metadata[b"lazyvault.json"] == b"true"  # "zero"
        assert table.schema.field("t").metadata[b"lazyvault.json"] == b"true"  # naive and aware
        odd = store.to_arrow("kind == 'odd' or kind == 'tail'")
        assert odd.column("key").to_pylist() == [k for k in keys if int(k[1:]) % 2]
        assert str(odd.schema.field("x").type) == "double"  # 41 and 1.5, 3.5...: floats
        assert "extra" not in odd.column_names
    with lv.Store.open(store_path, mode="r") as reader:
        same_rows(list(cells(reader.to_arrow())), expected(reader, keys))


# -- to_pandas over Arrow is the record-by-record frame -----------------------------

_plain_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(),
    st.sampled_from(["Si", "Ge", "", "$x", "a.b"]),
    st.text(st.characters(exclude_categories=("Cs",)), max_size=3),
    st.datetimes(),  # naive: the same instants either way
)
_field_names = st.sampled_from(["a", "b", "c", "$d", "e.f", "x"])
_meta_values = st.recursive(
    _plain_leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=2),
        st.lists(inner, max_size=2).map(tuple),
        st.dictionaries(_field_names, inner, max_size=3),
    ),
    max_leaves=6,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.dictionaries(_field_names, _meta_values, max_size=4), min_size=1, max_size=6))
def test_to_pandas_over_arrow_is_the_record_by_record_frame(
    tmp_path_factory: pytest.TempPathFactory, metas: list[dict[str, Any]]
) -> None:
    pd = pytest.importorskip("pandas")
    from lazyvault import _frame

    path = tmp_path_factory.mktemp("prop") / "s.lv"
    with lv.Store.open(path) as store:
        for i, meta in enumerate(metas):
            store[f"k{i}"] = meta
        over_arrow = store.to_pandas()
        by_record = _frame.records_frame(store.__getitem__, list(store))
    pd.testing.assert_frame_equal(over_arrow, by_record)


def test_to_pandas_honours_the_numpy_and_date_marks() -> None:
    """A typed column the builder marks (every value was a ``$numpy`` scalar of one dtype, or a
    ``$date``) goes to pandas as those values would: float32, datetime64[s] from dates."""
    pd = pytest.importorskip("pandas")
    from lazyvault import _arrow

    def field(name: str, type_: Any, **meta: str) -> Any:
        return pa.field(name, type_, metadata={"lazyvault.kind": "meta", **meta})

    schema = pa.schema(
        [
            pa.field("key", pa.string(), nullable=False),
            field("f4", pa.float64(), **{"lazyvault.numpy": "<f4"}),
            field("i2", pa.int64(), **{"lazyvault.numpy": "<i2"}),
            field("m8", pa.timestamp("us"), **{"lazyvault.numpy": "<M8[s]"}),
            field("day", pa.timestamp("us"), **{"lazyvault.date": "true"}),
        ]
    )
    midnight = datetime.datetime(2024, 3, 1)
    table = pa.table(
        [["a", "b"], [1.5, 2.5], [1, 2], [midnight, midnight], [midnight, None]], schema=schema
    )
    df = _arrow.frame(table)
    assert str(df["f4"].dtype) == "float32" and df["f4"].tolist() == [1.5, 2.5]
    assert str(df["i2"].dtype) == "int16"
    assert str(df["m8"].dtype) == "datetime64[s]"
    assert str(df["day"].dtype) == "datetime64[s]" and pd.isna(df["day"].iloc[1])


def test_a_damaged_column_file_gives_the_same_table(tmp_path: Path) -> None:
    # A fresh user's trial: a column that failed its checks made to_arrow raise
    # ("column \"x.descr\" cannot be read") while count and find read the records.
    path = tmp_path / "s.lv"
    with lv.Store.open(path) as store:
        for i in range(300):
            store[f"r{i:03d}"] = {"t": float(i), "m": "Si" if i % 2 else "Ge", "x": np.zeros(3)}
    good = lv.Store.open(path, mode="r").to_arrow().to_pylist()
    (column_file,) = (path / "checkpoints").glob("*.arrow")
    data = bytearray(column_file.read_bytes())
    for at in range(200, len(data) - 200, max(1, len(data) // 40)):
        damaged = bytearray(data)
        damaged[at] ^= 0x5A
        column_file.write_bytes(bytes(damaged))
        reader = lv.Store.open(path, mode="r")
        assert reader.to_arrow().to_pylist() == good, at
        assert reader.count("t > 100 and m == 'Si'") == 100, at
    column_file.write_bytes(bytes(data))


def test_ints_beside_floats_and_other_kinds_stay_ints(store: lv.Store) -> None:
    # A fresh user's trial: {"m": 1}, {"m": "x"}, {"m": 2.5} gave '1.0' for the int.
    store["a"] = {"m": 1}
    store["b"] = {"m": "x"}
    store["c"] = {"m": 2.5}
    store.flush()
    for source in (store, lv.Store.open(store.path, mode="r")):
        assert source.to_arrow().column("m").to_pylist() == ["1", '"x"', "2.5"]
        assert source.to_pandas()["m"].tolist() == [1, "x", 2.5]


def test_every_column_has_its_own_name(store: lv.Store) -> None:
    # A fresh user's trial: a field named "key", a field "a.b" beside {"a": {"b": ...}}, and a
    # field "x.shape" beside array x's shape gave repeated names (polars raised DuplicateError).
    store["r1"] = {"key": "meta-key", "a.b": 1, "a": {"b": 2}, "x.shape": "mine", "x": np.zeros(2)}
    table = store.to_arrow()
    names = table.column_names
    assert len(names) == len(set(names)), names
    assert table.column("key").to_pylist() == ["r1"]
    assert table.column("meta.key").to_pylist() == ["meta-key"]
    # the nested path keeps the plain name, the field with a dot is named as a query names it
    assert table.column("a.b").to_pylist() == [2]
    assert table.column("meta['a.b']").to_pylist() == [1]
    assert table.column("meta['x.shape']").to_pylist() == ["mine"]
    assert table.column("x.shape").to_pylist() == [[2]]
    assert store.to_polars().columns == names


def test_which_column_is_renamed_does_not_depend_on_record_order(tmp_path: Path) -> None:
    # A fresh user's check: which of "a.b" and a nested {"a": {"b": ...}} got the prefix
    # swapped with the order of the records.
    for first, second in (
        (("k1", {"a.b": 1}), ("k2", {"a": {"b": 2}})),
        (("k1", {"a": {"b": 2}}), ("k2", {"a.b": 1})),
    ):
        with lv.Store.open(tmp_path / f"{first[0]}-{len(first[1])}-{id(first)}.lv") as store:
            store.update(dict([first, second]))
            table = store.to_arrow()
        assert table.column("a.b").to_pylist().count(2) == 1, table.column_names
        assert table.column("meta['a.b']").to_pylist().count(1) == 1, table.column_names
