"""The objects every system stores: the same metadata and arrays for all.

Each object is ``(key, meta, arrays)``: ``meta`` a JSON-able dict of about
1 KiB (a dozen fields, one nested object, a list, a free-text note) and
``arrays`` a dict of name -> C-order ndarray. The scan predicate below is
the one every system evaluates (lazyvault and SQLite as a query, the others
as this Python function on the decoded metadata).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np

MATERIALS = ("Si", "Ge", "GaAs", "InP", "SiC", "GaN", "AlN", "ZnO")
QUERY = "temperature > 399.0 and material == 'Si'"
SQL_WHERE = (
    "json_extract(meta, '$.temperature') > 399.0 and json_extract(meta, '$.material') = 'Si'"
)
MIB = 2**20


def matches(meta: dict) -> bool:
    """The predicate of ``QUERY`` on decoded metadata."""
    return meta["temperature"] > 399.0 and meta["material"] == "Si"


def key_of(i: int) -> str:
    return f"run-{i:07d}"


def meta_of(i: int) -> dict:
    """About 1 KiB of JSON metadata for object ``i`` (deterministic)."""
    rng = np.random.default_rng(i)
    meta = {
        "sample": i,
        "material": MATERIALS[i % len(MATERIALS)],
        "temperature": round(float(rng.uniform(0.0, 400.0)), 3),
        "pressure": round(float(rng.uniform(0.5, 2.0)), 4),
        "operator": ["ada", "grace", "edsger", "barbara"][i % 4],
        "ok": bool(i % 7),
        "tags": ["calibrated", f"batch-{i // 1000}", "v2"],
        "instrument": {"name": "diffractometer", "serial": 1000 + i % 13, "firmware": "4.2.1"},
        "created": f"2026-11-{1 + i % 28:02d}T12:{i % 60:02d}:00Z",
    }
    pad = 1024 - len(json.dumps(meta)) - len(', "notes": ""')
    meta["notes"] = ("lorem ipsum dolor sit amet " * 40)[: max(pad, 0)]
    return meta


def small_objects(n: int, array_bytes: int = 4096) -> Iterator[tuple[str, dict, dict]]:
    """``n`` objects of 1 KiB metadata and one float32 array of ``array_bytes``."""
    for i in range(n):
        data = np.full(array_bytes // 4, i, dtype=np.float32)
        yield key_of(i), meta_of(i), {"data": data}


def big_array(gib: float) -> np.ndarray:
    """A 2-D float32 array of ``gib`` GiB, 8192 columns (32 KiB rows), row i = i."""
    rows = int(gib * 2**30) // (8192 * 4)
    a = np.empty((rows, 8192), dtype=np.float32)
    a[:] = np.arange(rows, dtype=np.float32)[:, None]
    return a


def many_arrays(count: int, array_bytes: int = 4096) -> dict[str, np.ndarray]:
    """``count`` float32 arrays of ``array_bytes`` each, array k filled with k."""
    return {f"a{k:05d}": np.full(array_bytes // 4, k, dtype=np.float32) for k in range(count)}
