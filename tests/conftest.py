"""Shared fixtures: every file a test writes goes under pytest's tmp_path."""

from __future__ import annotations

import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import lazyvault as lv


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    return tmp_path / "test.lv"


@pytest.fixture
def store(store_path: Path) -> Iterator[lv.Store]:
    s = lv.Store.open(store_path)
    yield s
    s.close()


def payload_files(store_path: Path) -> list[Path]:
    """Every payload file of a store."""
    return sorted((store_path / "arrays").glob("*/*.npy"))


def pack_files(store_path: Path) -> list[Path]:
    """Every pack of a store (small arrays, FORMAT.md "Packs")."""
    return sorted((store_path / "arrays").glob("*/*.npz"))


def stored_files(store_path: Path) -> list[Path]:
    """Every file holding payloads: .npy payload files and packs."""
    return sorted(payload_files(store_path) + pack_files(store_path))


def payload_location(store_path: Path, entry: dict[str, Any]) -> tuple[Path, int]:
    """The file holding the payload of ``entry`` (a record's array entry) and the offset of its
    .npy bytes in it: 0 for a payload file, ``pack_offset`` for a pack member."""
    if "pack" in entry:
        pack = entry["pack"]
        return store_path / "arrays" / pack[:2] / f"{pack}.npz", entry["pack_offset"]
    return store_path / "arrays" / entry["id"][:2] / f"{entry['id']}.npy", 0


def npy_bytes(store_path: Path, entry: dict[str, Any]) -> bytes:
    """The payload's .npy bytes (header and data), from its file or its pack."""
    path, start = payload_location(store_path, entry)
    data = path.read_bytes()
    return data[start : start + entry["data_offset"] + entry["nbytes"]] if start else data


def pack_member(pack: Path, entry: dict[str, Any]) -> str:
    """The name of the member of ``pack`` holding the payload of ``entry``: the one whose name
    without ``.npy`` starts the id (``<id[:24]>.npy`` since format 2.0, ``<id>.npy`` before;
    FORMAT.md, "Packs")."""
    with zipfile.ZipFile(pack) as z:
        (name,) = [n for n in z.namelist() if entry["id"].startswith(n.removesuffix(".npy"))]
    return name


def load_with_numpy(store_path: Path, entry: dict[str, Any], **kwargs: Any) -> np.ndarray:
    """The payload as numpy alone reads it: ``np.load`` of the .npy file, or of the pack as an
    npz (its member, see ``pack_member``)."""
    path, _ = payload_location(store_path, entry)
    if "pack" in entry:
        with np.load(path, **kwargs) as npz:
            return npz[pack_member(path, entry).removesuffix(".npy")]
    return np.load(path, **kwargs)


def damage_payload(
    store_path: Path, entry: dict[str, Any], damage: Callable[[bytes], bytes]
) -> None:
    """Replaces the payload's .npy bytes by ``damage(bytes)``: in its file, or in its pack (a
    shorter result cuts the pack there)."""
    path, start = payload_location(store_path, entry)
    data = path.read_bytes()
    if not start:
        path.write_bytes(damage(data))
        return
    end = start + entry["data_offset"] + entry["nbytes"]
    new = damage(data[start:end])
    rest = data[end:] if len(new) == end - start else b""
    path.write_bytes(data[:start] + new + rest)
