"""The lazyvault demo: real camera frames into a store, queried by metadata.

Run it as a script (``./dev demo [ARGS]`` does, with the virtualenv's
python): ``python examples/visp_demo.py [--data DIR] [--store PATH]
[--limit N] [--keep] [--json]``; ``--help`` says more. Exit status: 0 ok,
1 a lazyvault or OS error, 2 a usage error or missing data.

The data is Debian's ``visp-images-data`` package (``apt-get install
visp-images-data``): the image sequences ViSP, the visual servoing library,
tests its trackers with. A *sequence* is a directory holding numbered 8-bit
binary PGM frames (``mire-2/image.0001.pgm``, ``mbt/cube/image0000.pgm``,
``mbt-depth/Castle-simu/Images/Image_0001.pgm``, ...). Single images, 3D
models, XML configs, PNG/JPEG files and videos are left out.

Each frame becomes one record under the key ``<sequence>/<frame:04d>`` with
metadata (``sequence``, ``frame``, ``width``, ``height``, ``maxval``,
``source``, ``has_depth``, ``has_pose``, ``mean_intensity``) and up to three
arrays:

- ``image``: the PGM pixels, ``uint8`` (or ``uint16`` in native byte order
  when the PGM maxval exceeds 255), shape ``(height, width)``;
- ``depth``: a raw depth map, ``uint16``, from ViSP's ``.bin`` format (two
  little-endian ``uint32``, height then width, then ``height * width``
  little-endian ``uint16``; ViSP's own tests scale Castle-simu's by
  0.000030518 to metres), for ``Depth/Depth_NNNN.bin`` next to ``Images/`` or
  ``depth_image_NNNN.bin`` beside the frames;
- ``pose``: the 4x4 homogeneous camera pose ``cMo`` (``float64``) from
  ``CameraPose/Camera_NNN.txt`` next to ``Images/``.

PGM files are read by :func:`read_pgm`, a small exact numpy reader of the
Netpbm P5 format, not by Pillow: Pillow 13 returns 16-bit PGMs as ``int32``
and rescales samples to the full range whenever maxval is not 255 or 65535
(a maxval-4095 sample of 4095 comes back as 65535), while a store should keep
the file's values. The reader keeps them as they are and records ``maxval``.

The reusable pieces are :func:`find_sequences`, :func:`read_pgm`,
:func:`read_depth`, :func:`read_pose`, :func:`ingest`, :func:`run` (returns
the figures as a dict), :func:`format_report` (the text printed) and
:func:`main` (the command line).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lazyvault import LazyvaultError, Store

__all__ = [
    "DEFAULT_DATA_DIR",
    "QUERIES",
    "DataMissingError",
    "Frame",
    "IngestReport",
    "Sequence",
    "find_sequences",
    "format_report",
    "ingest",
    "main",
    "parse_pgm",
    "payload_mappings",
    "read_depth",
    "read_pgm",
    "read_pose",
    "run",
    "select_frames",
]

DEFAULT_DATA_DIR = "/usr/share/visp-images-data/ViSP-images"

#: The metadata queries the demo runs (``store.find``), in order.
QUERIES: tuple[str, ...] = (
    "sequence == 'mire-2' and frame < 100",
    "width >= 640",
    "has_depth == true",
    "image.shape[0] > 300",
    "mean_intensity > 128",
)

# How many records' images the demo reads (one per sequence, largest first).
_TOUCHES = 3

_NUMBERED = re.compile(r"^(?P<prefix>.*?)(?P<number>\d+)\.(?P<ext>[A-Za-z]+)$")
_WHITESPACE = b" \t\n\v\f\r"


class DataMissingError(FileNotFoundError):
    """The data directory is missing or holds no numbered PGM frames."""


@dataclass(frozen=True)
class Frame:
    """One numbered frame: its PGM image and, where present, its depth map
    and camera pose files."""

    number: int
    image: Path
    depth: Path | None = None
    pose: Path | None = None


@dataclass(frozen=True)
class Sequence:
    """A directory of numbered PGM frames. ``name`` is the directory relative
    to the data directory (the dataset directory for an ``Images/`` folder)."""

    name: str
    directory: Path
    frames: tuple[Frame, ...]

    def key(self, frame: Frame) -> str:
        """The store key of ``frame``: ``<sequence>/<frame:04d>``."""
        return f"{self.name}/{frame.number:04d}"


@dataclass
class IngestReport:
    """What :func:`ingest` wrote and how long it took.

    ``metas``: ``{key: metadata}`` of every record written, in write order;
    ``array_nbytes``: sum of the arrays' ``nbytes``; ``source_bytes``: bytes
    of the source files read; ``read_seconds``: time spent reading and
    parsing them; ``write_seconds``: time in ``store[key] = ...`` and the
    final ``flush()``; ``seconds``: the whole ingest.
    """

    metas: dict[str, dict[str, Any]] = field(default_factory=dict)
    arrays: int = 0
    array_nbytes: int = 0
    source_bytes: int = 0
    read_seconds: float = 0.0
    write_seconds: float = 0.0
    seconds: float = 0.0


# -- finding the frames -------------------------------------------------------


def _numbered(directory: Path, ext: str) -> dict[str, dict[int, Path]]:
    """Files ``<prefix><digits>.<ext>`` in ``directory``: ``{prefix: {n: path}}``
    (the first name in sorted order wins when two spell the same number)."""
    groups: dict[str, dict[int, Path]] = {}
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return groups
    for name in names:
        m = _NUMBERED.match(name)
        if m is None or m["ext"].lower() != ext or not (directory / name).is_file():
            continue
        groups.setdefault(m["prefix"], {}).setdefault(int(m["number"]), directory / name)
    return groups


def _companions(image_dir: Path, kind: str, ext: str) -> dict[int, Path]:
    """Numbered ``ext`` files of ``kind`` ("depth" or "pose") belonging to the
    frames in ``image_dir``: beside them with ``kind`` in the file prefix, or,
    for a dataset laid out as ``Images/``, in a sibling folder whose name
    contains ``kind`` (``Depth/``, ``CameraPose/``)."""
    found: dict[int, Path] = {}
    for prefix, files in _numbered(image_dir, ext).items():
        if kind in prefix.lower():
            found.update(files)
    if image_dir.name.lower() == "images":
        for sibling in sorted(image_dir.parent.iterdir()):
            if sibling.is_dir() and sibling != image_dir and kind in sibling.name.lower():
                for files in _numbered(sibling, ext).values():
                    for number, path in files.items():
                        found.setdefault(number, path)
    return found


def find_sequences(data_dir: str | os.PathLike[str]) -> list[Sequence]:
    """The image sequences under ``data_dir``, sorted by name.

    A sequence is a directory with at least two numbered binary PGM files of
    one name pattern (``image.0001.pgm``, ``image0000.pgm``,
    ``Image_0001.pgm``). Depth maps and poses are matched to frames by number.
    Raises :class:`DataMissingError` if ``data_dir`` is not a directory or
    holds no sequence.
    """
    root = Path(data_dir)
    if not root.is_dir():
        raise DataMissingError(f"{root}: no such directory")
    sequences: list[Sequence] = []
    for dirpath, dirnames, _ in os.walk(root):
        dirnames.sort()
        directory = Path(dirpath)
        groups = {p: f for p, f in _numbered(directory, "pgm").items() if len(f) >= 2}
        if not groups:
            continue
        base = directory.parent if directory.name.lower() == "images" else directory
        name = base.relative_to(root).as_posix()
        if name == ".":
            name = directory.name
        depth = _companions(directory, "depth", "bin")
        pose = _companions(directory, "pose", "txt")
        for prefix, files in sorted(groups.items()):
            if _kind_of(prefix) is not None:
                continue  # e.g. "depth_image_0001.pgm": not camera frames
            seq_name = name if len(groups) == 1 else f"{name}/{prefix.rstrip('._-') or 'frames'}"
            frames = tuple(
                Frame(n, path, depth.get(n), pose.get(n)) for n, path in sorted(files.items())
            )
            sequences.append(Sequence(seq_name, directory, frames))
    if not sequences:
        raise DataMissingError(f"{root}: no directory of numbered PGM frames")
    return sorted(sequences, key=lambda s: s.name)


def _kind_of(prefix: str) -> str | None:
    """``"depth"`` or ``"pose"`` if a file prefix names a companion file, else None."""
    lowered = prefix.lower()
    for kind in ("depth", "pose"):
        if kind in lowered:
            return kind
    return None


def select_frames(
    sequences: Iterable[Sequence], limit: int | None = None
) -> list[tuple[Sequence, Frame]]:
    """All frames, or at most ``limit`` of them spread over the sequences:
    round-robin, the first frames of each sequence first. Returned in
    sequence then frame order."""
    seqs = list(sequences)
    if limit is None:
        return [(s, f) for s in seqs for f in s.frames]
    if limit < 0:
        raise ValueError(f"limit must be >= 0, not {limit}")
    chosen: list[tuple[int, int]] = []
    depth = 0
    while len(chosen) < limit and any(depth < len(s.frames) for s in seqs):
        for i, s in enumerate(seqs):
            if depth < len(s.frames) and len(chosen) < limit:
                chosen.append((i, depth))
        depth += 1
    return [(seqs[i], seqs[i].frames[j]) for i, j in sorted(chosen)]


# -- reading the files --------------------------------------------------------


def parse_pgm(data: bytes, name: str = "<bytes>") -> np.ndarray:
    """The first image of a binary PGM (Netpbm ``P5``) held in ``data``.

    Exact, per the Netpbm spec: ``#`` comments anywhere in the header, one
    whitespace byte (or a comment ending in a newline) after maxval, samples
    kept as stored (never rescaled to maxval). Returns ``uint8`` for maxval <
    256, else ``uint16`` converted from big-endian to native byte order; shape
    ``(height, width)``. Raises ``ValueError`` for anything else (``P2``
    plain PGM, bad header, truncated raster).
    """
    return _parse_pgm(data, name)[0]


def _parse_pgm(data: bytes, name: str) -> tuple[np.ndarray, int]:
    """:func:`parse_pgm`, and the maxval of the header."""
    if data[:2] != b"P5":
        raise ValueError(f"{name}: not a binary PGM (P5) file")
    pos, end = 2, len(data)
    fields: list[int] = []
    while len(fields) < 3:
        while pos < end:
            if data[pos] in _WHITESPACE:
                pos += 1
            elif data[pos] == ord("#"):
                pos = _after_comment(data, pos, name)
            else:
                break
        start = pos
        while pos < end and 48 <= data[pos] <= 57:
            pos += 1
        if start == pos:
            raise ValueError(f"{name}: malformed PGM header (expected a number at byte {pos})")
        fields.append(int(data[start:pos]))
    width, height, maxval = fields
    if pos < end and data[pos] == ord("#"):
        pos = _after_comment(data, pos, name)
    elif pos < end and data[pos] in _WHITESPACE:
        pos += 1
    else:
        raise ValueError(f"{name}: malformed PGM header (no whitespace after maxval)")
    if width < 1 or height < 1 or not 1 <= maxval <= 65535:
        raise ValueError(f"{name}: bad PGM header {width}x{height} maxval {maxval}")
    dtype = np.dtype("u1") if maxval < 256 else np.dtype(">u2")
    size = width * height * dtype.itemsize
    if end - pos < size:
        raise ValueError(f"{name}: truncated PGM raster ({end - pos} of {size} bytes)")
    pixels = np.frombuffer(data, dtype=dtype, count=width * height, offset=pos)
    return pixels.reshape(height, width).astype(dtype.newbyteorder("="), copy=True), maxval


def _after_comment(data: bytes, pos: int, name: str) -> int:
    """The offset after the comment starting at ``pos`` (past its newline)."""
    for i in range(pos, len(data)):
        if data[i] in b"\n\r":
            return i + 1
    raise ValueError(f"{name}: PGM header ends inside a comment")


def read_pgm(path: str | os.PathLike[str]) -> np.ndarray:
    """The pixels of a binary PGM file (see :func:`parse_pgm`)."""
    return parse_pgm(Path(path).read_bytes(), os.fspath(path))


def read_depth(path: str | os.PathLike[str]) -> np.ndarray:
    """A ViSP raw depth map: ``uint32`` LE height and width, then
    ``height * width`` ``uint16`` LE samples. Returns native ``uint16``."""
    data = Path(path).read_bytes()
    if len(data) < 8:
        raise ValueError(f"{path}: too short for a ViSP depth map")
    height, width = (int(v) for v in np.frombuffer(data, dtype="<u4", count=2))
    if len(data) != 8 + 2 * height * width:
        raise ValueError(
            f"{path}: {len(data)} bytes, expected {8 + 2 * height * width} for {height}x{width}"
        )
    depth = np.frombuffer(data, dtype="<u2", offset=8).reshape(height, width)
    return depth.astype(np.uint16, copy=True)


def read_pose(path: str | os.PathLike[str]) -> np.ndarray:
    """A 4x4 homogeneous matrix written as text, one row a line (``float64``)."""
    pose = np.loadtxt(path, dtype=np.float64)
    if pose.shape != (4, 4):
        raise ValueError(f"{path}: expected a 4x4 matrix, got shape {pose.shape}")
    return pose


# -- ingest -------------------------------------------------------------------


def _frame_object(data_dir: Path, seq: Sequence, frame: Frame) -> tuple[dict[str, Any], int]:
    """The object stored for one frame, and the bytes of source files read."""
    raw = frame.image.read_bytes()
    image, maxval = _parse_pgm(raw, os.fspath(frame.image))
    source_bytes = len(raw)
    obj: dict[str, Any] = {
        "sequence": seq.name,
        "frame": frame.number,
        "width": int(image.shape[1]),
        "height": int(image.shape[0]),
        "maxval": maxval,
        "source": frame.image.relative_to(data_dir).as_posix(),
        "has_depth": frame.depth is not None,
        "has_pose": frame.pose is not None,
        "mean_intensity": round(float(image.mean()), 3),
        "image": image,
    }
    if frame.depth is not None:
        obj["depth_source"] = frame.depth.relative_to(data_dir).as_posix()
        obj["depth"] = read_depth(frame.depth)
        source_bytes += frame.depth.stat().st_size
    if frame.pose is not None:
        obj["pose_source"] = frame.pose.relative_to(data_dir).as_posix()
        obj["pose"] = read_pose(frame.pose)
        source_bytes += frame.pose.stat().st_size
    return obj, source_bytes


def ingest(
    store: Store, data_dir: str | os.PathLike[str], limit: int | None = None
) -> IngestReport:
    """Writes one record per frame of every sequence under ``data_dir`` (at
    most ``limit`` frames, spread over the sequences, see
    :func:`select_frames`), then flushes. Returns an :class:`IngestReport`."""
    root = Path(data_dir)
    report = IngestReport()
    started = time.perf_counter()
    for seq, frame in select_frames(find_sequences(root), limit):
        t0 = time.perf_counter()
        obj, source_bytes = _frame_object(root, seq, frame)
        t1 = time.perf_counter()
        key = seq.key(frame)
        store[key] = obj
        report.write_seconds += time.perf_counter() - t1
        report.read_seconds += t1 - t0
        report.source_bytes += source_bytes
        arrays = [v for v in obj.values() if isinstance(v, np.ndarray)]
        report.arrays += len(arrays)
        report.array_nbytes += sum(a.nbytes for a in arrays)
        report.metas[key] = {k: v for k, v in obj.items() if not isinstance(v, np.ndarray)}
    t0 = time.perf_counter()
    store.flush()
    report.write_seconds += time.perf_counter() - t0
    report.seconds = time.perf_counter() - started
    return report


# -- measuring ----------------------------------------------------------------


def payload_mappings(arrays_dir: str | os.PathLike[str]) -> dict[str, int] | None:
    """What this process has mapped of the files under ``arrays_dir``, from
    ``/proc/self/smaps``: ``{"mappings": n, "size": bytes mapped,
    "rss": bytes resident (faulted in)}``; ``None`` where there is no smaps."""
    prefix = os.path.realpath(arrays_dir) + os.sep
    header = re.compile(r"^[0-9a-f]+-[0-9a-f]+ \S+ \S+ \S+ \d+\s*(.*)$")
    totals = {"mappings": 0, "size": 0, "rss": 0}
    inside = False
    try:
        with open("/proc/self/smaps", encoding="utf-8", errors="replace") as f:
            for line in f:
                m = header.match(line)
                if m is not None:
                    inside = m.group(1).startswith(prefix)
                    totals["mappings"] += inside
                elif inside and line.startswith(("Size:", "Rss:")):
                    kib = int(line.split()[1])
                    totals["size" if line.startswith("Size:") else "rss"] += kib * 1024
    except OSError:
        return None
    return totals


def _payload_files(arrays_dir: Path) -> Iterator[Path]:
    # .npy payload files and packs of small arrays (.npz)
    yield from (p for p in arrays_dir.rglob("*.np[yz]") if p.is_file())


# -- the demo -----------------------------------------------------------------


def run(
    data_dir: str | os.PathLike[str] = DEFAULT_DATA_DIR,
    store_path: str | os.PathLike[str] | None = None,
    limit: int | None = None,
    keep: bool = False,
) -> dict[str, Any]:
    """Ingests the frames, runs :data:`QUERIES`, touches a few images, and
    returns the figures (see the keys below; ``format_report`` prints them).

    ``store_path``: where to create the store (must not exist); it is kept.
    Without it the store goes to a new temporary directory, removed at the
    end unless ``keep``. Raises :class:`DataMissingError` if there is no data.
    """
    wall = time.perf_counter()
    data = Path(data_dir)
    sequences = find_sequences(data)  # fails early, before creating anything
    temp_dir: str | None = None
    if store_path is None:
        temp_dir = tempfile.mkdtemp(prefix="lazyvault-demo-")
        path = Path(temp_dir) / "visp.lv"
    else:
        path = Path(store_path)
    figures: dict[str, Any] = {
        "data_dir": str(data),
        "store": str(path),
        "kept": temp_dir is None or keep,
        "pgm_reader": "numpy (examples/visp_demo.py, read_pgm)",
    }
    try:
        with Store.open(path, mode="w") as store:
            report = ingest(store, data, limit)
            figures.update(_ingest_figures(store, sequences, report))
            figures["queries"] = [_timed_query(store, expr) for expr in QUERIES]
            figures.update(_touch(store, data, report))
    finally:
        if temp_dir is not None and not keep:
            shutil.rmtree(temp_dir, ignore_errors=True)
    figures["wall_seconds"] = time.perf_counter() - wall
    return figures


def _ingest_figures(
    store: Store, sequences: list[Sequence], report: IngestReport
) -> dict[str, Any]:
    arrays_dir = Path(store.path) / "arrays"
    files = list(_payload_files(arrays_dir))
    per_seq: dict[str, int] = {}
    for meta in report.metas.values():
        per_seq[meta["sequence"]] = per_seq.get(meta["sequence"], 0) + 1
    return {
        "sequences_found": {s.name: len(s.frames) for s in sequences},
        "sequences": per_seq,
        "records": len(store),
        "arrays": report.arrays,
        "payload_files": len(files),
        "payload_file_bytes": sum(p.stat().st_size for p in files),
        "array_nbytes": report.array_nbytes,
        "source_bytes": report.source_bytes,
        "ingest_seconds": report.seconds,
        "read_seconds": report.read_seconds,
        "write_seconds": report.write_seconds,
        "write_mb_per_s": report.array_nbytes / 1e6 / report.write_seconds
        if report.write_seconds
        else None,
        "ingest_mb_per_s": report.array_nbytes / 1e6 / report.seconds if report.seconds else None,
    }


def _timed_query(store: Store, expr: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    hits = store.find(expr)
    seconds = time.perf_counter() - t0
    return {"expr": expr, "hits": len(hits), "seconds": seconds}


def _touch(store: Store, data: Path, report: IngestReport) -> dict[str, Any]:
    """Sums the image of one record of each of the largest sequences and
    measures what got faulted in (before: after the queries)."""
    arrays_dir = Path(store.path) / "arrays"
    before = payload_mappings(arrays_dir)
    first: dict[str, str] = {}
    sizes: dict[str, int] = {}
    for key, meta in report.metas.items():
        first.setdefault(meta["sequence"], key)
        sizes[meta["sequence"]] = sizes.get(meta["sequence"], 0) + 1
    chosen = sorted(first, key=lambda s: (-sizes[s], s))[:_TOUCHES]
    records = [store[first[s]] for s in chosen]
    images = [rec.image for rec in records]
    sums = [int(img.sum(dtype=np.uint64)) for img in images]
    after = payload_mappings(arrays_dir)
    touched = []
    for rec, img, total in zip(records, images, sums, strict=True):
        source = read_pgm(data / rec.meta["source"])
        touched.append(
            {
                "key": rec.key,
                "array": "image",
                "shape": list(img.shape),
                "nbytes": int(img.nbytes),
                "sum": total,
                "matches_source": bool(np.array_equal(img, source)),
            }
        )
    del images, records
    stored = sum(p.stat().st_size for p in _payload_files(arrays_dir))
    return {
        "touched": touched,
        "touched_nbytes": sum(t["nbytes"] for t in touched),
        "mapped_after_queries": before,
        "mapped_after_touch": after,
        "faulted_in_bytes": None if after is None else after["rss"],
        "stored_bytes": stored,
    }


# -- the report ---------------------------------------------------------------


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _rate(mb_per_s: float | None) -> str:
    return "n/a" if mb_per_s is None else f"{mb_per_s:,.0f} MB/s"


def format_report(fig: dict[str, Any]) -> str:
    """The figures of :func:`run` as short text, with how to check each."""
    seqs = fig["sequences"]
    found = sum(fig["sequences_found"].values())
    listing = textwrap.wrap(
        ", ".join(f"{name} {n}" for name, n in seqs.items()),
        width=90,
        initial_indent="          ",
        subsequent_indent="          ",
        break_on_hyphens=False,
    )
    headers = fig["payload_file_bytes"] - fig["array_nbytes"]
    lines = [
        "lazyvault demo: ViSP camera frames (Debian package visp-images-data)",
        f"data      {fig['data_dir']}: {fig['records']:,} of {found:,} frames, "
        f"{len(seqs)} sequences:",
        *listing,
        f"store     {fig['store']}" + ("" if fig["kept"] else "  (removed at exit: --keep)"),
        "",
        f"ingest    {fig['records']:,} records, {fig['arrays']:,} arrays (image, depth, pose) "
        f"in {fig['ingest_seconds']:.2f} s = {_rate(fig['ingest_mb_per_s'])} of array data",
        f"          (reading the sources {fig['read_seconds']:.2f} s; store writes and flush "
        f"{fig['write_seconds']:.2f} s = {_rate(fig['write_mb_per_s'])}; 1 MB = 10^6 B)",
        f"stored    {fig['payload_files']:,} payload files, {fig['payload_file_bytes']:,} B; "
        f"array nbytes {fig['array_nbytes']:,} B (+{headers:,} B of .npy headers)",
        "",
        "queries   store.find(expr), evaluated over the index:",
    ]
    for q in fig["queries"]:
        lines.append(f"  {q['hits']:7,} hits {_ms(q['seconds']):>9}   {q['expr']}")
    before, after = fig["mapped_after_queries"], fig["mapped_after_touch"]
    if before is not None:
        lines.append(
            f"          payload files mapped after the queries: {before['mappings']} "
            f"({before['rss']:,} B resident)"
        )
    lines += ["", "touched   sum(rec.image) of one record of the largest sequences:"]
    for t in fig["touched"]:
        same = "same as the source PGM" if t["matches_source"] else "DIFFERS from the source PGM"
        shape = "x".join(str(d) for d in t["shape"])
        lines.append(f"  {t['key']:<22} {t['sum']:>12,}  {shape} {same}")
    if after is None:
        lines.append("faulted   n/a (no /proc/self/smaps here)")
    else:
        stored = fig["stored_bytes"]
        share = after["rss"] / stored if stored else 0.0
        lines.append(
            f"faulted   payload bytes faulted in vs stored: {after['rss']:,} of {stored:,} B "
            f"({share:.2%})"
        )
        lines.append(
            f"          ({after['mappings']} payload files mapped; the touched images hold "
            f"{fig['touched_nbytes']:,} B)"
        )
    lines.append(f"wall      {fig['wall_seconds']:.2f} s")
    q0 = fig["queries"][0]["expr"] if fig["queries"] else "width >= 640"
    key = fig["touched"][0]["key"] if fig["touched"] else ""
    # the CLI of this very interpreter: bare `lazyvault` may not be on PATH
    cli = shlex.quote(os.path.join(os.path.dirname(sys.executable), "lazyvault"))
    lines += [
        "",
        "check it" + ("" if fig["kept"] else " (run with --keep first)") + f": S={fig['store']}",
        f"  LV={cli}",
        "  find $S/arrays -name '*.npy' | wc -l       # payload files",
        "  find $S/arrays -name '*.npy' -printf '%s\\n' | awk '{s+=$1} END {print s}'"
        "   # their bytes",
        "                                             # (du -sb $S/arrays also counts directories)",
        "  $LV ls $S | wc -l                          # records",
        f'  $LV ls $S "{q0}" | wc -l    # a query\'s hits',
        f"  $LV show $S {key}               # one record: metadata and arrays, no payload read",
        "  faulted in: Rss of the mappings under $S/arrays in /proc/self/smaps, read by the demo",
    ]
    return "\n".join(lines)


# -- the command line -----------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Runs the demo with the command-line arguments ``argv`` (default
    ``sys.argv[1:]``), prints the report (or ``--json`` figures) and returns
    the exit status; usage errors exit with status 2 (argparse)."""
    parser = argparse.ArgumentParser(
        prog="visp_demo.py",
        description="ingest Debian's visp-images-data camera frames into a lazyvault store, "
        "query them, print the figures",
        epilog="example:\n  visp_demo.py --limit 100 --keep   # then: lazyvault ls <store> "
        "'width >= 640'",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--data",
        metavar="DIR",
        default=DEFAULT_DATA_DIR,
        help=f"the ViSP-images directory (default: {DEFAULT_DATA_DIR})",
    )
    parser.add_argument(
        "--store",
        metavar="PATH",
        help="create the store here (must not exist; kept). Default: a new temporary "
        "directory, removed at the end unless --keep",
    )
    parser.add_argument("--limit", metavar="N", type=int, help="ingest at most N frames")
    parser.add_argument("--keep", action="store_true", help="keep the temporary store")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args(argv)
    if args.limit is not None and args.limit < 0:
        parser.error("--limit must be >= 0")
    try:
        figures = run(args.data, store_path=args.store, limit=args.limit, keep=args.keep)
    except DataMissingError as e:
        print(
            f"{parser.prog}: no ViSP image data: {e}\n"
            "  install it with: apt-get install visp-images-data\n"
            f"  or point to a copy with: {parser.prog} --data DIR",
            file=sys.stderr,
        )
        return 2
    except (LazyvaultError, OSError) as e:
        print(f"{parser.prog}: {e}", file=sys.stderr)
        return 1
    if args.json:
        json.dump(figures, sys.stdout, indent=2, ensure_ascii=False)
        print()
    else:
        print(format_report(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
