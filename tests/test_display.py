"""Notebook display and introspection: the text and HTML reprs of Store,
Record and Results (paged, escaped, opening no payload), ``dir`` and tab
completion through IPython's own completer and formatters, ``hasattr``
probes, and the HTML rendered once in headless Chromium."""

from __future__ import annotations

import html.parser
import os
import pickle
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import lazyvault as lv
from lazyvault._source import DirectorySource

IPython = pytest.importorskip("IPython")
from IPython.core.completer import provisionalcompleter  # noqa: E402
from IPython.core.formatters import format_display_data  # noqa: E402
from IPython.core.interactiveshell import InteractiveShell  # noqa: E402

EVIL = "<script>alert('x')</script>"
PROBES = (
    "_repr_mimebundle_",
    "_ipython_display_",
    "trait_names",
    "_ipython_canary_method_should_not_exist_",
    "__array__",
    "__array_interface__",
    "_getAttributeNames",
    "_repr_markdown_",
    "getdoc",
)


def _mapped_npy(prefix: Path) -> list[str]:
    """Payload files (under ``arrays/``) this process maps; checkpoint runs and column
    files are metadata, mapped by queries."""
    with open("/proc/self/maps") as f:
        return [
            line.split()[5]
            for line in f
            if len(line.split()) >= 6 and line.split()[5].startswith(str(prefix / "arrays"))
        ]


@pytest.fixture
def filled(store: lv.Store) -> lv.Store:
    for i in range(25):
        store[f"run-{i:03d}"] = {
            "temperature": 250.0 + 10 * i,
            "material": "Si" if i % 2 else "Ge",
            "params": {"lr": 10.0**-i, "opt": "adam"},
            "positions": np.full((100, 3), i, dtype=np.float64),
            "frames": [np.arange(i + 1), np.zeros(2, dtype=np.uint8)],
            "bad key": i,
        }
    store[EVIL] = {EVIL: EVIL, "class": 1, "image": np.zeros((4, 4), dtype=">u2")}
    store.flush()
    return store


@pytest.fixture
def no_payload(
    filled: lv.Store, store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[list[tuple[str, str]]]:
    """Payloads moved away and every attempt to map one recorded (even
    attempts whose error a caller swallows, as completers do)."""
    attempts: list[tuple[str, str]] = []
    original = DirectorySource.map_array

    def spy(self: DirectorySource, key: str, name: str, entry: dict[str, Any]) -> np.ndarray:
        attempts.append((key, name))
        return original(self, key, name, entry)

    monkeypatch.setattr(DirectorySource, "map_array", spy)
    hidden = store_path.parent / "hidden-arrays"
    shutil.move(store_path / "arrays", hidden)
    try:
        yield attempts
        assert attempts == []
        assert _mapped_npy(store_path) == []
    finally:
        shutil.move(hidden, store_path / "arrays")


@pytest.fixture(scope="module")
def shell(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InteractiveShell]:
    """An IPython shell whose profile, history and jedi cache live in a
    temporary directory, not in the home directory."""
    import jedi.settings
    from traitlets.config import Config

    home = tmp_path_factory.mktemp("ipython")
    config = Config()
    config.HistoryManager.hist_file = ":memory:"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("IPYTHONDIR", str(home / "ipython"))
        mp.setattr(jedi.settings, "cache_directory", str(home / "jedi"))
        shell = InteractiveShell.instance(config=config)
        yield shell
        InteractiveShell.clear_instance()


def completions(shell: InteractiveShell, text: str, jedi: bool) -> list[str]:
    shell.Completer.use_jedi = jedi
    with provisionalcompleter():
        found = [c.text for c in shell.Completer.completions(text, len(text))]
    # IPython's own matcher returns '.name'-style texts without jedi
    return [c.rsplit(".", 1)[-1] if c.startswith(".") else c for c in found]


# -- the text and HTML of a record --------------------------------------------------


def test_record_text_and_html_show_metadata_and_arrays(no_payload: list, filled: lv.Store) -> None:
    rec = filled["run-003"]
    text = str(rec)
    assert text.startswith("lazyvault.Record 'run-003'")
    for needle in ("temperature", "280.0", "params.lr", "0.001", "'adam'", "bad key"):
        assert needle in text
    line = next(line for line in text.splitlines() if line.strip().startswith("positions"))
    assert line.split() == ["positions", "(100,", "3)", "float64", "2.3", "KiB", "C", "no"]
    assert "frames/0" in text and "(4,)" in text and "32 B" in text
    page = rec._repr_html_()
    assert page.count("<table") == 2
    assert "<td>params.lr</td>" in page and "<td>2.3 KiB</td>" in page and "<td>no</td>" in page
    # the one-line repr is unchanged and bounded
    assert repr(rec).startswith("<lazyvault.Record 'run-003'") and "\n" not in repr(rec)


def test_mapped_column_follows_the_proxy(filled: lv.Store) -> None:
    rec = filled["run-001"]
    assert "0 loaded" in str(rec)
    rec.positions
    text = str(rec)
    assert "1 loaded" in text
    assert next(ln for ln in text.splitlines() if "positions" in ln).split()[-1] == "yes"
    assert next(ln for ln in text.splitlines() if "frames/0" in ln).split()[-1] == "no"
    assert "<td>yes</td>" in rec._repr_html_()


def test_user_data_is_escaped(no_payload: list, filled: lv.Store) -> None:
    for page in (
        filled[EVIL]._repr_html_(),
        filled._repr_html_(),
        filled.find("exists(image)")._repr_html_(),
    ):
        assert "<script" not in page
        assert "&lt;script&gt;" in page
    # dtype names (big-endian here; structured dtypes carry user field names) too
    assert ">u2" not in filled[EVIL]._repr_html_()
    assert "&gt;u2" in filled[EVIL]._repr_html_()


def test_a_key_with_a_newline_stays_on_its_row(store: lv.Store) -> None:
    store["a\nb"] = {"x": 1}
    store["c"] = {"x": 2}
    lines = str(store).splitlines()
    assert len(lines) == 4  # title, header, two rows
    assert lines[2].split()[0] == "'a\\nb'"


def test_long_values_are_cut(store: lv.Store) -> None:
    store["k"] = {"note": "x" * 10_000, "tags": list(range(10_000))}
    assert len(repr(store["k"])) < 200
    for text in (str(store["k"]), str(store), store._repr_html_(), store["k"]._repr_html_()):
        assert len(text) < 5_000
        assert "..." in text


def test_large_records_are_paged(store: lv.Store) -> None:
    store["wide"] = {
        **{f"f{i:02d}": i for i in range(30)},
        **{f"a{i:02d}": np.zeros(1) for i in range(25)},
    }
    text = str(store["wide"])
    assert "f19" in text and "f20" not in text and "... 10 more fields" in text
    assert "a19" in text and "a20" not in text and "... 5 more arrays" in text
    page = store["wide"]._repr_html_()
    assert "... 10 more fields" in page and "... 5 more arrays" in page


# -- stores and results ----------------------------------------------------------------


def test_store_table_is_paged(no_payload: list, filled: lv.Store, store_path: Path) -> None:
    text = str(filled)
    lines = text.splitlines()
    assert lines[0] == f"lazyvault.Store {str(store_path)!r} (mode 'a'): 26 records"
    header = lines[1].split()
    assert header[:2] == ["key", "temperature"] and "params.lr" in header and header[-1] == "size"
    assert lines[2].split()[0] == EVIL  # keys in code point order
    assert lines[3].split()[0] == "run-000"
    assert lines[21].split()[0] == "run-018"
    assert lines[22].strip() == "... 6 more records"
    assert "positions float64 (100, 3)" in lines[3] and "2.4 KiB" in lines[3]
    page = filled._repr_html_()
    assert page.count("<tr>") == 1 + 20 + 1  # header, 20 records, "... 6 more records"
    assert "<td>run-018</td>" in page and "<td>run-019</td>" not in page
    assert "... 6 more records" in page


def test_many_fields_are_left_to_to_pandas(store: lv.Store) -> None:
    store["k"] = {f"f{i:02d}": i for i in range(12)}
    text = str(store)
    assert "f07" in text and "f08" not in text
    assert "4 more metadata field(s) not shown: see to_pandas()" in text


def test_results_text_and_html(no_payload: list, filled: lv.Store) -> None:
    results = filled.find("temperature >= 300")
    text = str(results)
    assert text.splitlines()[0].startswith("lazyvault.Results: 20 records of ")
    assert text.splitlines()[2].split()[0] == "run-005"
    assert "<td>run-005</td>" in results._repr_html_()
    assert str(filled.find("temperature < 0")).splitlines() == [
        f"lazyvault.Results: 0 records of {filled.path!r}"
    ]
    assert "10 records" in repr(filled.find("temperature >= 400"))


def test_results_of_a_deleted_record(filled: lv.Store) -> None:
    results = filled.find("temperature < 270")
    del filled["run-000"]
    assert "(deleted)" in str(results) and "(deleted)" in results._repr_html_()


def test_closed_and_empty_stores(store_path: Path) -> None:
    store = lv.Store.open(store_path)
    assert str(store).splitlines() == [f"lazyvault.Store {str(store_path)!r} (mode 'a'): 0 records"]
    store.close()
    assert "(closed)" in str(store) and "(closed)" in store._repr_html_()


def test_archive_display(filled: lv.Store, tmp_path: Path) -> None:
    filled.export(tmp_path / "a.lvz", query="temperature < 280")
    with lv.Store.open(tmp_path / "a.lvz") as archive:
        assert "lazyvault.Archive" in str(archive) and "run-002" in str(archive)
        assert "<td>run-002</td>" in archive._repr_html_()
        assert archive._ipython_key_completions_() == ["run-000", "run-001", "run-002"]


# -- introspection -------------------------------------------------------------------------


def test_dir_lists_fields_and_arrays(no_payload: list, filled: lv.Store) -> None:
    rec = filled["run-002"]
    names = dir(rec)
    for name in ("temperature", "material", "params", "positions", "key", "meta", "load"):
        assert name in names
    assert "frames/0" not in names and "bad key" not in names  # not identifiers
    assert "class" not in dir(filled[EVIL])  # a keyword: rec.class is a syntax error
    assert rec._ipython_key_completions_() == [
        "temperature",
        "material",
        "params",
        "bad key",
        "positions",
        "frames/0",
        "frames/1",
    ]


def test_probes_and_unknown_names_raise_attribute_error_at_once(
    store: lv.Store, store_path: Path
) -> None:
    # fields and arrays named like the probes: neither answers them
    store["k"] = {
        "trait_names": 1,
        "getdoc": "text",
        "_repr_mimebundle_": np.zeros(3),
        "_ipython_display_": np.zeros(3),
        "_repr_markdown_": "**bold**",
        "temperature": 1.0,
    }
    rec = store["k"]
    store.close()  # a probe that reached the index would raise ClosedError
    shutil.rmtree(store_path / "arrays")  # and one that mapped a payload, CorruptError
    for name in PROBES:
        assert not hasattr(rec, name), name
        with pytest.raises(AttributeError):
            getattr(rec, name)
    with pytest.raises(AttributeError, match="has no field 'nope'"):
        rec.nope
    assert rec.meta["trait_names"] == 1 and rec["getdoc"] == "text"
    assert rec.arrays["_repr_mimebundle_"].shape == (3,)
    assert rec.temperature == 1.0


def test_array_attributes_are_properties_of_a_shared_subclass(filled: lv.Store) -> None:
    a, b = filled["run-001"], filled["run-002"]
    assert isinstance(a, lv.Record) and type(a) is type(b)
    assert type(a).__name__ == "Record"
    assert isinstance(type(a).__dict__["positions"], property)
    # introspection that does not run code sees a descriptor, not an array
    import inspect

    assert isinstance(inspect.getattr_static(a, "positions"), property)
    assert a.positions[0, 0] == 1.0 and a.positions is a.positions
    # records travel as before: by value with pickle, by reference with multiprocessing
    back = pickle.loads(pickle.dumps(a, protocol=5))
    assert back.positions[0, 0] == 1.0
    from multiprocessing.reduction import ForkingPickler

    assert type(pickle.loads(ForkingPickler.dumps(a))._source) is DirectorySource
    plain = filled[EVIL]  # arrays but none an attribute name? 'image' is one
    assert type(plain) is not lv.Record and plain.image.shape == (4, 4)
    filled["no-arrays"] = {"x": 1}
    assert type(filled["no-arrays"]) is lv.Record


# -- IPython itself ---------------------------------------------------------------------------


@pytest.mark.parametrize("jedi", [True, False], ids=["jedi", "ipython"])
def test_ipython_completer_maps_nothing(
    no_payload: list, filled: lv.Store, shell: InteractiveShell, jedi: bool
) -> None:
    rec = filled["run-004"]
    shell.user_ns.update(rec=rec, store=filled)
    assert "temperature" in completions(shell, "rec.te", jedi)
    assert completions(shell, "rec.pos", jedi) == ["positions"]
    assert "params" in completions(shell, "rec.par", jedi)
    assert {"frames/0", "frames/1"} <= set(completions(shell, 'rec["fr', jedi))
    assert {"run-000", "run-024"} <= set(completions(shell, 'store["run-0', jedi))
    # completing on the array itself uses its declared type, still mapping nothing
    after = completions(shell, "rec.positions.", jedi)
    if jedi:
        assert "reshape" in after
    assert "<script" not in "".join(completions(shell, "rec.", jedi))


def test_ipython_formatters(
    no_payload: list,
    filled: lv.Store,
    shell: InteractiveShell,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from IPython.display import display

    display(filled["run-003"])  # outside a kernel: the text/plain form on stdout
    assert capsys.readouterr().out.startswith("lazyvault.Record 'run-003'")
    for obj in (filled, filled["run-003"], filled.find("material == 'Si'")):
        data, _ = format_display_data(obj)
        assert set(data) == {"text/plain", "text/html"}
        assert data["text/plain"] == str(obj)
        assert data["text/html"] == obj._repr_html_()
        data, _ = shell.display_formatter.format(obj)
        assert data["text/plain"] == str(obj)
    shell.user_ns["rec"] = filled["run-003"]
    result = shell.run_cell("rec", silent=False)
    assert result.success and result.result is shell.user_ns["rec"]
    # IPython's object inspector (rec?) reads docstrings, not arrays
    info = shell.object_inspect("rec")
    assert info["found"] and "lazy proxy" in (info["docstring"] or "")


# -- headless Chromium ------------------------------------------------------------------------


def _browser() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


class _Cells(html.parser.HTMLParser):
    """Text of every table cell, per table, and the tags seen."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self.tags: list[str] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        self.tags.append(tag)
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


@pytest.mark.skipif(
    _browser() is None,
    reason="no chromium binary (apt-get install chromium; ./dev setup does it as root)",
)
def test_html_renders_as_tables_in_headless_chromium(filled: lv.Store, tmp_path: Path) -> None:
    rec = filled["run-003"]
    rec.positions
    page = tmp_path / "display.html"
    page.write_text(
        '<!doctype html><html><head><meta charset="utf-8"></head><body>'
        + filled._repr_html_()
        + rec._repr_html_()
        + filled.find("temperature > 400")._repr_html_()
        + "</body></html>",
        encoding="utf-8",
    )
    proc = subprocess.run(
        [
            str(_browser()),
            "--headless",
            "--no-sandbox",  # root in CI
            "--disable-gpu",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        # its caches and settings go under tmp_path, not the home directory
        env={
            **os.environ,
            "HOME": str(tmp_path),
            "XDG_CACHE_HOME": str(tmp_path / "cache"),
            "XDG_CONFIG_HOME": str(tmp_path / "config"),
        },
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = _Cells()
    dom.feed(proc.stdout)
    assert "script" not in dom.tags  # the <script> key stayed text
    store_table, fields, arrays, results = dom.tables
    assert store_table[0][:2] == ["key", "temperature"] and store_table[0][-2:] == [
        "arrays",
        "size",
    ]
    assert store_table[1][:2] == [EVIL, ""]
    assert store_table[2][:3] == ["run-000", "250.0", "'Ge'"]
    assert "positions float64 (100, 3)" in store_table[2][-2] and store_table[2][-1] == "2.4 KiB"
    assert store_table[-1] == ["... 6 more records"]
    assert ["params.lr", "0.001"] in fields
    assert arrays[0] == ["array", "shape", "dtype", "size", "order", "loaded"]
    assert arrays[1] == ["positions", "(100, 3)", "float64", "2.3 KiB", "C", "yes"]
    assert arrays[2] == ["frames/0", "(4,)", "int64", "32 B", "C", "no"]
    assert [row[0] for row in results[1:]] == [f"run-{i:03d}" for i in range(16, 25)]
