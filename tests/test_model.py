"""Model-based test: random sequences of puts, overwrites, deletes, flushes,
close/reopen, gc and verify against a dict oracle (hypothesis
RuleBasedStateMachine). After every step the store holds exactly what the
oracle holds: keys, metadata (types and order included), array bytes,
dtypes and memory order; and arrays mapped earlier keep their data whatever
happened to their records since (FORMAT.md, "Record journal")."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import lazyvault as lv

# A few fixed keys make overwrites and deletes frequent; hostile ones too.
FIXED_KEYS = ["a", "b", "run/0001", "../up", "/abs", "🦀", "é" * 3, " "]
KEYS = st.one_of(st.sampled_from(FIXED_KEYS), st.text(min_size=1, max_size=6))

JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
METAS = st.fixed_dictionaries(
    {},
    optional={
        "n": st.integers(-(2**63), 2**63 - 1),
        "t": JSON_SCALARS,
        "name": st.text(max_size=12),
        "tags": st.lists(JSON_SCALARS, max_size=3),
        "nested": st.dictionaries(st.text(max_size=4), JSON_SCALARS, max_size=3),
    },
)
# Not JSON: goes to the pickled remainder (the store allows pickle).
LEFTOVERS = st.fixed_dictionaries({}, optional={"s": st.sets(st.integers(0, 9), max_size=3)})

DTYPES = [
    np.dtype("?"),
    np.dtype("i1"),
    np.dtype("<u2"),
    np.dtype(">i4"),
    np.dtype("<i8"),
    np.dtype("<f2"),
    np.dtype(">f4"),
    np.dtype("<f8"),
    np.dtype("<c8"),
    np.dtype(">c16"),
    np.dtype("<M8[s]"),
    np.dtype(">m8[ms]"),
    np.dtype("S4"),
    np.dtype("<U3"),
    np.dtype([("x", "<i2"), ("y", ">f4")]),
]


@st.composite
def arrays(draw: st.DrawFn) -> np.ndarray:
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=6))
    array = draw(hnp.arrays(dtype, shape))
    if draw(st.booleans()):
        array = np.asfortranarray(array)
    return array


ARRAYS = st.lists(arrays(), max_size=2).map(lambda a: {f"arr{i}": x for i, x in enumerate(a)})


def same_json(got: Any, want: Any) -> bool:
    """Equal with the same types (1 is not 1.0 nor True) and key order."""
    if type(got) is not type(want):
        return False
    if isinstance(want, dict):
        return list(got) == list(want) and all(same_json(got[k], want[k]) for k in want)
    if isinstance(want, list):
        return len(got) == len(want) and all(map(same_json, got, want))
    return bool(got == want)


def fortran_only(a: np.ndarray) -> bool:
    return a.flags.f_contiguous and not a.flags.c_contiguous


def assert_same_array(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert type(got) is np.ndarray, what
    assert got.dtype == want.dtype and got.dtype.str == want.dtype.str, what
    assert got.shape == want.shape, what
    assert got.tobytes(order="A") == want.tobytes(order="A"), what
    assert fortran_only(got) == fortran_only(want), what
    assert not got.flags.writeable, what


class StoreModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="lazyvault-model-"))
        self.path = self.dir / "model.lv"
        self.store = lv.Store.open(self.path, allow_pickle=True)
        # key -> (JSON metadata, leftovers, {name: array})
        self.model: dict[str, tuple[dict[str, Any], dict[str, Any], dict[str, np.ndarray]]] = {}
        # arrays mapped in earlier steps, with the bytes they must keep
        self.held: list[tuple[np.ndarray, np.ndarray, str]] = []

    def teardown(self) -> None:
        self.store.close()
        self.held.clear()
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- rules ------------------------------------------------------------------

    @rule(key=KEYS, meta=METAS, leftovers=LEFTOVERS, arrays=ARRAYS)
    def put(
        self,
        key: str,
        meta: dict[str, Any],
        leftovers: dict[str, Any],
        arrays: dict[str, np.ndarray],
    ) -> None:
        self.store[key] = {**meta, **leftovers, **arrays}
        self.model[key] = (meta, leftovers, {n: a.copy(order="K") for n, a in arrays.items()})

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.model)))
        del self.store[key]
        del self.model[key]

    @rule(key=KEYS)
    def delete_missing(self, key: str) -> None:
        if key in self.model:
            return
        try:
            del self.store[key]
        except KeyError as e:
            assert isinstance(e, lv.MissingKeyError)
        else:
            raise AssertionError(f"deleting missing key {key!r} did not raise")

    @precondition(lambda self: any(arrays for _, _, arrays in self.model.values()))
    @rule(data=st.data())
    def hold_an_array(self, data: st.DataObject) -> None:
        """Maps an array and keeps it: later overwrites, deletes, flushes,
        gc and reopening must not change what it shows."""
        key = data.draw(st.sampled_from(sorted(k for k, v in self.model.items() if v[2])))
        name = data.draw(st.sampled_from(sorted(self.model[key][2])))
        self.held.append((self.store[key].array(name), self.model[key][2][name], f"{key}/{name}"))
        del self.held[:-6]

    @rule()
    def flush(self) -> None:
        self.store.flush()

    @rule()
    def reopen(self) -> None:
        self.store.close()
        assert self.store.closed
        self.store = lv.Store.open(self.path, allow_pickle=True)

    @rule()
    def gc(self) -> None:
        report = self.store.gc()
        assert set(report) == {
            "removed_files",
            "removed_bytes",
            "journal_bytes_freed",
            "packs_compacted",
            "packs_damaged",
        }
        assert report["removed_files"] >= 0 and report["removed_bytes"] >= 0
        assert self.store.verify()["orphans"] == []

    @rule()
    def verify(self) -> None:
        report = self.store.verify()
        assert report["ok"] and report["problems"] == [], report
        # packs of replaced or deleted records wait for gc() (other records may use them)
        assert all(o.endswith(".npz") for o in report["orphans"]), report
        assert report["records"] == len(self.model)
        assert report["arrays"] == sum(len(v[2]) for v in self.model.values())

    @rule()
    def query(self) -> None:
        want = sorted(k for k, (meta, _, _) in self.model.items() if meta.get("n", -1) >= 0)
        assert self.store.keys("n >= 0") == want
        assert self.store.count("n >= 0") == len(want)

    # -- invariants -----------------------------------------------------------

    @invariant()
    def same_keys(self) -> None:
        assert len(self.store) == len(self.model)
        assert list(self.store) == sorted(self.model)  # code point order

    @invariant()
    def same_values(self) -> None:
        for key, (meta, leftovers, arrays) in self.model.items():
            rec = self.store[key]
            assert rec.key == key
            assert same_json(rec.meta, meta), (key, rec.meta, meta)
            assert list(rec.arrays) == list(arrays), key
            for name, want in arrays.items():
                info = rec.arrays[name]
                assert (info.shape, info.dtype, info.nbytes) == (
                    want.shape,
                    want.dtype,
                    want.nbytes,
                )
                assert info.order == ("F" if fortran_only(want) else "C")
                assert_same_array(rec.array(name), want, f"{key}/{name}")
            loaded = rec.load()
            assert list(loaded) == [*meta, *leftovers, *arrays]
            for name, want in leftovers.items():
                assert loaded[name] == want
            for name, want in arrays.items():
                assert_same_array(loaded[name], want, f"{key}/{name} (load)")

    @invariant()
    def held_arrays_keep_their_data(self) -> None:
        for got, want, what in self.held:
            assert_same_array(got, want, f"held {what}")


StoreModel.TestCase.settings = settings(
    max_examples=30,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestStoreModel = StoreModel.TestCase
