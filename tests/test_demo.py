"""Tests of the demo ``examples/visp_demo.py``: the ViSP frame ingest, its
figures, the PGM reader, its command line.

The tests marked ``needs_visp`` run the demo on Debian's ``visp-images-data``
(skipped when it is not installed); the others build small data sets of
their own.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import lazyvault as lv

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load_example(name: str) -> ModuleType:
    """``examples/<name>.py`` as a module: the examples are scripts beside
    the package, not part of it."""
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


demo = load_example("visp_demo")

DATA = Path(os.environ.get("LAZYVAULT_VISP_DATA", demo.DEFAULT_DATA_DIR))
LIMIT = 60

needs_visp = pytest.mark.skipif(
    not DATA.is_dir(),
    reason=f"{DATA} is missing: apt-get install visp-images-data (or set LAZYVAULT_VISP_DATA)",
)


# -- independent readers (plain numpy, no lazyvault code) ---------------------


def numpy_pgm(path: Path) -> np.ndarray:
    """A P5 PGM without header comments, as the ViSP sequences are written."""
    data = path.read_bytes()
    m = re.match(rb"P5\s+(\d+)\s+(\d+)\s+(\d+)\s", data)
    assert m is not None, f"{path}: unexpected PGM header {data[:40]!r}"
    width, height, maxval = (int(g) for g in m.groups())
    dtype = np.dtype("u1") if maxval < 256 else np.dtype(">u2")
    pixels = np.frombuffer(data, dtype=dtype, count=width * height, offset=m.end())
    return pixels.reshape(height, width)


def numpy_depth(path: Path) -> np.ndarray:
    height, width = np.fromfile(path, dtype="<u4", count=2)
    return np.fromfile(path, dtype="<u2", offset=8).reshape(height, width)


def pgm_bytes(pixels: np.ndarray, maxval: int, header_comment: bytes = b"") -> bytes:
    height, width = pixels.shape
    dtype = ">u2" if maxval > 255 else "u1"
    head = b"P5\n" + header_comment + f"{width} {height}\n{maxval}\n".encode()
    return head + pixels.astype(dtype).tobytes()


# -- the demo on the real data --------------------------------------------------


@pytest.fixture(scope="module")
def visp_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    if not DATA.is_dir():
        pytest.skip(f"{DATA} is missing: apt-get install visp-images-data")
    path = tmp_path_factory.mktemp("visp") / "visp.lv"
    figures = demo.run(DATA, store_path=path, limit=LIMIT)
    return figures, path


@pytest.fixture(scope="module")
def visp_records(visp_run: tuple[dict[str, Any], Path]) -> dict[str, dict[str, Any]]:
    """``{key: {"meta": ..., "arrays": ...}}`` read back from the store."""
    _, path = visp_run
    with lv.Store.open(path, mode="r") as store:
        return {key: {"meta": store[key].meta, "arrays": store[key].arrays} for key in store}


@needs_visp
def test_limit_spreads_over_sequences(visp_run: tuple[dict[str, Any], Path]) -> None:
    figures, _ = visp_run
    assert figures["records"] == LIMIT
    assert sum(figures["sequences"].values()) == LIMIT
    assert len(figures["sequences"]) >= 2
    # Round-robin: no sequence gets more than its fair share plus one.
    fair = -(-LIMIT // len(figures["sequences_found"]))
    assert max(figures["sequences"].values()) <= fair + 1


@needs_visp
def test_one_record_per_pgm_file(
    visp_run: tuple[dict[str, Any], Path], visp_records: dict[str, dict[str, Any]]
) -> None:
    figures, _ = visp_run
    sources = [r["meta"]["source"] for r in visp_records.values()]
    assert len(visp_records) == figures["records"] == LIMIT
    assert len(set(sources)) == len(sources)
    for key, rec in visp_records.items():
        meta = rec["meta"]
        assert (DATA / meta["source"]).is_file()
        assert meta["source"].endswith(".pgm")
        assert key == f"{meta['sequence']}/{meta['frame']:04d}"
    counts = Counter(r["meta"]["sequence"] for r in visp_records.values())
    assert dict(counts) == figures["sequences"]


@needs_visp
def test_images_equal_the_pgm_pixels(visp_run: tuple[dict[str, Any], Path]) -> None:
    _, path = visp_run
    with lv.Store.open(path, mode="r") as store:
        for key in store:
            rec = store[key]
            expected = numpy_pgm(DATA / rec.meta["source"])
            image = rec.image
            assert image.dtype == np.uint8
            assert image.shape == (rec.meta["height"], rec.meta["width"]) == expected.shape
            assert np.array_equal(image, expected), key
            assert not image.flags.writeable
            assert rec.meta["mean_intensity"] == pytest.approx(expected.mean(), abs=1e-3)


@needs_visp
def test_depth_and_pose_equal_their_files(visp_run: tuple[dict[str, Any], Path]) -> None:
    _, path = visp_run
    seen = Counter()
    with lv.Store.open(path, mode="r") as store:
        for key in store:
            rec = store[key]
            meta = rec.meta
            assert ("depth" in rec.arrays) == meta["has_depth"], key
            assert ("pose" in rec.arrays) == meta["has_pose"], key
            if meta["has_depth"]:
                seen["depth"] += 1
                expected = numpy_depth(DATA / meta["depth_source"])
                assert rec.depth.dtype == np.uint16
                assert rec.depth.dtype.isnative
                assert np.array_equal(rec.depth, expected), key
            if meta["has_pose"]:
                seen["pose"] += 1
                expected = np.loadtxt(DATA / meta["pose_source"])
                assert rec.pose.dtype == np.float64 and rec.pose.shape == (4, 4)
                assert np.array_equal(rec.pose, expected), key
                assert np.array_equal(rec.pose[3], [0, 0, 0, 1])
    assert seen["depth"] > 0 and seen["pose"] > 0


EXPECTED_QUERIES = {
    "sequence == 'mire-2' and frame < 100": lambda m, a: (
        m["sequence"] == "mire-2" and m["frame"] < 100
    ),
    "width >= 640": lambda m, a: m["width"] >= 640,
    "has_depth == true": lambda m, a: m["has_depth"] is True,
    "image.shape[0] > 300": lambda m, a: a["image"].shape[0] > 300,
    "mean_intensity > 128": lambda m, a: m["mean_intensity"] > 128,
}


@needs_visp
def test_query_hits_match_python(
    visp_run: tuple[dict[str, Any], Path], visp_records: dict[str, dict[str, Any]]
) -> None:
    figures, path = visp_run
    assert [q["expr"] for q in figures["queries"]] == list(EXPECTED_QUERIES)
    expected = {
        expr: sorted(k for k, r in visp_records.items() if pred(r["meta"], r["arrays"]))
        for expr, pred in EXPECTED_QUERIES.items()
    }
    # The queries must discriminate, or a match-everything evaluator would pass.
    for expr, keys in expected.items():
        assert 0 < len(keys) < LIMIT, expr
    assert {q["expr"]: q["hits"] for q in figures["queries"]} == {
        expr: len(keys) for expr, keys in expected.items()
    }
    with lv.Store.open(path, mode="r") as store:
        for expr, keys in expected.items():
            assert store.find(expr).keys() == keys, expr


@needs_visp
def test_stored_bytes_match_the_files(
    visp_run: tuple[dict[str, Any], Path], visp_records: dict[str, dict[str, Any]]
) -> None:
    figures, path = visp_run
    files = [p for p in (path / "arrays").rglob("*") if p.is_file()]
    # payload files, and packs holding the small arrays
    assert all(p.suffix in (".npy", ".npz") for p in files)
    assert figures["payload_files"] == len(files)
    assert figures["payload_file_bytes"] == figures["stored_bytes"]
    assert figures["stored_bytes"] == sum(p.stat().st_size for p in files)
    infos = [info for r in visp_records.values() for info in r["arrays"].values()]
    assert figures["arrays"] == len(infos) >= len(files)
    assert figures["array_nbytes"] == sum(info.nbytes for info in infos)
    # Each .npy header (and pack member header) is small and 64-byte aligned.
    overhead = figures["payload_file_bytes"] - figures["array_nbytes"]
    assert 0 < overhead <= 4096 * len(infos)
    assert figures["ingest_seconds"] > 0 and figures["ingest_mb_per_s"] > 0


@needs_visp
@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs /proc/self/smaps")
def test_faulted_in_bytes_far_below_stored(visp_run: tuple[dict[str, Any], Path]) -> None:
    figures, _ = visp_run
    # The queries mapped no payload at all.
    assert figures["mapped_after_queries"] == {"mappings": 0, "size": 0, "rss": 0}
    touched = figures["touched"]
    assert len({t["key"].rsplit("/", 1)[0] for t in touched}) == 3
    assert all(t["matches_source"] for t in touched)
    assert figures["mapped_after_touch"]["mappings"] == len(touched)
    faulted = figures["faulted_in_bytes"]
    # Every byte of the summed images was faulted in, and little else.
    assert faulted >= figures["touched_nbytes"]
    assert faulted <= figures["touched_nbytes"] + len(touched) * 64 * 1024
    assert faulted * 20 < figures["stored_bytes"]


@needs_visp
def test_find_sequences_takes_every_numbered_pgm_frame() -> None:
    expected: dict[Path, list[Path]] = {}
    for path in DATA.rglob("*.pgm"):
        if re.search(r"\d+\.pgm$", path.name):
            expected.setdefault(path.parent, []).append(path)
    frames = {p for paths in expected.values() if len(paths) >= 2 for p in paths}
    sequences = demo.find_sequences(DATA)
    found = [f.image for s in sequences for f in s.frames]
    assert len(found) == len(set(found)) == len(frames)
    assert set(found) == frames
    by_name = {s.name: s for s in sequences}
    assert {"mire-2", "cube", "ellipse-1", "line", "mbt/cube"} <= set(by_name)
    castle = by_name["mbt-depth/Castle-simu"]
    assert all(f.depth is not None and f.pose is not None for f in castle.frames)
    assert castle.frames[0].pose == DATA / "mbt-depth/Castle-simu/CameraPose/Camera_001.txt"
    assert all(f.pose is None for f in by_name["mire-2"].frames)


# -- the PGM reader -------------------------------------------------------------


def test_read_pgm_8_bit_with_comments(tmp_path: Path) -> None:
    pixels = np.arange(12, dtype=np.uint8).reshape(3, 4) * 20
    data = b"P5 # a comment\n4 # width\n3\n255# after maxval\n" + pixels.tobytes()
    (tmp_path / "a.pgm").write_bytes(data)
    image = demo.read_pgm(tmp_path / "a.pgm")
    assert image.dtype == np.uint8 and image.shape == (3, 4)
    assert np.array_equal(image, pixels)


@pytest.mark.parametrize("maxval", [256, 4095, 65535])
def test_read_pgm_16_bit_is_big_endian_to_native(tmp_path: Path, maxval: int) -> None:
    pixels = np.array([[0, 1, 255, 256], [maxval, maxval // 2, 258, 3]], dtype=np.uint16)
    raw = pgm_bytes(pixels, maxval)
    assert raw[-2:] == b"\x00\x03"  # big-endian on disk
    (tmp_path / "b.pgm").write_bytes(raw)
    image = demo.read_pgm(tmp_path / "b.pgm")
    assert image.dtype == np.uint16 and image.dtype.isnative
    assert np.array_equal(image, pixels)  # samples kept, never rescaled


def test_read_pgm_keeps_small_maxval_samples(tmp_path: Path) -> None:
    pixels = np.array([[0, 7, 15]], dtype=np.uint8)
    (tmp_path / "c.pgm").write_bytes(pgm_bytes(pixels, 15))
    assert np.array_equal(demo.read_pgm(tmp_path / "c.pgm"), pixels)


@pytest.mark.parametrize(
    "data",
    [
        b"P2\n2 1\n255\n0 1\n",
        b"P5\n2 2\n255\n\x00\x01\x02",
        b"P5\n2 x\n255\n\x00\x01",
        b"P5\n2 1\n70000\n\x00\x01\x00\x01",
        b"P5\n0 1\n255\n",
    ],
    ids=["plain", "truncated", "bad-number", "bad-maxval", "zero-width"],
)
def test_read_pgm_rejects_malformed_files(data: bytes) -> None:
    with pytest.raises(ValueError):
        demo.parse_pgm(data)


# -- ingest on a small data set of our own ----------------------------------------


def make_data(root: Path) -> dict[str, Any]:
    """Two sequences (one 16-bit, one with depth and poses), and files to ignore."""
    rng = np.random.default_rng(0)
    images: dict[str, np.ndarray] = {}
    seq_a = root / "seqA"
    seq_a.mkdir(parents=True)
    for n in (1, 2, 3):
        pixels = rng.integers(0, 4096, size=(5, 7), dtype=np.uint16)
        (seq_a / f"frame_{n:04d}.pgm").write_bytes(pgm_bytes(pixels, 4095))
        images[f"seqA/{n:04d}"] = pixels
    seq_b = root / "set" / "seqB"
    for sub in ("Images", "Depth", "CameraPose"):
        (seq_b / sub).mkdir(parents=True)
    depths, poses = {}, {}
    for n in (0, 1):
        pixels = rng.integers(0, 256, size=(4, 6), dtype=np.uint8)
        (seq_b / "Images" / f"Image_{n:04d}.pgm").write_bytes(pgm_bytes(pixels, 255))
        images[f"set/seqB/{n:04d}"] = pixels
        depth = rng.integers(0, 65536, size=(4, 6), dtype=np.uint16)
        header = np.array([4, 6], dtype="<u4").tobytes()
        (seq_b / "Depth" / f"Depth_{n:04d}.bin").write_bytes(header + depth.astype("<u2").tobytes())
        depths[f"set/seqB/{n:04d}"] = depth
        pose = np.eye(4)
        pose[:3, 3] = [n, 0.5, -1.25]
        np.savetxt(seq_b / "CameraPose" / f"Camera_{n:03d}.txt", pose)
        poses[f"set/seqB/{n:04d}"] = pose
    (root / "single").mkdir()
    (root / "single" / "photo1.pgm").write_bytes(pgm_bytes(np.zeros((2, 2), np.uint8), 255))
    (root / "single" / "notes.xml").write_text("<x/>")
    return {"images": images, "depths": depths, "poses": poses}


def test_ingest_own_data(tmp_path: Path) -> None:
    truth = make_data(tmp_path / "data")
    names = [s.name for s in demo.find_sequences(tmp_path / "data")]
    assert names == ["seqA", "set/seqB"]
    with lv.Store.open(tmp_path / "s.lv", mode="w") as store:
        report = demo.ingest(store, tmp_path / "data")
        assert sorted(store) == sorted(truth["images"])
        assert report.arrays == 3 + 2 * 3
        for key, pixels in truth["images"].items():
            rec = store[key]
            assert rec.image.dtype == pixels.dtype and rec.image.dtype.isnative
            assert np.array_equal(rec.image, pixels)
            assert rec.maxval == (4095 if key.startswith("seqA") else 255)
            assert rec.has_depth == rec.has_pose == (key in truth["depths"])
        for key, depth in truth["depths"].items():
            assert np.array_equal(store[key].depth, depth)
            assert np.array_equal(store[key].pose, truth["poses"][key])
            assert store[key].source == f"set/seqB/Images/Image_{int(key[-4:]):04d}.pgm"


def test_limit_takes_from_every_sequence(tmp_path: Path) -> None:
    make_data(tmp_path / "data")
    with lv.Store.open(tmp_path / "s.lv", mode="w") as store:
        report = demo.ingest(store, tmp_path / "data", limit=3)
        assert sorted(store) == ["seqA/0001", "seqA/0002", "set/seqB/0000"]
        assert list(report.metas) == sorted(store)


def test_run_removes_its_temporary_store_unless_kept(tmp_path: Path) -> None:
    make_data(tmp_path / "data")
    figures = demo.run(tmp_path / "data", limit=4)
    assert figures["records"] == 4 and not figures["kept"]
    assert not Path(figures["store"]).exists()
    assert "payload bytes faulted in vs stored" in demo.format_report(figures)
    kept = demo.run(tmp_path / "data", keep=True)
    try:
        assert kept["kept"] and kept["records"] == 5
        with lv.Store.open(kept["store"], mode="r") as store:
            assert len(store) == 5
    finally:
        shutil.rmtree(Path(kept["store"]).parent)


def test_missing_data(tmp_path: Path) -> None:
    with pytest.raises(demo.DataMissingError):
        demo.run(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(demo.DataMissingError):
        demo.find_sequences(tmp_path / "empty")
    assert not list(tmp_path.glob("**/*.lv"))


# -- the command line -------------------------------------------------------------


def script(*args: str | os.PathLike[str]) -> subprocess.CompletedProcess:
    """Runs ``python examples/visp_demo.py ARGS`` and returns the completed process."""
    return subprocess.run(
        [sys.executable, EXAMPLES / "visp_demo.py", *map(os.fspath, args)],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_main_without_data_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.main(["--data", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert "apt-get install visp-images-data" in err and "--data" in err
    proc = script("--data", tmp_path / "nope")
    assert proc.returncode == 2 and "apt-get install visp-images-data" in proc.stderr


@pytest.mark.parametrize("limit", ["x", "-1"])
def test_bad_limit_is_a_usage_error(limit: str) -> None:
    proc = script("--limit", limit)
    assert proc.returncode == 2
    assert "usage: visp_demo.py" in proc.stderr and "Traceback" not in proc.stderr


def test_help_has_an_example() -> None:
    proc = script("--help")
    assert proc.returncode == 0
    assert "example:" in proc.stdout and "visp_demo.py --limit" in proc.stdout


@pytest.mark.skipif(
    not Path(demo.DEFAULT_DATA_DIR).is_dir(), reason="apt-get install visp-images-data"
)
def test_script_json(tmp_path: Path) -> None:
    proc = script("--limit", "12", "--json")
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(proc.stdout)
    assert figures["records"] == 12 and figures["kept"] is False
    assert not Path(figures["store"]).exists()
    assert [q["expr"] for q in figures["queries"]]
    store = tmp_path / "kept.lv"
    proc = script("--limit", "12", "--store", store)
    assert proc.returncode == 0, proc.stderr
    assert "payload bytes faulted in vs stored" in proc.stdout
    with lv.Store.open(store, mode="r") as kept:
        assert len(kept) == 12
    proc = script("--limit", "12", "--store", store)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("visp_demo.py: ") and "kept.lv" in proc.stderr
