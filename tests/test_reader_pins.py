"""A reader's pin on its checkpoint: it keeps the payloads of its snapshot
while it lives, and a reader killed with SIGKILL leaves no retention behind
(the kernel drops its lock with the process)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import lazyvault as lv

from conftest import payload_location

_READER = """
import sys, time, lazyvault as lv
store = lv.Store.open(sys.argv[1], mode="r")
rec = store["k"]
print(store.version, flush=True)
time.sleep(120)
"""


def _payload_of(store: lv.Store, key: str) -> Path:
    """The file holding the payload: its .npy file, or its pack (a small array)."""
    return payload_location(Path(store.path), store[key]._record["arrays"]["a"])[0]


def _start_reader(path: Path) -> subprocess.Popen[str]:
    reader = subprocess.Popen(
        [sys.executable, "-c", _READER, str(path)], stdout=subprocess.PIPE, text=True
    )
    assert reader.stdout is not None
    assert reader.stdout.readline().strip().isdigit()  # pinned its snapshot
    return reader


@pytest.fixture
def path(tmp_path: Path) -> Path:
    p = tmp_path / "s.lv"
    with lv.Store.open(p) as store:
        store["k"] = {"a": np.arange(1000)}
    return p


def test_a_live_reader_keeps_its_payloads_and_a_killed_one_keeps_nothing(path: Path) -> None:
    with lv.Store.open(path, mode="r") as probe:
        old = _payload_of(probe, "k")
    reader = _start_reader(path)
    try:
        with lv.Store.open(path, retention=0) as writer:
            assert writer.retention == 0
            writer["k"] = {"a": np.arange(1000) + 1}
            writer.flush()
            writer.gc()
            # the other process still reads the old version: its file stays
            assert old.exists()
            reader.send_signal(signal.SIGKILL)
            reader.wait(timeout=30)
            # its lock died with it: the next flush or gc may remove the file
            writer["k2"] = {"a": np.arange(3)}
            writer.flush()
            writer.gc()
            assert not old.exists()
            assert writer.verify()["orphans"] == []
    finally:
        if reader.poll() is None:
            reader.kill()
        with reader:  # closes its pipe (else a ResourceWarning) and waits
            pass
    with lv.Store.open(path, mode="r") as store:
        assert store["k"].a.tolist() == list(range(1, 1001))


def test_retention_keeps_files_for_readers_on_other_machines(path: Path) -> None:
    with lv.Store.open(path, mode="r") as probe:
        old = _payload_of(probe, "k")
    with lv.Store.open(path, retention=3600) as writer:
        assert writer.retention == 3600
        writer["k"] = {"a": np.arange(5)}
        writer.flush()
        writer.gc()
        assert old.exists()  # no local reader, but within the retention
        # what is kept for readers is not an orphan
        assert writer.verify()["orphans"] == []
    with lv.Store.open(path, retention=0) as writer:
        writer.gc()
        assert not old.exists()


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf")])
def test_a_bad_retention_is_refused(path: Path, bad: float) -> None:
    with pytest.raises(ValueError, match="retention"):
        lv.Store.open(path, retention=bad)


@pytest.mark.parametrize("bad", ["60", True, None])
def test_a_retention_that_is_not_a_number_is_a_type_error(path: Path, bad: object) -> None:
    if bad is None:
        assert lv.Store.open(path, retention=None).retention == 0  # the local default
        return
    with pytest.raises(TypeError, match="retention"):
        lv.Store.open(path, retention=bad)  # type: ignore[arg-type]


def test_the_local_default_retention_is_zero(path: Path) -> None:
    # tmp_path is on a local file system here: every reader's lock is seen
    if os.path.exists("/proc/mounts"):
        with lv.Store.open(path) as store:
            assert store.retention == 0


def test_a_bad_retention_creates_nothing(tmp_path: Path) -> None:
    new = tmp_path / "new.lv"
    with pytest.raises(TypeError):
        lv.Store.open(new, "w", retention="x")  # type: ignore[arg-type]
    assert not new.exists()
    with lv.Store.open(new, "w", retention=np.int64(3)) as store:
        assert store.retention == 3


def test_an_unpickled_store_whose_version_is_gone_refreshes_to_the_latest(path: Path) -> None:
    import pickle
    import shutil

    with lv.Store.open(path, mode="r") as sender:
        blob = pickle.dumps(sender)
        version = sender.version
    with lv.Store.open(path, retention=0) as writer:
        for i in range(3):
            writer["k"] = {"a": np.arange(10) + i}
            writer.flush()
            writer.gc()  # the sender's checkpoint is no longer kept
        latest = writer.version
    stale = pickle.loads(blob)
    with pytest.raises(lv.CorruptError, match=f"version {version} is no longer available"):
        len(stale)
    again = pickle.loads(blob)
    assert again.refresh() == latest
    assert again["k"].a.tolist() == list(range(2, 12))
    # a store whose directory is gone still has a repr
    gone = pickle.loads(blob)
    shutil.rmtree(path)
    assert "unavailable" in repr(gone)


def test_retention_can_be_set_on_an_open_store(path: Path) -> None:
    with lv.Store.open(path) as store:
        store.retention = 60
        assert store.retention == 60
        with pytest.raises(ValueError, match="from 0 to 1e15"):
            store.retention = -1
        with pytest.raises(TypeError):
            store.retention = None  # type: ignore[assignment]
        assert store.retention == 60
