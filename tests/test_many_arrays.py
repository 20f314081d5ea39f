"""Many small arrays (issue 6): an array of at most 64 KiB is read into
memory on first access, a larger one is memory-mapped, and neither keeps a
file descriptor open; so holding 100,000 tiny arrays at once stays far from
``ulimit -n 256`` and from the kernel's mappings-per-process limit
(``vm.max_map_count``, 65,530 by default)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import lazyvault as lv

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/maps").exists(), reason="counts mappings in /proc/self/maps (Linux)"
)

SHM = Path("/dev/shm")


@pytest.fixture
def fast_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory on tmpfs when there is one: every payload is fsynced when
    written, which costs milliseconds per file on a disk and nothing on
    tmpfs, and these tests write tens of thousands of payloads."""
    if SHM.is_dir() and os.access(SHM, os.W_OK):
        with tempfile.TemporaryDirectory(dir=SHM, prefix="lazyvault-test-") as d:
            yield Path(d)
    else:
        yield tmp_path


def _maps_naming(path: Path) -> int:
    """Lines of /proc/self/maps that map a file under ``path``."""
    text = Path("/proc/self/maps").read_text()
    return sum(1 for line in text.splitlines() if str(path) in line)


def test_an_object_of_10000_arrays_reads_back_equal(fast_dir: Path) -> None:
    dtypes = [np.int8, np.int32, np.float64, np.complex64, np.dtype(">u2"), np.bool_]
    obj = {
        f"a{i}": (np.arange(i % 9) + i % 7)
        .astype(dtypes[i % len(dtypes)])
        .reshape((-1, 1) if i % 2 else (-1,))
        for i in range(10_000)
    }
    obj["f"] = np.asfortranarray(np.arange(12.0).reshape(3, 4))
    with lv.Store.open(fast_dir / "s.lv") as store:
        store["many"] = obj
    with lv.Store.open(fast_dir / "s.lv", "r") as store:
        rec = store["many"]
        back = rec.load()
        assert back.keys() == obj.keys()
        for name, want in obj.items():
            got = back[name]
            assert got.dtype == want.dtype and got.shape == want.shape, name
            np.testing.assert_array_equal(got, want, err_msg=name)
            assert not got.flags.writeable, name
            if got.nbytes:
                assert got.ctypes.data % 64 == 0, name
        assert back["f"].flags.f_contiguous
        # all 10,001 payloads read, none of them left mapped; the reader maps
        # only its checkpoint's run file (under checkpoints/)
        assert _maps_naming(fast_dir / "s.lv" / "arrays") == 0
        assert _maps_naming(fast_dir) == _maps_naming(fast_dir / "s.lv" / "checkpoints")
    assert _maps_naming(fast_dir) == 0  # closed: the checkpoint is unmapped too


def test_small_arrays_are_copies_large_ones_maps(fast_dir: Path) -> None:
    small = np.arange(64 * 1024, dtype=np.uint8)  # exactly 64 KiB: read
    large = np.arange(64 * 1024 + 1, dtype=np.uint8)  # one byte more: mapped
    with lv.Store.open(fast_dir / "s.lv") as store:
        store["k"] = {"small": small, "large": large}
        rec = store["k"]
        got_small = rec.small
        assert _maps_naming(fast_dir / "s.lv" / "arrays") == 0
        got_large = rec.large
        assert _maps_naming(fast_dir / "s.lv" / "arrays") == 1
        np.testing.assert_array_equal(got_small, small)
        np.testing.assert_array_equal(got_large, large)
        for got in (got_small, got_large):
            assert not got.flags.writeable
            assert got.ctypes.data % 64 == 0
            with pytest.raises(ValueError):
                got.flags.writeable = True
        del rec, got_large, got
        assert _maps_naming(fast_dir / "s.lv" / "arrays") == 0


# Runs in a child process: RLIMIT_NOFILE applies to the whole process.
_HOLD_100K = textwrap.dedent(
    """
    import json, os, resource, sys
    import numpy as np
    import lazyvault as lv

    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    def maps():
        with open("/proc/self/maps") as f:
            return sum(1 for _ in f)

    def fds():
        return len(os.listdir("/proc/self/fd"))

    path, n_objects, per_object, proxies = sys.argv[1], *map(int, sys.argv[2:])
    with lv.Store.open(path) as store:
        for k in range(n_objects):
            store[f"k{k}"] = {
                f"a{i}": np.array([k, i, k * per_object + i], dtype=np.int64)
                for i in range(per_object)
            }
    store = lv.Store.open(path, "r")
    before = {"maps": maps(), "fds": fds()}
    held = []  # every array alive at once; each proxy loads its own copy
    for _ in range(proxies):
        for k in range(n_objects):
            rec = store[f"k{k}"]
            held.extend((k, i, rec.array(f"a{i}")) for i in range(per_object))
    after = {"maps": maps(), "fds": fds()}
    for k, i, a in held:
        assert a.tolist() == [k, i, k * per_object + i], (k, i, a)
    print(json.dumps({"before": before, "after": after, "held": len(held)}))
    """
)


def test_holding_100000_arrays_under_ulimit_256(fast_dir: Path) -> None:
    # 20,000 payload files, each loaded by 5 proxies: 100,000 live arrays
    # (one mapping each would be over the kernel's default 65,530).
    out = subprocess.run(
        [sys.executable, "-c", _HOLD_100K, str(fast_dir / "s.lv"), "2", "10000", "5"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["held"] == 100_000
    assert report["after"]["maps"] - report["before"]["maps"] < 500, report
    assert report["after"]["fds"] - report["before"]["fds"] < 16, report
    assert report["after"]["fds"] < 256, report
