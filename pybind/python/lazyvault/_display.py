"""What a record, a store, an archive or query results look like in a terminal and in a notebook:
the ``_repr_pretty_`` text (IPython's ``text/plain``, also ``str()``) and the ``_repr_html_`` table.

All from the index (metadata; each array's shape, dtype and size as the record holds them) and the
proxy's cache (whether an array is loaded): no payload is opened. Large tables are paged
(:data:`MAX_ROWS` rows, then "... N more"). Keys, names, values and dtypes are user data: the HTML
escapes them all, the text shows unprintable ones as ``repr``.
"""

from __future__ import annotations

import collections
import datetime
import html
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .record import Record

#: Rows shown before "... N more" (records of a store, fields, arrays).
MAX_ROWS = 20
#: Metadata columns of a store or results table; the rest are counted.
MAX_COLUMNS = 8
#: Characters of one value shown before it is cut with "...".
MAX_CELL = 40
#: Arrays listed in one cell of a store table.
MAX_ARRAYS_IN_CELL = 3

_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
# one small style sheet per fragment, scoped by class: cells left-aligned
# (notebooks centre or right-align them by default)
_STYLE = (
    "<style>.lazyvault-table {border-collapse: collapse; margin: 0.3em 0}"
    " .lazyvault-table th, .lazyvault-table td {text-align: left; vertical-align: top;"
    " font-family: monospace; padding: 1px 8px; white-space: pre}"
    " .lazyvault-table th {border-bottom: 1px solid #888}</style>"
)


def human_size(nbytes: int) -> str:
    """``nbytes`` in binary units: ``"240 B"``, ``"1.5 KiB"``, ``"1.0 GiB"``."""
    if nbytes < 1024:
        return f"{nbytes} B"
    size = float(nbytes)
    for unit in _UNITS:
        size /= 1024
        if size < 1024 or unit == _UNITS[-1]:
            return f"{size:.1f} {unit}"
    raise AssertionError("unreachable")


def flatten(meta: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested metadata dicts as one level of dotted names: ``{"params": {"lr": 0.1}}`` gives
    ``{"params.lr": 0.1}``. Lists and empty dicts are values."""
    out: dict[str, Any] = {}
    for name, value in meta.items():
        dotted = f"{prefix}{name}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, dotted + "."))
        else:
            out[dotted] = value
    return out


def cut(text: str, limit: int = MAX_CELL) -> str:
    """``text``, or its first ``limit - 3`` characters and ``...``."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def name_text(text: str) -> str:
    """A key or a field name as shown: itself, or its repr when it holds characters that would break
    a line (newlines, control characters)."""
    return text if text.isprintable() else repr(text)


def short_repr(value: Any) -> str:
    """``repr(value)``, cut to :data:`MAX_CELL` characters; a datetime or date as ISO 8601
    (``2024-03-01 12:30:00+01:00 [Europe/Paris]``), which its repr would not fit."""
    if isinstance(value, datetime.date):
        key = getattr(getattr(value, "tzinfo", None), "key", None)
        return cut(f"{value} [{key}]" if isinstance(key, str) else str(value))
    return cut(repr(value))


def _shape(shape: Sequence[int]) -> str:
    return str(tuple(shape))


class _Table:
    """Column names, rows of cells (plain text) and a footer line."""

    def __init__(self, columns: list[str]) -> None:
        self.columns = columns
        self.rows: list[list[str]] = []
        self.more: str | None = None  # "... N more records"

    def text(self, indent: str = "  ") -> Iterator[str]:
        widths = [len(c) for c in self.columns]
        for row in self.rows:
            widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
        for row in (self.columns, *self.rows):
            yield indent + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        if self.more:
            yield indent + self.more

    def html(self) -> str:
        e = html.escape
        head = "".join(f"<th>{e(c)}</th>" for c in self.columns)
        body = "".join(
            "<tr>" + "".join(f"<td>{e(cell)}</td>" for cell in row) + "</tr>" for row in self.rows
        )
        if self.more:
            body += f'<tr><td colspan="{len(self.columns)}"><em>{e(self.more)}</em></td></tr>'
        return (
            f'<table class="lazyvault-table"><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table>"
        )


def _more(total: int, shown: int, what: str) -> str | None:
    return f"... {total - shown:,} more {what}" if total > shown else None


# -- one record ---------------------------------------------------------------


def _record_parts(rec: Record, loaded: Collection[str]) -> tuple[str, _Table, _Table]:
    """(summary line, fields table, arrays table) of one record; ``loaded``: the arrays the proxy
    has loaded so far (nothing is opened here)."""
    fields = flatten(rec.meta)
    arrays = rec.arrays
    total = sum(info.nbytes for info in arrays.values())
    summary = (
        f"{len(fields):,} field{'s' * (len(fields) != 1)}, "
        f"{len(arrays):,} array{'s' * (len(arrays) != 1)} ({human_size(total)}, "
        f"{sum(1 for n in arrays if n in loaded):,} loaded)"
    )
    meta_table = _Table(["field", "value"])
    for name, value in list(fields.items())[:MAX_ROWS]:
        meta_table.rows.append([cut(name_text(name)), short_repr(value)])
    meta_table.more = _more(len(fields), MAX_ROWS, "fields")
    array_table = _Table(["array", "shape", "dtype", "size", "order", "loaded"])
    for name, info in list(arrays.items())[:MAX_ROWS]:
        array_table.rows.append(
            [
                cut(name_text(name)),
                _shape(info.shape),
                cut(str(info.dtype)),
                human_size(info.nbytes),
                info.order,
                "yes" if name in loaded else "no",
            ]
        )
    array_table.more = _more(len(arrays), MAX_ROWS, "arrays")
    return summary, meta_table, array_table


def _record_title(rec: Record) -> str:
    where = f" in {rec.store.path!r}" if rec.store is not None else ""
    return f"lazyvault.Record {rec.key!r}{where}"


def record_text(rec: Record, loaded: Collection[str]) -> str:
    """``Record.__str__`` (see there); ``loaded``: the arrays the proxy has loaded."""
    summary, meta_table, array_table = _record_parts(rec, loaded)
    return _text(f"{_record_title(rec)}: {summary}", (meta_table, array_table))


def record_html(rec: Record, loaded: Collection[str]) -> str:
    """The same as :func:`record_text` as an HTML fragment (two tables)."""
    summary, meta_table, array_table = _record_parts(rec, loaded)
    heading = f"<strong>{html.escape(_record_title(rec))}</strong>: {html.escape(summary)}"
    return _html("record", heading, (meta_table, array_table))


def _text(title: str, tables: Iterable[_Table], note: str | None = None) -> str:
    lines = [title, *(line for table in tables if table.rows for line in table.text())]
    if note:
        lines.append("  " + note)
    return "\n".join(lines)


def _html(kind: str, heading: str, tables: Iterable[_Table], note: str | None = None) -> str:
    """A ``<div class="lazyvault-<kind>">``: ``heading`` (HTML), the tables that have rows,
    ``note``."""
    parts = [f'<div class="lazyvault-{kind}">', _STYLE, f"<p>{heading}</p>"]
    parts.extend(table.html() for table in tables if table.rows)
    if note:
        parts.append(f"<p><em>{html.escape(note)}</em></p>")
    parts.append("</div>")
    return "".join(parts)


# -- many records: a store, an archive, query results --------------------------


def _arrays_cell(rec: Record) -> str:
    arrays = rec.arrays
    cells = [
        f"{cut(name_text(n), 20)} {cut(str(i.dtype), 20)} {_shape(i.shape)}"
        for n, i in list(arrays.items())[:MAX_ARRAYS_IN_CELL]
    ]
    if len(arrays) > MAX_ARRAYS_IN_CELL:
        cells.append(f"+{len(arrays) - MAX_ARRAYS_IN_CELL} more")
    return ", ".join(cells)


def _records_table(get: Callable[[str], Record], keys: Sequence[str]) -> tuple[_Table, str | None]:
    """The table of the records ``keys`` (the first page) and a note on the metadata columns left
    out."""
    shown: list[Record | str] = []
    for key in keys[:MAX_ROWS]:
        try:
            shown.append(get(key))
        except KeyError:  # deleted since the query ran
            shown.append(key)
    flat = [flatten(rec.meta) if not isinstance(rec, str) else {} for rec in shown]
    # the fields most records have first, then in first-seen order
    counts = collections.Counter(name for fields in flat for name in fields)
    names = sorted(counts, key=lambda n: -counts[n])  # stable: ties keep first-seen order
    columns = names[:MAX_COLUMNS]
    hidden = len(names) - len(columns)
    table = _Table(["key", *(cut(name_text(c)) for c in columns), "arrays", "size"])
    for rec, fields in zip(shown, flat, strict=True):
        if isinstance(rec, str):
            table.rows.append([cut(name_text(rec)), *([""] * len(columns)), "(deleted)", ""])
            continue
        size = sum(info.nbytes for info in rec.arrays.values())
        table.rows.append(
            [
                cut(name_text(rec.key)),
                *(short_repr(fields[c]) if c in fields else "" for c in columns),
                _arrays_cell(rec),
                human_size(size),
            ]
        )
    table.more = _more(len(keys), len(shown), "records")
    note = f"{hidden:,} more metadata field(s) not shown: see to_pandas()" if hidden else None
    return table, note


def pretty(text: str, p: Any, cycle: bool) -> None:
    """Writes ``text`` to IPython's pretty printer ``p`` (``_repr_pretty_``)."""
    p.text("..." if cycle else text)


class RecordsDisplay:
    """The displays of many records (a store, an archive, query results): ``str()``, IPython's text
    and the notebook's HTML, of what ``_display_parts()`` returns: ``(title, get, keys)``. IPython
    takes the first of ``_repr_pretty_`` and ``__repr__`` it meets in the MRO, so a subclass
    defining ``__repr__`` sets ``_repr_pretty_`` again too."""

    __slots__ = ()
    _display_parts: Callable[[], tuple[str, Callable[[str], Record], Sequence[str]]]

    def __str__(self) -> str:
        """Several lines: a title (what, where, how many records), then a table of the first 20
        records: key, metadata columns, arrays, size."""
        title, get, keys = self._display_parts()
        table, note = _records_table(get, keys)
        return _text(title, (table,), note)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        """IPython's text display: :meth:`__str__`."""
        pretty(str(self), p, cycle)

    def _repr_html_(self) -> str:
        """The notebook display: :meth:`__str__` as an HTML table."""
        title, get, keys = self._display_parts()
        table, note = _records_table(get, keys)
        return _html("records", f"<strong>{html.escape(title)}</strong>", (table,), note)
