"""The peer benchmark harness (benches/peers) still runs end to end: a tiny
run over the systems that need no extra package, checked for its tables,
its checks across systems and its RESULTS section (no timing is asserted)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

HARNESS = Path(__file__).resolve().parents[1] / "benches" / "peers"


def _skip_without(*modules: str) -> None:
    """Skips the test when a peer is not installed, without importing it here: lance
    warns at every later fork of this process (it is not fork-safe), which fails the fork
    tests that run after this one."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)}")


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(HARNESS), "--data", str(tmp_path / "data"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)


def test_a_tiny_run_writes_every_workload_into_the_results_file(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n\nhand-written text stays\n")
    args = ["--sizes", "30", "60", "--big-gib", "0.004", "--many", "40", "--repeat", "1"]
    args += ["--limits-mib", "8", "--cold", "--results", str(results)]
    args += ["--scan-n", "300", "--small-n", "40"]
    args += ["--systems", "lazyvault", "numpy .npy", "pickle files", "SQLite+npy", "SQLite"]
    out = _run(tmp_path, *args)
    assert out.returncode == 0, out.stderr[-3000:]
    text = results.read_text()
    assert text.startswith("# Benchmark results\n\nhand-written text stays\n")
    for w in "abcdefghijkl":
        assert f"### ({w}) " in text, w
    # issue 15's workloads (k, l) go to a section of their own, with their targets
    assert text.count("<!-- issue15:begin -->") == 1
    issue15 = text.split("<!-- issue15:begin -->")[1]
    assert "### Targets (issue 15)" in issue15 and "### (k) " in issue15
    assert "| SQLite | " in issue15 and "not the target's 1M" in issue15
    # lazyvault's find both as the peers' list and as the Results it returns (keys packed), the
    # target line on the latter, the list's ratio kept beside it
    assert "### (k) find (keys) of a 2-field predicate over 300 records" in issue15
    assert "### (k) find (Results) of a 2-field predicate over 300 records" in issue15
    assert "| find: >= 100x faster than main at " in issue15
    assert "`store.find(QUERY)`, the Results with keys packed in Rust" in issue15
    assert "| find as a list (`find(QUERY).keys()`, as the baseline measured)" in issue15
    assert "warm cache" in text and "cold cache" in text
    assert "| lazyvault |" in text and "| SQLite+npy |" in text
    assert "./dev bench " in text and "--sizes 30 60" in text
    # a second run replaces the section instead of appending another
    again = ["--sizes", "30", "--workloads", "b", "--repeat", "1", "--limits-mib", "8"]
    out = _run(tmp_path, *again, "--results", str(results), "--systems", "lazyvault")
    assert out.returncode == 0, out.stderr[-3000:]
    text = results.read_text()
    assert text.count("<!-- peers:begin -->") == 1 and "### (c) " not in text
    assert "hand-written text stays" in text
    assert text.count("<!-- issue15:begin -->") == 1 and "### (k) " in text  # left as it was


def test_the_issue_15_workloads_check_every_system_against_the_same_answers(
    tmp_path: Path,
) -> None:
    _skip_without("duckdb", "polars", "pyarrow", "lance")
    args = ["--workloads", "kl", "--scan-n", "500", "--small-n", "60", "--repeat", "1"]
    args += ["--limits-mib", "1", "--no-results"]
    args += ["--systems", "lazyvault", "DuckDB+Parquet", "polars", "SQLite", "Lance"]
    out = _run(tmp_path, *args)
    assert out.returncode == 0, out.stderr[-3000:]
    # every system answered (a wrong count or key list fails the run), each case has a row
    for system in ("DuckDB+Parquet", "polars", "SQLite", "Lance"):
        assert f"\n  {system} " in out.stdout, system
    assert "(k) count of a 2-field predicate over 500 records" in out.stdout
    assert "(l) read the array of each of 60 records" in out.stdout
    assert "| count of the 2-field predicate <= DuckDB over Parquet" in out.stdout
    assert [p.name for p in (tmp_path / "data").iterdir()] == []


def test_bad_arguments_are_refused_before_any_work(tmp_path: Path) -> None:
    a_file = tmp_path / "f"
    a_file.write_text("x")
    for args, message in [
        (["--workloads", "az"], "unknown workloads: z"),
        (["--systems", "numpy .npy"], "lazyvault must be among the systems"),
        (["--systems", "lazyvault", "foo"], "unknown systems: 'foo'"),
        (["--sizes", "0"], "--sizes must be positive"),
        (["--small-n", "0"], "--scan-n and --small-n must be positive"),
        (["--workloads", "km"], "unknown workloads: m"),
        (["--repeat", "0"], "--repeat must be at least 1"),
        (["--big-gib", "0"], "--big-gib must hold"),
        (["--data", str(a_file)], "not a directory"),
    ]:
        out = _run(tmp_path, *args, "--no-results")
        assert out.returncode == 2 and message in out.stderr, (args, out.stderr[-500:])
        assert "measuring" not in out.stdout, args


def test_data_keeps_what_was_in_it(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "precious.txt").write_text("x")
    args = ["--sizes", "5", "--workloads", "b", "--repeat", "1", "--limits-mib", "1"]
    out = _run(tmp_path, *args, "--systems", "lazyvault", "--no-results")
    assert out.returncode == 0, out.stderr[-2000:]
    assert [p.name for p in data.iterdir()] == ["precious.txt"]


DASK_SUM = Path(__file__).resolve().parents[1] / "benches" / "dask_sum.py"


def test_the_dask_sum_bench_runs_on_tiny_sizes(tmp_path: Path) -> None:
    for module in ("dask", "distributed", "zarr", "h5py"):
        pytest.importorskip(module)
    cmd = [sys.executable, str(DASK_SUM), "--cases", "12:4", "--chunk-mib", "128", "1"]
    cmd += ["--repeat", "1", "--dir", str(tmp_path), "--systems", "lazyvault", "zarr"]
    cmd += ["zarr zstd", "h5py contiguous", "h5py chunked"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    # one table per case and chunking, every system in each, under both schedulers
    assert out.stdout.count("| system | build | graph pickle |") == 2
    assert "| distributed | GB/s | lazyvault / it | threads |" in out.stdout
    for system in ("lazyvault", "zarr", "zarr zstd", "h5py contiguous", "h5py chunked"):
        assert out.stdout.count(f"\n| {system} | ") == 2, system
    assert "12 records per chunk (lazyvault's default" in out.stdout
    assert "256 records per chunk (1 MiB chunks): 1 chunks" in out.stdout
    assert list(tmp_path.iterdir()) == []  # the data is removed


def test_lance_takes_part_in_every_workload_it_can_hold(tmp_path: Path) -> None:
    _skip_without("pyarrow", "lance")
    args = ["--workloads", "abcdefhij", "--sizes", "20", "--big-gib", "0.002", "--many", "10"]
    args += ["--repeat", "1", "--limits-mib", "1", "--no-results"]
    out = _run(tmp_path, *args, "--systems", "lazyvault", "Lance")
    assert out.returncode == 0, out.stderr[-3000:]
    tables = out.stdout.split("\n(")
    for w in "abcdehij":  # a row with a measured value in every table of these workloads
        rows = [t for t in tables if t.startswith(f"{w}) ")]
        assert rows and all("\n  Lance " in t for t in rows), w
    # one object of many arrays is no table row: skipped with the reason, its reads too
    assert "skipped: one object of thousands of arrays" in out.stdout


def test_the_issue_15_peers_are_skipped_with_their_reason_when_missing(tmp_path: Path) -> None:
    # a sitecustomize that makes the columnar packages look absent to the harness
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import importlib.util\n"
        "_real = importlib.util.find_spec\n"
        "def _find(name, package=None):\n"
        "    if name.split('.')[0] in {'duckdb', 'polars', 'lance', 'pyarrow'}:\n"
        "        return None\n"
        "    return _real(name, package)\n"
        "importlib.util.find_spec = _find\n"
    )
    cmd = [sys.executable, str(HARNESS), "--data", str(tmp_path / "data"), "--workloads", "kl"]
    cmd += ["--scan-n", "200", "--small-n", "20", "--repeat", "1", "--limits-mib", "1"]
    cmd += ["--no-results"]
    path = [str(site), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "skipping DuckDB+Parquet: not installed: duckdb, pyarrow" in out.stdout
    assert "skipping polars: not installed" in out.stdout
    assert "skipping Lance: not installed: lance, pyarrow" in out.stdout
    # lazyvault and SQLite still ran both workloads
    assert "(k) count of a 2-field predicate over 200 records" in out.stdout
    assert "\n  SQLite " in out.stdout and "\n  Lance " not in out.stdout


def test_the_scan_cache_keeps_lazyvaults_scan_store_for_the_next_run(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    args = ["--workloads", "k", "--scan-n", "50", "--repeat", "1", "--limits-mib", "1"]
    args += ["--no-results", "--scan-cache", str(cache), "--systems", "lazyvault", "SQLite"]
    first = _run(tmp_path, *args)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "(reused" not in first.stdout
    assert sorted(p.name for p in cache.iterdir()) == [
        "lazyvault-scan-50",
        "lazyvault-scan-50.done",
    ]
    again = _run(tmp_path, *args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"(reused {cache / 'lazyvault-scan-50'})" in again.stdout
    assert "(k) count of a 2-field predicate over 50 records" in again.stdout


def test_the_find_target_is_met_by_the_results_row_against_the_list_baseline() -> None:
    # the targets table from made-up rows at the target's size (no timing measured): the
    # ">= 100x" line of find takes lazyvault's Results row, the list row's ratio stays beside it
    script = f"""
import sys
sys.path.insert(0, {str(HARNESS)!r})
from pathlib import Path
import columnar
from workloads import Context, Row
ctx = Context({{}}, Path("."), [], 1.0, 1, 1, False, 1.0)
base = columnar.json.loads(columnar.BASELINE.read_text())["find"]
case = "of a 2-field predicate over 1,000,000 records"
rows = [
    Row("k", f"find (keys) {{case}}", "lazyvault", base / 50),
    Row("k", f"find (Results) {{case}}", "lazyvault", base / 200),
]
print(columnar.targets(rows, ctx, {{"sum": 1e10, "memcpy": 1e10, "write": 1e9}}))
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    (target,) = [line for line in out.stdout.splitlines() if line.startswith("| find: >= 100x")]
    assert "`store.find(QUERY)`, the Results" in target and "| 0.005 (baseline " in target
    assert "| <= 0.01 | yes |" in target
    (listed,) = [line for line in out.stdout.splitlines() if line.startswith("| find as a list")]
    assert "| 0.02 (baseline " in listed and "| - | - |" in listed
