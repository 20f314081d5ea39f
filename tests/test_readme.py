"""The README's first example runs as written (in a temporary directory)."""

from __future__ import annotations

import os
import re
from pathlib import Path

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
