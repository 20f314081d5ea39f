"""The README's first example runs as written (in a temporary directory)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def test_first_example_runs(tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README has no python example"
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        namespace: dict[str, object] = {}
        exec(compile(blocks[0], "README.md", "exec"), namespace)
    finally:
        os.chdir(cwd)
    assert (tmp_path / "frames.lv" / "lazyvault.json").exists()
    assert namespace["hits"].keys() == ["mire-2/0001"]  # type: ignore[attr-defined]


def test_looking_around_example_runs(tmp_path: Path) -> None:
    """The "Looking around" section: its Python block runs on the first
    example's store, and its first shell line prints what its comment says."""
    import subprocess
    import sys

    import numpy as np

    import lazyvault as lv

    text = README.read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    (block,) = [b for b in blocks if "to_pandas" in b and "lv.dask" not in b]
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        exec(compile(blocks[0], "README.md", "exec"), {})
        os.mkdir("npy-dir")
        np.save("npy-dir/extra.npy", np.arange(3))
        with lv.Store.open("frames.lv") as store:
            frame = {"sequence": "mire-2", "frame": 2, "image": np.zeros((480, 640), np.uint8)}
            namespace: dict[str, object] = {"store": store, "new_frames": {"mire-2/0002": frame}}
            exec(compile(block, "README.md", "exec"), namespace)
            assert list(namespace["df"].index) == ["mire-2/0001"]  # type: ignore[attr-defined]
            assert sorted(store) == ["extra", "mire-2/0001", "mire-2/0002"]
        (shell,) = re.findall(r"```sh\n(lazyvault find .*?)```", text, flags=re.S)
        line = shell.splitlines()[0]
        command, expected = (part.strip() for part in line.split("#", 1))
        args = re.findall(r'"[^"]*"|\S+', command)[1:]
        proc = subprocess.run(
            [sys.executable, "-m", "lazyvault", *(a.strip('"') for a in args)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.splitlines()[0] == expected
    finally:
        os.chdir(cwd)


def test_sharing_a_store_example_runs(tmp_path: Path) -> None:
    """The "Sharing a store" block runs and shows what its comments say."""
    text = README.read_text()
    section = text.split("## Sharing a store", 1)[1]
    (block,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)[:1]
    import lazyvault as lv

    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        namespace: dict[str, object] = {"lv": lv}
        lines = block.splitlines()
        shown = {}
        for i, line in enumerate(lines):
            code, _, comment = line.partition("#")
            exec(compile(code, "README.md", "exec"), namespace)
            expr = code.strip()
            if comment.strip()[:1].isdigit() and not expr.startswith(("writer", "reader =")):
                shown[i] = (expr, int(comment.split(":")[0].strip()), eval(expr, namespace))
        for name in ("writer", "reader"):
            namespace[name].close()  # type: ignore[attr-defined]
    finally:
        os.chdir(cwd)
    assert shown, "the block shows no values"
    for expr, said, got in shown.values():
        assert got == said, f"{expr} gives {got}, the README says {said}"
    assert (tmp_path / "runs.lv" / "checkpoints").is_dir()


def test_scaling_out_example_runs(tmp_path: Path) -> None:
    """The "Scaling out" section's block runs as a script (a real two-process cluster) and prints
    what its comments say."""
    import subprocess
    import sys

    pytest.importorskip("distributed")
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    (block,) = [b for b in blocks if "lv.dask.write" in b]
    script = tmp_path / "scale.py"
    script.write_text(block)
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "[51. 52. 53.]" and lines[-1] == "7500000.0", proc.stdout
    assert "Ge " in proc.stdout and "Si " in proc.stdout  # the groupby's rows

    import lazyvault as lv

    with lv.Store.open(tmp_path / "sim.lv", mode="r") as store:
        assert len(store) == 101 and store.version == 2
        assert store["run-100"].temperature == 350.0
    assert not [p for p in os.listdir(tmp_path) if ".shards-" in p]


def test_arrow_example_runs(tmp_path: Path) -> None:
    """The "Metadata as Arrow tables" block runs and prints what its comments say."""
    import contextlib
    import io

    for module in ("pyarrow", "polars", "duckdb"):
        pytest.importorskip(module)
    section = README.read_text().split("## Metadata as Arrow tables", 1)[1]
    (block,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)[:1]
    said = [line.rpartition("  # ")[2].strip() for line in block.splitlines() if "print(" in line]
    out = io.StringIO()
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(block, "README.md", "exec"), {})
    finally:
        os.chdir(cwd)
    assert out.getvalue().splitlines() == said
