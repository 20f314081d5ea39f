"""numpy's own test arrays (numpy/lib/tests/test_format.py, shipped in
numpy's wheel) through every path: a store (reopened), ``np.load`` of the
payload file, ``lv.dumps``/``lv.loads``, pickle protocol 5 with out-of-band
buffers (PEP 574), and ``.npz`` export and import. Only ``object`` arrays
need ``allow_pickle``, as with numpy; headers past numpy's default 10,000
bytes need ``max_header_size``, as with numpy.
"""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import lazyvault as lv

from conftest import load_with_numpy

test_format: Any = pytest.importorskip("numpy.lib.tests.test_format")


def _descr_to_dtype_cases() -> list[np.dtype]:
    """The dtypes ``test_descr_to_dtype`` is parametrized with."""
    (mark,) = [m for m in test_format.test_descr_to_dtype.pytestmark if m.name == "parametrize"]
    return list(mark.args[1])


def _cases() -> list[tuple[str, np.ndarray]]:
    cases = [(f"basic{i}", a) for i, a in enumerate(test_format.basic_arrays)]
    cases += [(f"record{i}", a) for i, a in enumerate(test_format.record_arrays)]
    # the padded dtypes of test_load_padded_dtype (aligned, offsets, titles, empty)
    for i in range(1, 7):
        padded = np.zeros(3, getattr(test_format, f"dt{i}"))
        for j in range(3):
            padded[j] = j + 5
        cases.append((f"padded{i}", padded))
    cases += [(f"descr{i}", np.zeros(3, dt)) for i, dt in enumerate(_descr_to_dtype_cases())]
    cases.append(("void0", np.zeros((2, 3), "V0")))
    # test_version_2_0's dtype: a header of ~70 KB (version 2.0 of the format)
    cases.append(("wide", np.ones(10, [(f"{i}" * 100, float) for i in range(500)])))
    return cases


CASES = _cases()


def _same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_the_cases_are_numpys() -> None:
    # numpy's lists, not a copy: a nested subarray field and struct of subarrays are among them
    descrs = {str(a.dtype.descr) for _, a in CASES}
    assert "[('c', ('<f8', (5,)), (2,))]" in descrs
    assert len(CASES) > 60


# np.load's limit for the widest header here (numpy's default is 10,000)
MAX_HEADER = 1 << 20


@pytest.mark.parametrize(("name", "array"), CASES, ids=[n for n, _ in CASES])
def test_store_round_trip(tmp_path: Path, name: str, array: np.ndarray) -> None:
    path = tmp_path / "s.lv"
    pickled = array.dtype.hasobject
    with lv.Store.open(path, allow_pickle=pickled) as store:
        store[name] = {"a": array}
        _same(store[name].a, array)
    with lv.Store.open(path, mode="r", allow_pickle=pickled) as store:
        _same(store[name].a, array)
        _same(lv.loads(lv.dumps({"a": store[name].a}), allow_pickle=pickled)["a"], array)
        buffers: list[pickle.PickleBuffer] = []
        blob = pickle.dumps(store[name], protocol=5, buffer_callback=buffers.append)
        _same(pickle.loads(blob, buffers=buffers).a, array)
        store.export(tmp_path / "out.npz")
        assert store.verify()["ok"]
    with lv.Store.open(path, mode="r") as store:
        entry = dict(store[name]._record["arrays"]["a"])
    kwargs = {"allow_pickle": pickled, "max_header_size": MAX_HEADER}
    _same(load_with_numpy(path, entry, **kwargs), array)
    with np.load(tmp_path / "out.npz", allow_pickle=pickled, max_header_size=MAX_HEADER) as npz:
        _same(npz[f"{name}/a"], array)
    with lv.Store.open(tmp_path / "again.lv", allow_pickle=pickled) as again:
        (key,) = again.import_file(tmp_path / "out.npz", max_header_size=MAX_HEADER)
        _same(again[key].a, array)


def test_a_plain_npy_of_each_imports(tmp_path: Path) -> None:
    for name, array in CASES:
        with warnings.catch_warnings():
            # np.save says a version-2.0 header needs numpy >= 1.9
            warnings.filterwarnings("ignore", "Stored array in format 2.0", UserWarning)
            np.save(tmp_path / f"{name}.npy", array)
    with lv.Store.open(tmp_path / "s.lv", allow_pickle=True) as store:
        with pytest.raises(lv.InvalidFileError, match="header"):
            store.import_file(tmp_path / "wide.npy")
        keys = store.import_file(tmp_path, max_header_size=MAX_HEADER)
        assert len(keys) == len(CASES)
        for name, array in CASES:
            _same(store[name].data, array)
