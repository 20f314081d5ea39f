"""Shared fixtures: every file a test writes goes under pytest's tmp_path."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

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
