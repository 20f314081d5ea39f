"""The ``lazyvault`` command line (also ``python -m lazyvault``).

Subcommands and examples: ``lazyvault --help``; each is declared once, with its arguments, by
``@_command`` on the function that runs it and returns an :class:`_Output` (printed as text, or as
JSON with ``--json``, which every command takes). ``ls``, ``find``, ``show``, ``stats``, ``export``
and ``verify`` open the store read-only; ``ls``, ``find``, ``show`` and ``stats`` read the index
only, never a payload.

Exit codes: 0 success; 1 a lazyvault error or an OS error (message on stderr as ``lazyvault:
<message>``, no traceback) or problems found by ``verify``; 2 a usage error (argparse's convention).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from . import _display
from ._lazyvault import __version__
from .errors import (
    InteropError,
    LazyvaultError,
    MissingKeyError,
    NotAStoreError,
    PickleNotAllowedError,
    StoreNotFoundError,
    UnknownFormatError,
)
from .record import Record, entry_of
from .store import Store

__all__ = ["build_parser", "main"]

PROG = "lazyvault"

_DESCRIPTION = """\
Store Python objects made of small metadata and numpy arrays: metadata as
JSON records in an index, arrays as .npy files loaded on first access (memory-mapped when large)."""

_EXIT_STATUS = "exit status: 0 ok, 1 lazyvault error or verify problems, 2 usage error."


class _Output(NamedTuple):
    """What a command prints: ``value`` with ``--json``, else ``text``."""

    value: Any
    text: str
    status: int = 0


class _UsageError(Exception):
    """A usage error argparse cannot see (exit status 2)."""


#: One argument: the flags and the keywords of ``add_argument``.
Option = tuple[tuple[str, ...], dict[str, Any]]
Run = Callable[[argparse.Namespace], _Output]


class _Command(NamedTuple):
    summary: str
    example: str
    run: Run
    options: tuple[Option | list[Option], ...]


#: The subcommands in the order ``--help`` lists them.
_COMMANDS: dict[str, _Command] = {}


def _command(
    name: str, summary: str, example: str, *options: Option | list[Option]
) -> Callable[[Run], Run]:
    """Declares the subcommand ``name``, run by the decorated function, and its arguments in order
    (a list: a mutually exclusive group)."""

    def register(run: Run) -> Run:
        _COMMANDS[name] = _Command(summary, example, run, options)
        return run

    return register


def _opt(*flags: str, **kwargs: Any) -> Option:
    return flags, kwargs


def _path(help: str = "the store") -> Option:
    return _opt("path", metavar="PATH", help=help)


def _flag(flag: str, help: str) -> Option:
    return _opt(flag, action="store_true", help=help)


def _refuse_archive(path: str, command: str) -> None:
    if os.path.isfile(path):  # an archive is one read-only file
        raise NotAStoreError(
            f"{path} is a file (a .lvz archive?): {command} works on a store directory; "
            f"`{PROG} verify {path}` checks an archive whole"
        )


def _positive_int(text: str) -> int:
    """A whole number from 1 to 2**64-1 (an argparse ``type``: the core takes no other)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value < 2**64:
        raise argparse.ArgumentTypeError(f"not a whole number from 1 to 2**64-1: {text!r}")
    return value


_STORE_OR_ARCHIVE = "the store, or a .lvz archive"
_QUERY = "a query (see store/QUERY.md)"
_NO_PROGRESS = _flag("--no-progress", "no progress bar")


# -- helpers ----------------------------------------------------------------------


def _json_default(value: Any) -> Any:
    # datetimes, numpy scalars and other values JSON cannot hold, shown, not crashed on.
    if isinstance(value, datetime.date):
        return value.isoformat()
    item = getattr(value, "item", None)
    if callable(item):
        return item()
    return repr(value)


def _keys(store: Any, expr: str | None) -> list[str]:
    return list(store.keys()) if expr is None else store.keys(expr)


def _lines(lines: Sequence[str]) -> str:
    return "".join(line + "\n" for line in lines)


def _printable(text: str) -> str:
    """``text`` with control characters escaped as Python would (``\\n``, ``\\x1b``), so one key
    stays one line and no escape sequence reaches the terminal; ``--json`` gives the exact keys."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _printable_json(text: str) -> str:
    """JSON ``text`` (indented) with every character that is not printable but a line break
    written as its ``\\u`` escape (DEL, C1 controls, bidirectional overrides): the same JSON, safe
    for a terminal. Such characters only occur inside JSON strings, where the escape means them."""
    if all(c.isprintable() or c == "\n" for c in text):
        return text
    return "".join(
        c if c.isprintable() or c == "\n" else json.dumps(c, ensure_ascii=True)[1:-1] for c in text
    )


def _as_json(rec: Record, **extra: Any) -> dict[str, Any]:
    """``{"key", **extra, "meta", "arrays": {name: {shape, dtype, nbytes, order}}}``; meta as the
    record holds it (tagged values as JSON, schema/FORMAT.md "Tagged values": valid, exact JSON)."""
    arrays = {
        name: {"shape": list(i.shape), "dtype": str(i.dtype), "nbytes": i.nbytes, "order": i.order}
        for name, i in rec.arrays.items()
    }
    return {"key": rec.key, **extra, "meta": entry_of(rec)["meta"], "arrays": arrays}


def _summary_line(rec: Record) -> str:
    """``key  field=value ...  [array dtype shape, ...]`` on one line, each value as compact JSON
    cut to 40 characters."""
    dump = functools.partial(json.dumps, ensure_ascii=False, separators=(",", ":"))
    flat = _display.flatten(rec.meta)
    fields = " ".join(
        f"{n}={_display.cut(dump(v, default=_json_default), 40)}" for n, v in flat.items()
    )
    arrays = ", ".join(f"{n} {i.dtype} {tuple(i.shape)}" for n, i in rec.arrays.items())
    line = "  ".join(part for part in (rec.key, fields, arrays and f"[{arrays}]") if part)
    return _printable(line)


def _progress(args: argparse.Namespace) -> bool | None:
    return False if args.json or args.no_progress else None


# -- subcommands ------------------------------------------------------------------


@_command(
    "ls",
    "list the keys of a store, or of the records matching a query",
    "lazyvault ls runs.lv \"temperature > 250 and material == 'Si'\"",
    _path(),
    _opt("expr", metavar="EXPR", nargs="?", help=_QUERY),
    _flag("--json", "print a JSON list"),
)
def _cmd_ls(args: argparse.Namespace) -> _Output:
    with Store.open(args.path, mode="r") as store:
        keys = _keys(store, args.expr)
    return _Output(keys, _lines([_printable(key) for key in keys]))


@_command(
    "find",
    "the records matching a query, one line each: key, metadata, arrays; reads no payload",
    "lazyvault find runs.lv \"temperature > 250 and material == 'Si'\" --json",
    _path(_STORE_OR_ARCHIVE),
    _opt("expr", metavar="EXPR", help=_QUERY),
    _flag("--json", "print a JSON list of {key, meta, arrays}"),
)
def _cmd_find(args: argparse.Namespace) -> _Output:
    with Store.open(args.path, mode="r") as store:
        results = list(store.find(args.expr))
    return _Output([_as_json(r) for r in results], _lines([_summary_line(r) for r in results]))


@_command(
    "show",
    "show one record: repr, metadata as JSON, arrays (shape, dtype, nbytes, order); "
    "reads no payload",
    "lazyvault show runs.lv run-001",
    _path(),
    _opt("key", metavar="KEY", help="the record's key"),
    _flag("--json", "print one JSON object"),
)
def _cmd_show(args: argparse.Namespace) -> _Output:
    with Store.open(args.path, mode="r") as store:
        try:
            rec = store[args.key]
        except MissingKeyError:
            raise MissingKeyError(args.key, f"no record {args.key!r} in {args.path}") from None
        shown = _as_json(rec, repr=repr(rec))
    meta = _printable_json(
        json.dumps(shown["meta"], indent=2, ensure_ascii=False, default=_json_default)
    )
    lines = [shown["repr"], "", "meta:", meta, "", "arrays:"]
    arrays = {_display.name_text(n): a for n, a in shown["arrays"].items()}
    width = max((len(n) for n in arrays), default=0)
    lines += [
        f"  {name:<{width}}  shape={tuple(a['shape'])}  dtype={a['dtype']}  "
        f"nbytes={a['nbytes']:,}  order={a['order']}"
        for name, a in arrays.items()
    ] or ["  (none)"]
    return _Output(shown, _lines(lines))


@_command(
    "stats",
    "count records, arrays and bytes, per dtype, from the index alone (no payload read)",
    "lazyvault stats runs.lv \"material == 'Si'\" --json",
    _path(_STORE_OR_ARCHIVE),
    _opt("expr", metavar="EXPR", nargs="?", help="count only the records matching this query"),
    _flag("--json", "print one JSON object"),
)
def _cmd_stats(args: argparse.Namespace) -> _Output:
    with Store.open(args.path, mode="r") as store:
        # the commit these figures describe (an archive has none)
        version = getattr(store, "version", None)
        keys = _keys(store, args.expr)
        dtypes: dict[str, dict[str, int]] = {}
        for key in keys:
            for info in store[key].arrays.values():
                entry = dtypes.setdefault(str(info.dtype), {"arrays": 0, "bytes": 0})
                entry["arrays"] += 1
                entry["bytes"] += info.nbytes
    arrays = sum(e["arrays"] for e in dtypes.values())
    nbytes = sum(e["bytes"] for e in dtypes.values())
    dtypes = dict(sorted(dtypes.items(), key=lambda kv: (-kv[1]["bytes"], kv[0])))
    stats = {"path": args.path, "version": version, "records": len(keys)}
    stats |= {"arrays": arrays, "bytes": nbytes, "dtypes": dtypes}
    human = _display.human_size
    lines = [
        f"{args.path}: {len(keys):,} records, {arrays:,} arrays, "
        f"{human(nbytes)} of array data ({nbytes:,} bytes)"
    ]
    if dtypes:
        width = max(len("dtype"), *(len(d) for d in dtypes))
        lines.append(f"  {'dtype':<{width}}  {'arrays':>10}  {'bytes':>16}")
        lines += [
            f"  {dtype:<{width}}  {e['arrays']:>10,}  {e['bytes']:>16,}  ({human(e['bytes'])})"
            for dtype, e in dtypes.items()
        ]
    return _Output(stats, _lines(lines))


@_command(
    "export",
    "write records to one file, format by OUT's extension: .lvz (lazyvault's archive), "
    ".npz or .safetensors",
    "lazyvault export runs.lv si.lvz --query \"material == 'Si'\"",
    _path(),
    _opt("out", metavar="OUT", help="the file to write (.lvz, .npz or .safetensors)"),
    [
        _opt("--query", metavar="EXPR", help="export the records matching a query"),
        _opt("--keys", metavar="K", nargs="+", help="export these keys"),
    ],
    _NO_PROGRESS,
    _flag("--json", "print a JSON summary"),
)
def _cmd_export(args: argparse.Namespace) -> _Output:
    with Store.open(args.path, mode="r") as store:
        if not isinstance(store, Store):
            raise InteropError(
                f"{args.path} is a .lvz archive; export works on a store: "
                f"`{PROG} import STORE {args.path}` first"
            )
        count = store.count(args.query) if args.keys is None else len(dict.fromkeys(args.keys))
        try:
            store.export(args.out, keys=args.keys, query=args.query, progress=_progress(args))
        except UnknownFormatError as e:  # OUT's extension: a usage error, found before writing
            raise _UsageError("export", str(e)) from None
    summary = {"path": args.path, "out": args.out, "records": count}
    return _Output(summary, f"{args.out}: wrote {count:,} record(s) from {args.path}\n")


@_command(
    "import",
    "read .npy, .npz, .safetensors or .lvz files (format from the content), or every such "
    "file under a directory, into a store (created if missing), all or nothing; prints the "
    "keys written",
    "lazyvault import runs.lv model.safetensors --key bert",
    _path("the store (opened for writing; created if missing)"),
    _opt("files", metavar="FILE", nargs="+", help="files or directories to import"),
    _opt(
        "--key",
        metavar="K",
        help="the key of the record (one FILE only; default: the file name without extension)",
    ),
    _opt(
        "--max-header-size",
        metavar="N",
        type=_positive_int,
        help="read .npy headers (files and .npz members) of up to N bytes (default: 10000, "
        "numpy's limit)",
    ),
    _opt(
        "--max-ratio",
        metavar="R",
        type=_positive_int,
        help="accept deflated .npz members that declare up to R times their compressed size "
        "(default: 1100)",
    ),
    _flag(
        "--allow-pickle",
        "import object arrays, stored as pickles (loading them can run code: trust the file)",
    ),
    _NO_PROGRESS,
    _flag("--json", "print the keys written as JSON"),
)
def _cmd_import(args: argparse.Namespace) -> _Output:
    if args.key is not None and len(args.files) != 1:
        raise _UsageError("import", "--key names the record of a single FILE")
    limits = {"max_header_size": args.max_header_size, "max_ratio": args.max_ratio}
    created = not os.path.exists(args.path)
    try:
        with Store.open(args.path, mode="a", allow_pickle=args.allow_pickle) as store:
            keys = store.import_file(args.files, args.key, progress=_progress(args), **limits)
    except LazyvaultError as e:
        if created:  # a refused import leaves no empty store behind
            shutil.rmtree(args.path, ignore_errors=True)
        if isinstance(e, PickleNotAllowedError):  # the command line's way to allow it
            raise PickleNotAllowedError(f"{e}; here: --allow-pickle") from None
        raise
    return _Output({"path": args.path, "records": len(keys), "keys": keys}, _lines(keys))


@_command(
    "verify",
    "check every record against the journal and its payload files, hashing the data "
    "against the checksums recorded at write time (exit 1 if there are problems)",
    "lazyvault verify runs.lv --quick --json",
    _path(_STORE_OR_ARCHIVE),
    _flag("--quick", "check headers and sizes only, do not read the data to check its checksum"),
    _NO_PROGRESS,
    _flag("--json", "print the report as JSON"),
)
def _cmd_verify(args: argparse.Namespace) -> _Output:
    with Store.open(args.path, mode="r") as store:
        if isinstance(store, Store):
            report = store.verify(checksums=not args.quick, progress=_progress(args))
        else:  # a .lvz archive: CRC-32 of every member
            report = store.verify()
    status = "ok" if report["ok"] else f"{len(report['problems'])} problem(s)"
    checksums = ""
    if "checksummed" in report:  # archives check CRC-32s instead
        n, bad = report["checksummed"], report["checksum_mismatches"]
        checksums = f", {n:,} checksum{'' if n == 1 else 's'} compared"
        if bad:
            checksums += f", {bad:,} mismatch{'' if bad == 1 else 'es'}"
    lines = [
        f"{args.path}: {status}: {report['records']:,} records, "
        f"{report['arrays']:,} arrays checked{checksums}",
        *(f"  problem: {problem}" for problem in report["problems"]),
    ]
    orphans = report.get("orphans", [])  # archives have none
    if orphans:
        lines.append(
            f"  {len(orphans):,} orphan file(s), referenced by no record "
            f"(`{PROG} gc {args.path}` removes them):"
        )
        lines += [f"    {orphan}" for orphan in orphans]
    return _Output(report, _lines(lines), 0 if report["ok"] else 1)


@_command(
    "gc",
    "remove payload files that no record references (left by a crash or an overwrite), compact "
    "the journal and rewrite packs of small arrays that are mostly dead",
    "lazyvault gc runs.lv",
    _path("the store (opened for writing)"),
    _flag("--json", "print the report as JSON"),
)
def _cmd_gc(args: argparse.Namespace) -> _Output:
    _refuse_archive(args.path, "gc")
    if not os.path.exists(os.path.join(args.path, "lazyvault.json")):
        # mode "a" would create an empty store at a mistyped path: say what a read says
        # (NotAStoreError for a directory of other files, else no such store)
        Store.open(args.path, mode="r").close()
        raise StoreNotFoundError(f"{args.path}: no such store")
    with Store.open(args.path, mode="a") as store:
        report = store.gc()
    damaged = report["packs_damaged"]
    left = (
        f"; {damaged:,} pack(s) left as they are because damaged (`lazyvault verify` names them)"
        if damaged
        else ""
    )
    return _Output(
        report,
        f"{args.path}: removed {report['removed_files']:,} orphan file(s), "
        f"{report['removed_bytes']:,} bytes; "
        f"{report['journal_bytes_freed']:,} bytes of journal freed; "
        f"{report['packs_compacted']:,} pack(s) of small arrays compacted{left}\n",
    )


@_command(
    "repair",
    "rebuild a lost or damaged index and checkpoint from the newest intact checkpoint (or "
    "what damaged ones still hold) and the journal after it (the old index is moved aside, "
    "nothing repair cannot read is deleted)",
    "lazyvault repair runs.lv && lazyvault verify runs.lv && lazyvault gc runs.lv",
    _path(),
    _flag("--json", "print the report as JSON"),
)
def _cmd_repair(args: argparse.Namespace) -> _Output:
    _refuse_archive(args.path, "repair")
    report = Store.repair(args.path)
    lines = [
        f"{args.path}: index rebuilt: {report['records']:,} records from "
        f"{report['entries']:,} journal entries"
    ]
    if report["moved_index"]:
        lines.append(f"  the old index was moved to {report['moved_index']} (remove it when done)")
    lines += [f"  skipped: {skipped}" for skipped in report["skipped"]]
    lines.append(f"  next: `{PROG} verify {args.path}`, then `{PROG} gc {args.path}`")
    return _Output(report, _lines(lines))


# -- parser and main ----------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``lazyvault`` command."""
    fmt = argparse.RawDescriptionHelpFormatter
    examples = "".join(f"  {command.example}\n" for command in _COMMANDS.values())
    epilog = f"examples:\n{examples}\n{_EXIT_STATUS}\n"
    parser = argparse.ArgumentParser(
        prog=PROG, description=_DESCRIPTION, epilog=epilog, formatter_class=fmt
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, command in _COMMANDS.items():
        p = sub.add_parser(
            name,
            help=command.summary,
            description=command.summary,
            epilog=f"example:\n  {command.example}",
            formatter_class=fmt,
        )
        p.set_defaults(func=command.run)
        for option in command.options:
            group = p.add_mutually_exclusive_group() if isinstance(option, list) else p
            for flags, kwargs in option if isinstance(option, list) else [option]:
                group.add_argument(*flags, **kwargs)
    return parser


def _message(error: BaseException) -> str:
    if isinstance(error, KeyError) and len(error.args) == 1:
        return str(error.args[0])  # KeyError's str() adds quotes
    return str(error) or type(error).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the ``lazyvault`` command with ``argv`` (default ``sys.argv[1:]``) and returns its exit
    status (usage errors return 2 instead of exiting)."""
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
        output = args.func(args)
        if args.json:
            json.dump(output.value, sys.stdout, indent=2, ensure_ascii=False, default=_json_default)
            sys.stdout.write("\n")
        else:
            sys.stdout.write(output.text)
        sys.stdout.flush()  # a closed pipe raises here, not at exit
        return int(output.status)
    except _UsageError as e:
        print(f"{PROG} {e.args[0]}: error: {e.args[1]}", file=sys.stderr)
        return 2
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
