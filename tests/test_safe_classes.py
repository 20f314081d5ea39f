"""Trusted classes: ``Store.open(path, safe_classes=[Run])`` and ``loads(blob, safe_classes=[...])``
rebuild instances of exactly those classes without ``allow_pickle`` (from the listed class object,
nothing imported); everything else still needs ``allow_pickle``."""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import pickle
import subprocess
import sys
import textwrap
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import lazyvault as lv
from lazyvault import _layout


@dataclasses.dataclass
class Config:
    lr: float
    layers: list[int]


@dataclasses.dataclass
class Run:
    name: str
    positions: np.ndarray
    config: Config | None = None


class Plain:
    """An ordinary class whose state is its ``__dict__``."""

    def __init__(self, x: int) -> None:
        self.x = x
        self.weights = np.arange(4.0)

    def __eq__(self, other: object) -> bool:
        return type(other) is Plain and other.x == self.x


class Outer:
    @dataclasses.dataclass
    class Inner:
        v: int


class Ghost:
    """A class whose module cannot be imported: only the listed class object rebuilds it."""

    def __init__(self, v: int) -> None:
        self.v = v


Ghost.__module__ = "lazyvault_no_such_module"


@dataclasses.dataclass(slots=True)
class Slotted:
    x: int


class Reducing:
    def __reduce__(self) -> Any:
        return (Reducing, ())


class DictSub(dict):  # type: ignore[type-arg]
    pass


def make_run() -> Run:
    return Run("a", np.arange(5, dtype=np.int32), Config(1e-3, [64, 32]))


def test_listed_classes_load_without_allow_pickle(store_path: Path) -> None:
    with lv.Store.open(store_path) as s:
        s["run"] = make_run()
        s["plain"] = Plain(7)
        s["inner"] = {"i": Outer.Inner(3)}
    with lv.Store.open(store_path, "r", safe_classes=[Run, Config, Plain, Outer.Inner]) as s:
        assert s.safe_classes == (Run, Config, Plain, Outer.Inner)
        assert s.allow_pickle is False
        back = s["run"].load()
        assert type(back) is Run and type(back.config) is Config
        assert back.name == "a" and back.config == Config(1e-3, [64, 32])
        assert back.positions.tolist() == [0, 1, 2, 3, 4] and not back.positions.flags.writeable
        plain = s["plain"].load()
        assert type(plain) is Plain and plain.x == 7 and plain.weights.tolist() == [0, 1, 2, 3]
        assert s["inner"].load() == {"i": Outer.Inner(3)}


def test_unlisted_class_is_refused_naming_it_and_both_ways_out(store_path: Path) -> None:
    with lv.Store.open(store_path) as s:
        s["run"] = make_run()
    with lv.Store.open(store_path, "r") as s:
        with pytest.raises(lv.PickleNotAllowedError) as info:
            s["run"].load()
        assert s["run"].meta["name"] == "a"  # metadata stays readable
    message = str(info.value)
    assert f"{__name__}:Run" in message
    assert "safe_classes=[" in message and "allow_pickle=True" in message
    # a nested instance's class must be listed too: the message names it
    with lv.Store.open(store_path, "r", safe_classes=[Run]) as s:
        with pytest.raises(lv.PickleNotAllowedError, match=r"safe_classes=\[Config\]") as info:
            s["run"].load()
        assert f"{__name__}:Run" not in str(info.value)
    with lv.Store.open(store_path, "r", safe_classes=[Config]) as s:
        with pytest.raises(lv.PickleNotAllowedError, match=r"safe_classes=\[Run\]"):
            s["run"].load()


def test_a_pickled_part_still_needs_allow_pickle(store_path: Path) -> None:
    with lv.Store.open(store_path) as s:
        s["k"] = Run("b", np.zeros(2), Config(0.1, [1]))
        s["s"] = {"run": Run("c", np.zeros(2)), "tags": {"x", "y"}}  # a set: pickled
    with lv.Store.open(store_path, "r", safe_classes=[Run, Config]) as s:
        assert type(s["k"].load()) is Run
        with pytest.raises(lv.PickleNotAllowedError) as info:
            s["s"].load()
        # listing classes would not help: the message says allow_pickle only
        assert "allow_pickle=True" in str(info.value)
        assert "safe_classes=[" not in str(info.value)
    with lv.Store.open(store_path, "r", allow_pickle=True, safe_classes=[Run]) as s:
        back = s["s"].load()
        assert type(back["run"]) is Run and back["tags"] == {"x", "y"}


def test_object_arrays_still_need_allow_pickle(store_path: Path) -> None:
    with lv.Store.open(store_path) as s:
        s["o"] = Run("o", np.array([1, "x"], dtype=object))
    with lv.Store.open(store_path, "r", safe_classes=[Run]) as s:
        with pytest.raises(lv.PickleNotAllowedError, match="object array"):
            s["o"].load()


@pytest.mark.parametrize(
    ("bad", "error", "words"),
    [
        ([1], TypeError, "holds 1, which is not a class"),
        ([Run, "Config"], TypeError, "holds 'Config', which is not a class"),
        ([make_run()], TypeError, "not a class"),
        (Run, TypeError, "must be a list of classes"),
        ("Run", TypeError, "must be a list of classes"),
        (None, TypeError, "must be a list of classes"),
        ([Slotted], ValueError, "Slotted.*needs allow_pickle"),
        ([Reducing], ValueError, "Reducing.*needs allow_pickle"),
        ([DictSub], ValueError, "DictSub.*needs allow_pickle"),
        ([int], ValueError, "builtins:int"),
        ([lv.Record], ValueError, "lazyvault.record:Record"),
    ],
)
def test_bad_safe_classes_are_refused_at_open(
    tmp_path: Path, bad: Any, error: type[Exception], words: str
) -> None:
    path = tmp_path / "new.lv"
    with pytest.raises(error, match=words):
        lv.Store.open(path, safe_classes=bad)
    assert not path.exists()  # nothing written on refusal
    blob = lv.dumps({"x": 1})
    with pytest.raises(error, match=words):
        lv.loads(blob, safe_classes=bad)


def test_a_class_defined_in_a_function_is_refused() -> None:
    @dataclasses.dataclass
    class Local:
        x: int

    # lazyvault pickles instances of such a class: listing it cannot help
    with pytest.raises(ValueError, match="defined in a function"):
        lv.loads(lv.dumps(1), safe_classes=[Local])


def test_the_listed_class_is_used_without_any_import(
    store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with lv.Store.open(store_path) as s:
        s["g"] = {"ghost": Ghost(5)}
        s["run"] = make_run()
    # allow_pickle imports the class by name, which fails for Ghost
    with lv.Store.open(store_path, "r", allow_pickle=True) as s:
        with pytest.raises(lv.CorruptError, match="lazyvault_no_such_module"):
            s["g"].load()
    listed = Run
    monkeypatch.delattr(sys.modules[__name__], "Run")  # gone from its module
    monkeypatch.setattr(_layout, "_find_class", _no_import)  # the one way a class is imported
    with lv.Store.open(store_path, "r", safe_classes=[Ghost, listed, Config]) as s:
        ghost = s["g"].load()["ghost"]
        assert type(ghost) is Ghost and ghost.v == 5
        assert type(s["run"].load()) is listed


def _no_import(spec: str) -> Any:
    raise AssertionError(f"imported {spec}")


def test_the_name_is_matched_a_redefined_class_is_used(store_path: Path) -> None:
    # as when a notebook cell defining the class runs again
    first = type("Point", (), {"__module__": __name__, "__qualname__": "Point"})
    second = type("Point", (), {"__module__": __name__, "__qualname__": "Point"})
    p = first()
    p.x = 1
    with lv.Store.open(store_path) as s:
        s["p"] = p
    with lv.Store.open(store_path, "r", safe_classes=[second]) as s:
        back = s["p"].load()
    assert type(back) is second and back.x == 1


def test_loads_takes_safe_classes() -> None:
    blob = lv.dumps(make_run())
    with pytest.raises(lv.PickleNotAllowedError, match=r"safe_classes=\["):
        lv.loads(blob)
    back = lv.loads(blob, safe_classes=[Run, Config])
    assert type(back) is Run and back.config == Config(1e-3, [64, 32])
    with pytest.raises(lv.PickleNotAllowedError):
        lv.loads(lv.dumps({"r": make_run(), "s": {1}}), safe_classes=[Run, Config])


def test_archives_take_safe_classes(store: lv.Store, tmp_path: Path) -> None:
    store["run"] = make_run()
    path = tmp_path / "runs.lvz"
    store.export(path)
    with lv.Store.open(path) as archive:
        with pytest.raises(lv.PickleNotAllowedError):
            archive["run"].load()
    with lv.Store.open(path, safe_classes=[Run, Config]) as archive:
        assert isinstance(archive, lv.Archive) and archive.safe_classes == (Run, Config)
        assert type(archive["run"].load()) is Run
        again = pickle.loads(pickle.dumps(archive))
        assert again.safe_classes == (Run, Config) and again.allow_pickle is False
        assert type(again["run"].load().config) is Config
    with pytest.raises(TypeError, match="not a class"):
        lv.Store.open(path, safe_classes=["Run"])


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_pickled_records_and_stores_keep_safe_classes(store_path: Path, protocol: int) -> None:
    with lv.Store.open(store_path) as s:
        s["run"] = make_run()
        s["s"] = {"tags": {1}}
    with lv.Store.open(store_path, "r", safe_classes=[Run, Config]) as s:
        rec = s["run"]
        by_value = pickle.loads(pickle.dumps(rec, protocol=protocol))
        assert type(by_value.load()) is Run
        with pytest.raises(lv.PickleNotAllowedError):
            pickle.loads(pickle.dumps(s["s"], protocol=protocol)).load()
        ref = pickle.loads(pickle.dumps(rec.ref(), protocol=protocol))
        assert ref.safe_classes == (Run, Config) and ref.allow_pickle is False
        assert type(ref.open().load().config) is Config
        by_reference = pickle.loads(ForkingPickler.dumps(rec, protocol=protocol))
        assert type(by_reference.load()) is Run
        store = pickle.loads(pickle.dumps(s, protocol=protocol))
        assert store.safe_classes == (Run, Config)
        assert type(store["run"].load()) is Run
        store.close()


def _load_in_child(rec: lv.Record) -> tuple[str, str]:
    run = rec.load()
    return type(run).__qualname__, type(run.config).__qualname__


@pytest.mark.parametrize("method", ["spawn"])
def test_records_of_a_trusting_store_load_in_a_pool(store_path: Path, method: str) -> None:
    with lv.Store.open(store_path) as s:
        s["run"] = make_run()
    with lv.Store.open(store_path, "r", safe_classes=[Run, Config]) as s:
        with multiprocessing.get_context(method).Pool(1) as pool:
            assert pool.map(_load_in_child, [s["run"]]) == [("Run", "Config")]


def _script(tmp_path: Path, name: str, text: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / name
    script.write_text(textwrap.dedent(text))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120
    )


def test_classes_defined_in_main(tmp_path: Path) -> None:
    # a script (or a notebook) defines its class in __main__; a second script,
    # whose __main__ is another module, defines its own Run: matched by name
    header = """
        import dataclasses, sys
        import numpy as np
        import lazyvault as lv

        @dataclasses.dataclass
        class Run:
            name: str
            data: np.ndarray
    """
    path = tmp_path / "m.lv"
    writer = _script(
        tmp_path,
        "writer.py",
        header
        + f"""
        with lv.Store.open({str(path)!r}) as s:
            s["r"] = Run("x", np.arange(3))
        with lv.Store.open({str(path)!r}, "r") as s:
            try:
                s["r"].load()
            except lv.PickleNotAllowedError as e:
                print("refused:", e)
        with lv.Store.open({str(path)!r}, "r", safe_classes=[Run]) as s:
            back = s["r"].load()
            print("loaded", type(back) is Run, back.data.tolist())
        """,
    )
    assert writer.returncode == 0, writer.stderr
    assert "refused: record 'r': loading it rebuilds instances of __main__:Run" in writer.stdout
    assert "safe_classes=[Run]" in writer.stdout
    assert "loaded True [0, 1, 2]" in writer.stdout
    reader = _script(
        tmp_path,
        "reader.py",
        header
        + f"""
        print("loaded", type(lv.Store.open({str(path)!r}, "r", safe_classes=[Run])["r"].load()))
        """,
    )
    assert reader.returncode == 0, reader.stderr
    assert "loaded <class '__main__.Run'>" in reader.stdout


# -- Record subclasses pickle as themselves ----------------------------------


class Trial(lv.Record):
    """A user's subclass of Record, adding a property (no __slots__: it has a __dict__)."""

    @property
    def doubled(self) -> float:
        return float(self.meta["t"]) * 2


class SlimTrial(lv.Record):
    __slots__ = ()


def _as(cls: type[lv.Record], rec: lv.Record) -> Any:
    from lazyvault.record import entry_of, source_of

    return cls(source_of(rec), rec.key, entry_of(rec))


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_record_subclasses_pickle_as_themselves(store: lv.Store, protocol: int) -> None:
    store["k"] = {"t": 1.5, "image": np.arange(6.0).reshape(2, 3)}
    trial = _as(Trial, store["k"])
    trial.note = "kept"
    back = pickle.loads(pickle.dumps(trial, protocol=protocol))
    assert type(back) is Trial and back.doubled == 3.0 and back.note == "kept"
    assert back.image.tolist() == store["k"].image.tolist()
    slim = pickle.loads(pickle.dumps(_as(SlimTrial, store["k"]), protocol=protocol))
    assert type(slim) is SlimTrial and slim.t == 1.5
    # by reference (multiprocessing's pickler) too
    ref = pickle.loads(ForkingPickler.dumps(trial, protocol=protocol))
    assert type(ref) is Trial and ref.note == "kept" and ref["image"].shape == (2, 3)
    # a plain record stays a Record (its array-property class)
    plain = pickle.loads(pickle.dumps(store["k"], protocol=protocol))
    assert type(plain) is type(store["k"]) and isinstance(plain, lv.Record)


def _subclass_in_child(rec: lv.Record) -> tuple[str, float, float]:
    assert isinstance(rec, Trial)
    return type(rec).__name__, rec.doubled, float(rec.image.sum())


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_record_subclasses_cross_a_pool(store: lv.Store, method: str) -> None:
    if method not in multiprocessing.get_all_start_methods():
        pytest.skip(f"no {method}")
    store["k"] = {"t": 2.0, "image": np.ones(4)}
    store.flush()
    with multiprocessing.get_context(method).Pool(1) as pool:
        assert pool.map(_subclass_in_child, [_as(Trial, store["k"])]) == [("Trial", 4.0, 4.0)]


def test_readme_example_runs(tmp_path: Path) -> None:
    """The README's "Your own classes" block runs as a script (its class lives in __main__)."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme.split("### Your own classes", 1)[1]
    block = section.split("```python\n", 1)[1].split("```", 1)[0]
    script = tmp_path / "example.py"
    script.write_text(block + "print(type(run).__qualname__, run.positions.tolist())\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "Run [1.0, 1.0, 1.0]\n"
    assert (tmp_path / "runs.lv" / "lazyvault.json").exists()


def test_main_classes_in_spawn_workers(tmp_path: Path) -> None:
    # spawn (and forkserver) workers import the main script as __mp_main__:
    # its classes were named __mp_main__:Run there, so a record sent to a
    # worker was refused although Run was listed, and a record written in a
    # worker could not be loaded by the main script (a fresh user's trial)
    proc = _script(
        tmp_path,
        "spawned.py",
        """
        import dataclasses, multiprocessing, os
        import numpy as np
        import lazyvault as lv

        @dataclasses.dataclass
        class Run:
            name: str
            positions: np.ndarray

        def load_in_worker(rec):
            return type(rec.load()).__name__

        def write_in_worker(path):
            with lv.Store.open(path, "a") as s:
                s["w"] = Run("w", np.ones(2))

        if __name__ == "__main__":
            path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "runs.lv")
            with lv.Store.open(path) as s:
                s["a"] = Run("a", np.zeros(3))
            with multiprocessing.get_context("spawn").Pool(1) as pool:
                with lv.Store.open(path, "r", safe_classes=[Run]) as s:
                    print("worker loaded", pool.map(load_in_worker, [s["a"]]))
                pool.map(write_in_worker, [path])
            with lv.Store.open(path, "r", safe_classes=[Run]) as s:
                print("main loaded", type(s["w"].load()).__name__, s["w"].load().name)
        """,
    )
    assert proc.returncode == 0, proc.stderr
    assert "worker loaded ['Run']" in proc.stdout
    assert "main loaded Run w" in proc.stdout
