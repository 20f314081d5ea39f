"""The ``lazyvault`` command line (also ``python -m lazyvault``).

Subcommands and examples: ``lazyvault --help`` (``_EPILOG`` below).
``ls``, ``find``, ``show``, ``stats``, ``export`` and ``verify`` open the
store read-only; ``ls``, ``find``, ``show`` and ``stats`` read the index
only, never a payload. Every command that prints data takes ``--json``.

Exit codes: 0 success; 1 a lazyvault error or an OS error (message on stderr as
``lazyvault: <message>``, no traceback) or problems found by ``verify``;
2 a usage error (argparse's convention) or, for ``demo``, missing data.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from . import _display, demo
from ._lazyvault import __version__
from .demo import DEFAULT_DATA_DIR
from .errors import InteropError, LazyvaultError, MissingKeyError, StoreNotFoundError
from .record import Record
from .store import Store

__all__ = ["build_parser", "main"]

PROG = "lazyvault"

_DESCRIPTION = """\
Store Python objects made of small metadata and numpy arrays: metadata as
JSON records in an index, arrays as .npy files loaded on first access (memory-mapped when large)."""

_EPILOG = """\
examples:
  lazyvault demo --limit 100                 ingest 100 ViSP camera frames into a temporary store
  lazyvault ls runs.lv                       list every key
  lazyvault ls runs.lv "temperature > 250"   list the keys of the matching records
  lazyvault find runs.lv "material == 'Si'"  matching records, one line of metadata each
  lazyvault show runs.lv run-001             one record: metadata and arrays (no payload read)
  lazyvault stats runs.lv --json             records, arrays, bytes per dtype (index only)
  lazyvault export runs.lv si.lvz --query "material == 'Si'"   records to .lvz/.npz/.safetensors
  lazyvault import runs.lv model.safetensors frames/           files (or directories) into a store
  lazyvault verify runs.lv                   check every record against its payload files
  lazyvault gc runs.lv                       remove files no record references
  lazyvault repair runs.lv                   rebuild a lost or damaged index from the journal

exit status: 0 ok, 1 lazyvault error or verify problems, 2 usage error.
"""


def _json_default(value: Any) -> Any:
    # numpy scalars and other oddities that metadata should not hold, shown, not crashed on.
    item = getattr(value, "item", None)
    if callable(item):
        return item()
    return repr(value)


def _dump(value: Any, out: TextIO) -> None:
    json.dump(value, out, indent=2, ensure_ascii=False, default=_json_default)
    out.write("\n")


# -- subcommands ----------------------------------------------------------------


def _cmd_demo(args: argparse.Namespace, out: TextIO) -> int:
    if args.limit is not None and args.limit < 0:
        print(f"{PROG}: --limit must be >= 0", file=sys.stderr)
        return 2
    try:
        figures = demo.run(args.data, store_path=args.store, limit=args.limit, keep=args.keep)
    except demo.DataMissingError as e:
        print(
            f"{PROG}: no ViSP image data: {e}\n"
            f"  install it with: apt-get install visp-images-data\n"
            f"  or point to a copy with: {PROG} demo --data DIR",
            file=sys.stderr,
        )
        return 2
    if args.json:
        _dump(figures, out)
    else:
        out.write(demo.format_report(figures) + "\n")
    return 0


def _cmd_ls(args: argparse.Namespace, out: TextIO) -> int:
    with Store.open(args.path, mode="r") as store:
        keys = list(store.keys()) if args.expr is None else store.find(args.expr).keys()
    if args.json:
        _dump(keys, out)
    else:
        for key in keys:
            out.write(_printable(key) + "\n")
    return 0


def _printable(text: str) -> str:
    """``text`` with control characters escaped as Python would (``\\n``,
    ``\\x1b``), so one key stays one line and no escape sequence reaches
    the terminal; ``--json`` gives the exact keys."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _array_info(info: Any) -> dict[str, Any]:
    return {
        "shape": list(info.shape),
        "dtype": str(info.dtype),
        "nbytes": info.nbytes,
        "order": info.order,
    }


def _usage_error(command: str, message: str) -> int:
    print(f"{PROG} {command}: error: {message}", file=sys.stderr)
    return 2


def _compact(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=_json_default)
    return text if len(text) <= 40 else text[:37] + "..."


def _summary_line(rec: Record) -> str:
    """``key  field=value ...  [array dtype shape, ...]`` on one line."""
    fields = " ".join(
        f"{name}={_compact(value)}" for name, value in _display.flatten(rec.meta).items()
    )
    arrays = ", ".join(
        f"{name} {info.dtype} {tuple(info.shape)}" for name, info in rec.arrays.items()
    )
    line = rec.key
    if fields:
        line += "  " + fields
    if arrays:
        line += f"  [{arrays}]"
    return line.replace("\n", "\\n")


def _cmd_find(args: argparse.Namespace, out: TextIO) -> int:
    with Store.open(args.path, mode="r") as store:
        results = store.find(args.expr)
        if args.json:
            _dump(
                [
                    {
                        "key": rec.key,
                        "meta": rec.meta,
                        "arrays": {n: _array_info(i) for n, i in rec.arrays.items()},
                    }
                    for rec in results
                ],
                out,
            )
            return 0
        for rec in results:
            out.write(_summary_line(rec) + "\n")
    return 0


def _cmd_stats(args: argparse.Namespace, out: TextIO) -> int:
    with Store.open(args.path, mode="r") as store:
        # the commit these figures describe (an archive has none)
        version = getattr(store, "version", None)
        keys = list(store.keys()) if args.expr is None else store.keys(args.expr)
        arrays = nbytes = 0
        dtypes: dict[str, dict[str, int]] = {}
        for key in keys:
            for info in store[key].arrays.values():
                arrays += 1
                nbytes += info.nbytes
                entry = dtypes.setdefault(str(info.dtype), {"arrays": 0, "bytes": 0})
                entry["arrays"] += 1
                entry["bytes"] += info.nbytes
    dtypes = dict(sorted(dtypes.items(), key=lambda kv: (-kv[1]["bytes"], kv[0])))
    stats = {
        "path": args.path,
        "version": version,
        "records": len(keys),
        "arrays": arrays,
        "bytes": nbytes,
        "dtypes": dtypes,
    }
    if args.json:
        _dump(stats, out)
        return 0
    out.write(
        f"{args.path}: {len(keys):,} records, {arrays:,} arrays, "
        f"{_display.human_size(nbytes)} of array data ({nbytes:,} bytes)\n"
    )
    if dtypes:
        width = max(len("dtype"), *(len(d) for d in dtypes))
        out.write(f"  {'dtype':<{width}}  {'arrays':>10}  {'bytes':>16}\n")
        for dtype, entry in dtypes.items():
            out.write(
                f"  {dtype:<{width}}  {entry['arrays']:>10,}  {entry['bytes']:>16,}  "
                f"({_display.human_size(entry['bytes'])})\n"
            )
    return 0


def _cmd_export(args: argparse.Namespace, out: TextIO) -> int:
    with Store.open(args.path, mode="r") as store:
        if not isinstance(store, Store):
            raise InteropError(
                f"{args.path} is a .lvz archive; export works on a store: "
                f"`{PROG} import STORE {args.path}` first"
            )
        if args.keys is not None:
            count = len(dict.fromkeys(args.keys))
        elif args.query is not None:
            count = store.count(args.query)
        else:
            count = len(store)
        store.export(args.out, keys=args.keys, query=args.query, progress=_progress(args))
    if args.json:
        _dump({"path": args.path, "out": args.out, "records": count}, out)
    else:
        out.write(f"{args.out}: wrote {count:,} record(s) from {args.path}\n")
    return 0


def _cmd_import(args: argparse.Namespace, out: TextIO) -> int:
    if args.key is not None and len(args.files) != 1:
        return _usage_error("import", "--key names the record of a single FILE")
    imported: dict[str, list[str]] = {}
    with Store.open(args.path, mode="a") as store:
        for file in args.files:
            imported[file] = store.import_file(file, key=args.key, progress=_progress(args))
    if args.json:
        records = sum(len(keys) for keys in imported.values())
        _dump({"path": args.path, "records": records, "files": imported}, out)
    else:
        for keys in imported.values():
            for key in keys:
                out.write(key + "\n")
    return 0


def _cmd_show(args: argparse.Namespace, out: TextIO) -> int:
    with Store.open(args.path, mode="r") as store:
        try:
            rec = store[args.key]
        except MissingKeyError:
            raise MissingKeyError(f"no record {args.key!r} in {args.path}") from None
        shown = {
            "key": rec.key,
            "repr": repr(rec),
            "meta": rec.meta,
            "arrays": {name: _array_info(info) for name, info in rec.arrays.items()},
        }
    if args.json:
        _dump(shown, out)
        return 0
    out.write(shown["repr"] + "\n\nmeta:\n")
    out.write(json.dumps(shown["meta"], indent=2, ensure_ascii=False, default=_json_default))
    out.write("\n\narrays:\n")
    arrays = shown["arrays"]
    if not arrays:
        out.write("  (none)\n")
    width = max((len(n) for n in arrays), default=0)
    for name, a in arrays.items():
        out.write(
            f"  {name:<{width}}  shape={tuple(a['shape'])}  dtype={a['dtype']}  "
            f"nbytes={a['nbytes']:,}  order={a['order']}\n"
        )
    return 0


def _progress(args: argparse.Namespace) -> bool | None:
    return False if args.json or args.no_progress else None


def _cmd_verify(args: argparse.Namespace, out: TextIO) -> int:
    with Store.open(args.path, mode="r") as store:
        if isinstance(store, Store):
            report = store.verify(checksums=not args.quick, progress=_progress(args))
        else:  # a .lvz archive: CRC-32 of every member
            report = store.verify()
    if args.json:
        _dump(report, out)
    else:
        status = "ok" if report["ok"] else f"{len(report['problems'])} problem(s)"
        out.write(
            f"{args.path}: {status}: {report['records']:,} records, "
            f"{report['arrays']:,} arrays checked"
            + (f", {report['checksummed']:,} checksums" if "checksummed" in report else "")
            + "\n"
        )
        for problem in report["problems"]:
            out.write(f"  problem: {problem}\n")
        orphans = report.get("orphans", [])  # archives have none
        if orphans:
            out.write(
                f"  {len(orphans):,} orphan file(s), referenced by no record "
                f"(`{PROG} gc {args.path}` removes them):\n"
            )
            for orphan in orphans:
                out.write(f"    {orphan}\n")
    return 0 if report["ok"] else 1


def _cmd_gc(args: argparse.Namespace, out: TextIO) -> int:
    if not os.path.exists(os.path.join(args.path, "lazyvault.json")):
        # mode "a" would create an empty store at a mistyped path
        raise StoreNotFoundError(f"{args.path}: no such store")
    with Store.open(args.path, mode="a") as store:
        report = store.gc()
    if args.json:
        _dump(report, out)
    else:
        out.write(
            f"{args.path}: removed {report['removed_files']:,} orphan file(s), "
            f"{report['removed_bytes']:,} bytes; journal compacted, "
            f"{report['journal_bytes_freed']:,} bytes freed\n"
        )
    return 0


def _cmd_repair(args: argparse.Namespace, out: TextIO) -> int:
    report = Store.repair(args.path)
    if args.json:
        _dump(report, out)
        return 0
    out.write(
        f"{args.path}: index rebuilt: {report['records']:,} records from "
        f"{report['entries']:,} journal entries\n"
    )
    if report["moved_index"]:
        out.write(f"  the old index was moved to {report['moved_index']} (remove it when done)\n")
    for skipped in report["skipped"]:
        out.write(f"  skipped: {skipped}\n")
    out.write(f"  next: `{PROG} verify {args.path}`, then `{PROG} gc {args.path}`\n")
    return 0


# -- parser ---------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``lazyvault`` command."""
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog=PROG, description=_DESCRIPTION, epilog=_EPILOG, formatter_class=fmt
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def add(
        name: str, summary: str, example: str, func: Callable[[argparse.Namespace, TextIO], int]
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(
            name,
            help=summary,
            description=summary,
            epilog=f"example:\n  {example}",
            formatter_class=fmt,
        )
        p.set_defaults(func=func)
        return p

    p = add(
        "demo",
        "ingest Debian's visp-images-data camera frames, query them, print the figures",
        "lazyvault demo --limit 100 --keep   # then: lazyvault ls <store> 'width >= 640'",
        _cmd_demo,
    )
    p.add_argument(
        "--data",
        metavar="DIR",
        default=DEFAULT_DATA_DIR,
        help=f"the ViSP-images directory (default: {DEFAULT_DATA_DIR})",
    )
    p.add_argument(
        "--store",
        metavar="PATH",
        default=None,
        help="create the store here (must not exist; kept). Default: a new temporary "
        "directory, removed at the end unless --keep",
    )
    p.add_argument("--limit", metavar="N", type=int, default=None, help="ingest at most N frames")
    p.add_argument("--keep", action="store_true", help="keep the temporary store")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object")

    p = add(
        "ls",
        "list the keys of a store, or of the records matching a query",
        "lazyvault ls runs.lv \"temperature > 250 and material == 'Si'\"",
        _cmd_ls,
    )
    p.add_argument("path", metavar="PATH", help="the store")
    p.add_argument("expr", metavar="EXPR", nargs="?", help="a query (see store/QUERY.md)")
    p.add_argument("--json", action="store_true", help="print a JSON list")

    p = add(
        "find",
        "the records matching a query, one line each: key, metadata, arrays; reads no payload",
        "lazyvault find runs.lv \"temperature > 250 and material == 'Si'\" --json",
        _cmd_find,
    )
    p.add_argument("path", metavar="PATH", help="the store, or a .lvz archive")
    p.add_argument("expr", metavar="EXPR", help="a query (see store/QUERY.md)")
    p.add_argument("--json", action="store_true", help="print a JSON list of {key, meta, arrays}")

    p = add(
        "show",
        "show one record: repr, metadata as JSON, arrays (shape, dtype, nbytes, order); "
        "reads no payload",
        "lazyvault show runs.lv run-001",
        _cmd_show,
    )
    p.add_argument("path", metavar="PATH", help="the store")
    p.add_argument("key", metavar="KEY", help="the record's key")
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = add(
        "stats",
        "count records, arrays and bytes, per dtype, from the index alone (no payload read)",
        "lazyvault stats runs.lv \"material == 'Si'\" --json",
        _cmd_stats,
    )
    p.add_argument("path", metavar="PATH", help="the store, or a .lvz archive")
    p.add_argument(
        "expr", metavar="EXPR", nargs="?", help="count only the records matching this query"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = add(
        "export",
        "write records to one file, format by OUT's extension: .lvz (lazyvault's archive), "
        ".npz or .safetensors",
        "lazyvault export runs.lv si.lvz --query \"material == 'Si'\"",
        _cmd_export,
    )
    p.add_argument("path", metavar="PATH", help="the store")
    p.add_argument("out", metavar="OUT", help="the file to write (.lvz, .npz or .safetensors)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--query", metavar="EXPR", help="export the records matching a query")
    which.add_argument("--keys", metavar="K", nargs="+", help="export these keys")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print a JSON summary")

    p = add(
        "import",
        "read .npy, .npz, .safetensors or .lvz files (format from the content), or every such "
        "file under a directory, into a store (created if missing); prints the keys written",
        "lazyvault import runs.lv model.safetensors --key bert",
        _cmd_import,
    )
    p.add_argument(
        "path", metavar="PATH", help="the store (opened for writing; created if missing)"
    )
    p.add_argument("files", metavar="FILE", nargs="+", help="files or directories to import")
    p.add_argument(
        "--key",
        metavar="K",
        help="the key of the record (one FILE only; default: the file name without extension)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the keys written per file as JSON")

    p = add(
        "verify",
        "check every record against the journal and its payload files, hashing the data "
        "against the checksums recorded at write time (exit 1 if there are problems)",
        "lazyvault verify runs.lv --quick --json",
        _cmd_verify,
    )
    p.add_argument("path", metavar="PATH", help="the store, or a .lvz archive")
    p.add_argument(
        "--quick",
        action="store_true",
        help="check headers and sizes only, do not read the data to check its checksum",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the report as JSON")

    p = add(
        "gc",
        "remove payload files that no record references (left by a crash), compact the journal",
        "lazyvault gc runs.lv",
        _cmd_gc,
    )
    p.add_argument("path", metavar="PATH", help="the store (opened for writing)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")

    p = add(
        "repair",
        "rebuild a lost or damaged index from the record journal (the old index is moved "
        "aside, nothing is deleted)",
        "lazyvault repair runs.lv && lazyvault verify runs.lv && lazyvault gc runs.lv",
        _cmd_repair,
    )
    p.add_argument("path", metavar="PATH", help="the store")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


def _message(error: BaseException) -> str:
    if isinstance(error, KeyError) and len(error.args) == 1:
        return str(error.args[0])  # KeyError's str() adds quotes
    return str(error) or type(error).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the ``lazyvault`` command with ``argv`` (default ``sys.argv[1:]``)
    and returns its exit status (usage errors return 2 instead of exiting)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version, usage errors
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    if args.command is None:
        parser.print_usage(sys.stderr)
        print(f"{PROG}: error: a command is required (try '{PROG} --help')", file=sys.stderr)
        return 2
    try:
        return int(args.func(args, sys.stdout))
    except LazyvaultError as e:
        print(f"{PROG}: {_message(e)}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # `lazyvault ls big.lv | head`: stop quietly, as coreutils do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except OSError as e:  # the file system said no: an OUT in a missing directory, ...
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1
